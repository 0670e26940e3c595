"""`paged` with lower KV tiers: SGLang HiCache's host (and storage) tier behind the radix cache.

`TieredPagedPolicy` is `PagedPolicy` whose admission continues a device match into the host
and storage trees (kvcore/tier_tree.py `TierTree`, driven by the tier controller,
kvcore/tier_controller.py) and loads the hit into new device pages, which the request then
holds like any cached prefix (`cached` covers them: they are not prefilled). A prefix is
loaded device <- host <- storage: the host hit is what the host holds past the device hit,
the storage hit what storage holds past both (at most the prefetch allowance; copied to the
host first). The host pages a load reads stay held until the request's prefill completes
(`cache_prefix`) or it leaves (`release` / `finish`): that is the load's time in flight, which
the engine charges.

Device eviction only frees device pages: a prefix with a host copy keeps it. The write
policies (the controller's decisions): `write_through` stores a prefix on the host whenever
the device tree takes it; `write_back` stores a device leaf the tree evicts, before its pages
go; `write_through_selective` stores the part of an admission's device hit whose pages became
due (reuse counted per device page; along a tree path the counts never grow with depth, so
the due pages are a prefix of the hit).

The `paged` factory (kvcore/policies/paged.py) builds it only when the configuration asks for
a host tier, so a run without one is `PagedPolicy` itself, unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

from kvcore.breakdown import MemoryBreakdown
from kvcore.policies.base import AdmitResult, PolicyConfig
from kvcore.policies.capabilities import LowerTiers
from kvcore.policies.paged_radix import PagedPolicy
from kvcore.radix_cache import MatchResult, TreeNode, as_key
from kvcore.tier_controller import TierController
from kvcore.tier_tree import TierTree, page_slots, path_key
from kvcore.tiers import TierConfig, TierHit, TierState
from kvcore.validation import InvariantError


class TieredPagedPolicy(PagedPolicy, LowerTiers):
    """Paged pool + radix cache + host tier (+ storage tier)."""

    def __init__(self, config: PolicyConfig, tier_config: TierConfig) -> None:
        super().__init__(config, cache_enabled=True)
        self.tiers: TierController[TierTree, TreeNode] = TierController(
            tier_config, TierTree, self.page_size, self.allocator.num_pages)
        if self.tiers.write_on_evict or self.tiers.counts_reuse:
            self.tree.on_evict = self._device_evicted
        self._loaded = (0, 0)  # (host, storage) tokens of the last admission's load
        self._admitting = -1  # the request whose admission is in progress
        self._allowance = 0  # storage tokens it may load

    # -- writing to the host -------------------------------------------------------------------
    def _device_evicted(self, leaf: TreeNode) -> None:
        """The device tree evicts `leaf`: its pages' reuse counts end; write_back stores it."""
        if self.tiers.counts_reuse:
            self.tiers.forget(self._pages(leaf.value))
        if self.tiers.write_on_evict:
            self.tiers.host.store(path_key(leaf))

    def _pages(self, slots: torch.Tensor) -> np.ndarray:
        """The device pages of whole-page `slots`."""
        ps = self.page_size
        return slots[::ps].cpu().numpy() // ps

    def _inserted(self, token_ids: np.ndarray, n: int) -> None:
        """The device tree took token_ids[:n]: write_through backs it up now."""
        if self.tiers.write_on_insert:
            self.tiers.host.store(as_key(token_ids)[:n])

    # -- admission -----------------------------------------------------------------------------
    def peek_tiers(self, token_ids: np.ndarray) -> TierHit:
        d = self.tree.peek(token_ids)[0]
        tiers = self.tiers
        h = max(tiers.host.peek(token_ids)[0] - d, 0)
        s = (max(tiers.storage.peek(token_ids)[0] - d - h, 0)
             if tiers.storage is not None else 0)
        return TierHit(d, h, s)

    def admit(self, rid: int, token_ids: np.ndarray, final_len: int,
              max_new_tokens: int) -> AdmitResult | None:
        return self.admit_prefetched(rid, token_ids, final_len, max_new_tokens, 0)

    def admit_prefetched(self, rid: int, token_ids: np.ndarray, final_len: int,
                         max_new_tokens: int, storage_allowance: int) -> AdmitResult | None:
        self._loaded = (0, 0)
        self._admitting, self._allowance = rid, storage_allowance
        try:
            res = super().admit(rid, token_ids, final_len, max_new_tokens)
        finally:
            self._admitting, self._allowance = -1, 0
        if res is None:
            return None
        host, storage = self._loaded
        return AdmitResult(res.row, res.cached_len, res.token_hit, host, storage)

    def _load(self, row: int, key: np.ndarray, match: MatchResult) -> MatchResult:
        """The device match (locked by the caller), extended by what the lower tiers hold past
        it, loaded into new device pages as far as the device can free them; the request's
        lock moves to the loaded end. write_through_selective first stores the due part of
        the device hit."""
        tiers, ps = self.tiers, self.page_size
        device, d = match.indices, len(match.indices)
        if tiers.counts_reuse and d:
            due = tiers.reused(self._pages(device))
            k = len(due) if due.all() else int(np.argmin(due))  # the leading due pages
            if k:
                tiers.host.store(key[: k * ps])
        h, hnode = tiers.host.touch(key)
        from_storage = 0
        allow = tiers.prefetch_pages(self._allowance)
        if allow:
            h, hnode, from_storage = self._from_storage(key, max(h, d), allow, h, hnode)
        if h <= d:
            return match
        return self._copy_down(key, match, h, hnode, from_storage)

    def _from_storage(self, key: np.ndarray, base: int, allow: int, h: int,
                      hnode: TreeNode) -> tuple[int, TreeNode, int]:
        """Copy what storage holds past `base` (at most `allow` pages) to the host. Returns
        the host hit after, its node, and the tokens of it that came from storage."""
        tiers, ps = self.tiers, self.page_size
        assert tiers.storage is not None
        take = min(tiers.storage.peek(key)[0], base + allow * ps)
        take -= take % ps
        if take <= base:
            return h, hnode, 0
        snode = tiers.storage.touch(key[:take])[1]
        tiers.storage.hold(snode)  # read while the host makes room
        try:
            tiers.copied_up(tiers.host.store(key[:take]))
        finally:
            tiers.storage.unhold(snode)
        h, hnode = tiers.host.touch(key)
        return h, hnode, max(h - base, 0)

    def _copy_down(self, key: np.ndarray, match: MatchResult, h: int, hnode: TreeNode,
                   from_storage: int) -> MatchResult:
        """Load host[d:h] into new device pages (evicting device cache for them; as much as
        fits, whole pages), insert them in the device tree, hold `hnode` until the prefill
        lands."""
        tiers, ps, alloc = self.tiers, self.page_size, self.allocator
        device, d = match.indices, len(match.indices)
        tiers.host.hold(hnode)  # in flight: the host copy must stay
        short = (h - d) - alloc.available_size()
        if short > 0:
            self.tree.evict(short)
        room = min(h - d, alloc.available_size())
        room -= room % ps
        if room <= 0:
            tiers.host.unhold(hnode)
            return match
        pages = alloc.pop_host(room // ps)
        assert pages is not None
        new = page_slots(pages, ps)
        value = np.concatenate([device.cpu().numpy(), new]) if d else new
        already, top = self.tree.insert_path(key[: d + room], value)
        if already != d:
            raise InvariantError(f"load: the device prefix changed under its lock "
                                 f"({already} != {d})")
        tiers.loaded(self._admitting, hnode, room // ps)
        from_storage = min(from_storage, room)
        self._loaded = (room - from_storage, from_storage)
        self.tree.inc_lock_ref(top)  # the request's lock moves to the loaded end
        self.tree.dec_lock_ref(match.last_node)
        return MatchResult(torch.from_numpy(value).to(device.device), top)

    # -- ending --------------------------------------------------------------------------------
    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        super().cache_prefix(rid, token_ids)
        self.tiers.landed(rid)  # prefill done: the load has landed

    def _drop(self, rid: int, row: int) -> None:
        self.tiers.landed(rid)
        super()._drop(rid, row)

    # -- observation ---------------------------------------------------------------------------
    def tier_state(self) -> TierState:
        return self.tiers.state()

    def host_breakdown(self) -> MemoryBreakdown:
        return self.tiers.host_breakdown()

    def check_invariants(self) -> None:
        super().check_invariants()
        cached = np.zeros(self.allocator.num_pages + 1, dtype=bool)
        if self.tiers.counts_reuse:
            for n in self.tree.nodes():
                cached[self._pages(n.value)] = True
        self.tiers.check_invariants(self._row_of, cached)


__all__ = ["TieredPagedPolicy"]
