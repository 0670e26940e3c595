"""`paged` with lower KV tiers: SGLang HiCache's host (and storage) tier behind the radix cache.

`TieredPagedPolicy` is `PagedPolicy` whose admission continues a device match into the host
and storage tiers (kvcore/tiers.py) and loads the hit into new device pages, which the request
then holds like any cached prefix (`cached` covers them: they are not prefilled). The host
pages a load reads stay locked until the request's prefill completes (`cache_prefix`) or it
leaves (`release` / `finish`): that is the load's time in flight, which the engine charges.

The `paged` factory (kvcore/policies/paged.py) builds it only when the configuration asks for
a host tier, so a run without one is `PagedPolicy` itself, unchanged.
"""

from __future__ import annotations

import numpy as np

from kvcore.breakdown import MemoryBreakdown
from kvcore.policies.base import AdmitResult, PolicyConfig
from kvcore.policies.capabilities import LowerTiers
from kvcore.policies.paged_radix import PagedPolicy
from kvcore.radix_cache import MatchResult, TreeNode, as_key
from kvcore.tiers import HierarchicalCache, TierConfig, TierState, store_breakdown
from kvcore.validation import InvariantError


class TieredPagedPolicy(PagedPolicy, LowerTiers):
    """Paged pool + radix cache + host tier (+ storage tier)."""

    def __init__(self, config: PolicyConfig, tiers: TierConfig) -> None:
        super().__init__(config, cache_enabled=True)
        self.hicache = HierarchicalCache(self.tree, tiers)
        rows = config.max_requests + 1
        self._host_lock: list[TreeNode | None] = [None] * rows
        self._loaded = (0, 0)  # (host, storage) tokens of the last admission's load
        self._allowance = 0  # storage tokens the admission in progress may load

    def _load(self, row: int, key: np.ndarray, match: MatchResult) -> MatchResult:
        fetch = self.hicache.fetch(key, match.indices, match.last_node, self._allowance)
        self._loaded = (fetch.host_tokens, fetch.storage_tokens)
        if fetch.host_lock is None:
            return match
        self.tree.inc_lock_ref(fetch.node)  # the request's lock moves to the loaded end
        self.tree.dec_lock_ref(match.last_node)
        self._host_lock[row] = fetch.host_lock
        return MatchResult(fetch.indices, fetch.node)

    def admit(self, rid: int, token_ids: np.ndarray, final_len: int,
              max_new_tokens: int) -> AdmitResult | None:
        return self.admit_prefetched(rid, token_ids, final_len, max_new_tokens, 0)

    def admit_prefetched(self, rid: int, token_ids: np.ndarray, final_len: int,
                         max_new_tokens: int, storage_allowance: int) -> AdmitResult | None:
        self._loaded = (0, 0)
        self._allowance = storage_allowance
        try:
            res = super().admit(rid, token_ids, final_len, max_new_tokens)
        finally:
            self._allowance = 0
        if res is None:
            return None
        host, storage = self._loaded
        return AdmitResult(res.row, res.cached_len, res.token_hit, host, storage)

    def _inserted(self, token_ids: np.ndarray, n: int) -> None:
        self.hicache.after_insert(as_key(token_ids)[:n])

    def _loaded_done(self, row: int) -> None:
        lock = self._host_lock[row]
        if lock is not None:
            self._host_lock[row] = None
            self.hicache.done(lock)

    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        super().cache_prefix(rid, token_ids)
        self._loaded_done(self._row_of_checked(rid))  # prefill done: the load has landed

    def _drop(self, rid: int, row: int) -> None:
        self._loaded_done(row)
        super()._drop(rid, row)

    def tier_state(self) -> TierState:
        return self.hicache.state()

    def host_breakdown(self) -> MemoryBreakdown:
        return store_breakdown(self.hicache.host)

    def check_invariants(self) -> None:
        super().check_invariants()
        self.hicache.check_invariants()
        held = [n for n in self._host_lock if n is not None]
        if len(held) != len(self.hicache.inflight):
            raise InvariantError(f"{len(held)} rows hold host loads, {len(self.hicache.inflight)} "
                                 "loads in flight")
        self.host_breakdown().check_invariants()


__all__ = ["TieredPagedPolicy"]
