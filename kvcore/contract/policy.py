"""The one interface every KV allocation policy implements.

The simulator, the CLI and the reports only ever talk to `KVPolicy`, so a new policy is a new
class plus one line in the catalog, kvcore/policies/__init__.py. All quantities are in KV
*slots* (one token of KV in every layer), never bytes: bytes are capacity x the model's KV bytes
per token. What a policy
reports, `MemoryBreakdown`, and the fragmentation metrics live in kvcore/contract/breakdown.py.

Conventions shared by all policies
----------------------------------
* A request's KV is written for `prompt + output - 1` tokens (the last sampled token is never
  written back). That count is the request's *final length* L.
* `written` is how many of the request's tokens have KV in the pool (its device length).
* Every operation that can fail for lack of memory is all-or-nothing: on failure it returns
  False/None and no request's state changes (a policy may still have evicted cache to try).
* Bad arguments to `extend` / `decode` are checked by one implementation here
  (`check_extend_args`, `check_decode_args`, `check_distinct`) before anything changes, so
  every policy rejects them with the same one-line ValueError.
* `check_invariants()` raises `InvariantError` naming the broken rule; it is cheap enough to call
  after every operation in tests and with `--check-invariants`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

import numpy as np

from kvcore.contract.breakdown import MemoryBreakdown
from kvcore.contract.tiers import TierConfig
from kvcore.model.hybrid_plan import SGLANG_MAMBA_FULL_MEMORY_RATIO, SGLANG_SWA_FULL_TOKENS_RATIO
from kvcore.model.layers import HybridLayout
from kvcore.model.vllm_rules import DEFAULT_VLLM_VERSION
from kvcore.model.vllm_rules import MAMBA_CACHE_MODES as _VLLM_MODES

__all__ = [
    "MAMBA_CACHE_MODES",
    "AdmitResult",
    "KVPolicy",
    "PolicyConfig",
    "PrefixPeek",
]

#: vLLM's Mamba prefix-cache modes (vllm/config/cache.py `MambaCacheMode`): "none" one state
#: per request, "align" the state kept at block boundaries, "all" a state per block
MAMBA_CACHE_MODES: tuple[str, ...] = _VLLM_MODES

#: how an extend/decode past the model's context is worded (policies with per-request
#: reservations pass their own phrase)
BEYOND_CONTEXT = "exceeds max_context_len"
#: batches up to this size are checked with plain comparisons (`check_extend_args`): Python's
#: loop over a few dozen pairs costs less than numpy's conversions and reduction
_PLAIN_CHECKS = 32

Ints = Sequence[int] | np.ndarray


@dataclass(frozen=True)
class AdmitResult:
    """What admission gave a request: its page-table row and the prefix already cached.

    `cached_len` tokens of the prompt were found in the prefix cache (page-aligned, at most
    prompt - 1); the request's `written` starts there. `token_hit` is the match a token-granular
    cache holding the same content would give (>= cached_len): the difference is the reuse
    lost to page alignment. A hybrid policy also says which of its other layer kinds' rules
    refused cached full-attention KV: `window_lost` tokens because the sliding window's KV at
    the match's end was gone, then `state_lost` tokens because no state was kept where the
    match could end (the Mamba cache mode keeps states only at some positions); a state
    kept there and then evicted from its pool is capacity, in neither.
    """

    row: int
    cached_len: int
    token_hit: int = -1
    host_hit: int = 0  # of cached_len: tokens loaded from the host tier (kvcore/contract/tiers.py)
    storage_hit: int = 0  # of cached_len: tokens loaded from the storage tier
    window_lost: int = 0
    state_lost: int = 0

    @property
    def unaligned_hit(self) -> int:
        return self.cached_len if self.token_hit < 0 else self.token_hit


class PrefixPeek(NamedTuple):
    """What admission would find in the prefix cache now: `hit` tokens (page-aligned), of
    which `evictable` are held by the cache alone (unlocked: counted in evictable_tokens);
    and `other_pools`, slots of `available_tokens()` the request cannot use or needs on top
    of its pages (a hybrid's Mamba state and sliding-window blocks, or a short SWA pool;
    negative when it needs fewer): admission leaves it out of what is available. 0 for every
    full-attention policy."""

    hit: int
    evictable: int
    other_pools: int = 0


class KVPolicy(ABC):
    """A KV allocation policy driven request by request: the lifecycle every policy has.

    Lifecycle of one request `rid` (the simulator guarantees this order):

        admit -> extend* (prefill chunks) -> decode* -> finish
                    \\-> release (preempted or aborted; may be re-admitted later as new)

    What a policy can do beyond it is an explicit capability, an ABC in
    kvcore/contract/capabilities.py that the policy class derives from and the engine checks
    with `isinstance`: `PrefixCache` (peek, cache a running prefix), `Reserving` (up-front
    reservations), `DecodeStretch` (many decode steps in one call, for the fast-forward) and
    `LowerTiers` (host / storage tiers). The engine calls nothing else and writes no attribute.

    Invariants every implementation keeps (checked by `check_invariants`):
    * no slot is owned twice (free list, one request's private memory, the prefix cache);
    * nothing leaks: free + privately owned + cached == capacity;
    * `breakdown()` parts are non-negative and sum to `capacity`.
    """

    #: registry name, e.g. "paged"
    name: str = ""

    def __init__(self, capacity: int, page_size: int) -> None:
        #: slots in the pool (a whole number of pages); fixed for the policy's life
        self.capacity = capacity
        #: tokens per page: the allocation granularity
        self.page_size = page_size

    # -- argument checks shared by every policy ----------------------------------------------
    @staticmethod
    def check_distinct(op: str, rids: Sequence[int]) -> None:
        """A batch names each request once (a repeat would allocate for it twice)."""
        if len(set(rids)) != len(rids):
            raise ValueError(f"{op} got the same request twice")

    @staticmethod
    def check_extend_args(rids: Sequence[int], targets: Ints, written: Ints,
                          limit: int | Ints, beyond: str = BEYOND_CONTEXT) -> None:
        """`extend(rids, targets)` is well formed: as many targets as requests, no request
        twice, and written[i] <= targets[i] <= limit (one limit, or one per request: the
        context length, or a reservation). A bad target names the first offending request.
        One request (a prefill chunk, the common call), or a few under one limit (an
        iteration's chunks: about eleven at `--chunked-prefill-size 64`), is checked with
        plain comparisons, below numpy's fixed cost of a few microseconds a call."""
        n = len(rids)
        if len(targets) != n:
            raise ValueError(f"rids and target_lens differ in length: {n} != {len(targets)}")
        if n == 1:
            if written[0] <= targets[0] <= (limit if isinstance(limit, int) else limit[0]):
                return
        elif isinstance(limit, int) and n <= _PLAIN_CHECKS:
            if len(set(rids)) == n and all(
                    w <= t <= limit for w, t in zip(written, targets, strict=False)):
                return
            KVPolicy.check_distinct("extend", rids)
        else:
            KVPolicy.check_distinct("extend", rids)
            t = np.asarray(targets, dtype=np.int64)
            if ((np.asarray(written) <= t) & (t <= np.asarray(limit))).all():
                return
        limits = repeat(limit) if isinstance(limit, int) else limit
        for rid, t, w, lim in zip(rids, targets, written, limits, strict=False):
            if t < w:
                raise ValueError(f"target_len {t} of request {rid} is below written {w}")
            if t > lim:
                raise ValueError(f"target_len {t} of request {rid} {beyond} {lim}")

    @staticmethod
    def check_decode_args(rids: Sequence[int], written: Ints, limit: int | Ints,
                          beyond: str = BEYOND_CONTEXT, steps: int = 1) -> None:
        """`steps` more tokens fit every request: written[i] + steps <= limit (one limit, or
        one per request). The caller checks repeats (`check_distinct`) where it has none
        memoised. With one limit this is one reduction over the batch."""
        if isinstance(limit, int):
            if not len(written):
                return
            top = max(written) if isinstance(written, list) else int(np.max(written))
            if top + steps <= limit:
                return
            limits: Ints | repeat[int] = repeat(limit)
        else:
            if all(w + steps <= lim for w, lim in zip(written, limit, strict=True)):
                return
            limits = limit
        for rid, w, lim in zip(rids, written, limits, strict=False):
            if w + steps > lim:
                raise ValueError(f"decode of request {rid} {beyond} {lim}")

    # -- the lifecycle -----------------------------------------------------------------------
    @abstractmethod
    def admit(
        self, rid: int, token_ids: np.ndarray, final_len: int, max_new_tokens: int
    ) -> AdmitResult | None:
        """Start `rid` (prompt `token_ids`, final length `final_len`).

        Before: `rid` is not admitted. Takes a page-table row; a caching policy locks the
        prompt's cached prefix (at most prompt - 1 tokens, page-aligned) so it cannot be
        evicted while `rid` runs, and `written` starts there; a reserving policy places its
        whole reservation. Allocates no other KV, except that a policy with lower tiers
        (`LowerTiers`) loads the part of the prompt found there into new device pages, as
        many as unlocked device cache can be evicted for, held like the device hit. None,
        with nothing changed, when there is no row or (reserving) no hole that fits."""

    @abstractmethod
    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        """Allocate and write KV so that each `rids[i]` has `target_lens[i]` written tokens
        (a prefill chunk, or a swapped-out request's copy back).

        Before: every rid admitted, written <= target <= its limit (checked: ValueError).
        Allocates whole pages past each request's last one (reserving policies: none, the
        reservation holds them), evicting unlocked cache when short. Batched,
        all-or-nothing: False, with no request changed, when memory is short (cache may have
        been evicted trying)."""

    @abstractmethod
    def decode(self, rids: Sequence[int]) -> bool:
        """One more written token for each request (a decode step).

        Before: every rid admitted, written + 1 within its limit. Allocates a page for each
        request whose last page is full (reserving policies: none), evicting unlocked cache
        when short. Batched, all-or-nothing: False, nothing changed, when memory is short."""

    @abstractmethod
    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        """`rid` completed: a caching policy inserts its `written` tokens (ids `token_ids`)
        into the prefix cache (whole pages; the cache then owns them) and unlocks its prefix;
        everything else it holds (the partial last page, a reservation) is freed and its row
        given back. Before: `rid` admitted, `token_ids` the ids of at least its written
        tokens. After: `rid` is unknown to the policy."""

    @abstractmethod
    def release(self, rid: int) -> None:
        """Preempt or abort `rid`: free every private page and its row and unlock its cached
        prefix, caching nothing new. Before: `rid` admitted. After: unknown to the policy (a
        later `admit` of the same rid starts afresh)."""

    # -- capacity and usage ----------------------------------------------------------------
    @abstractmethod
    def written(self, rid: int) -> int:
        """KV tokens written for `rid` so far (its cached prefix included)."""

    @abstractmethod
    def available_tokens(self) -> int:
        """Slots obtainable right now without preempting anyone: free + evictable cache."""

    @abstractmethod
    def evictable_tokens(self) -> int:
        """Slots held only by the prefix cache (unlocked; 0 without a cache)."""

    def free_tokens(self) -> int:
        """Slots free right now (without evicting anything)."""
        return self.available_tokens() - self.evictable_tokens()

    @abstractmethod
    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        """Where every slot is now (read-only). `head_reservation` is what the request at the
        head of the waiting queue would need (the max context length when none waits); it
        decides which free holes count as external fragmentation."""

    @abstractmethod
    def page_table_entries(self) -> int:
        """Block-table entries of live requests: sum of ceil(context / page_size)."""

    @abstractmethod
    def page_table_bytes(self) -> int:
        """Device bytes of the policy's page (block) table (a run's summary reports them
        beside the pool)."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise InvariantError if any invariant of the policy or its structures is broken
        (read-only, except that work a policy defers, such as due host stores, is done)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release tensors early (optional)."""


@dataclass(frozen=True)
class PolicyConfig:
    """Everything a policy factory needs; one shape for every policy.

    `kv_tokens` is the pool size in slots; paged policies use `kv_tokens // page_size` pages
    (capacity = pages x page_size), so a capacity is always a whole number of pages.
    `max_requests` is the number of page-table rows (concurrent requests). `placement` is read
    by contiguous policies only, `eviction` by cache-holding ones; `store_kv` allocates a real
    K/V buffer (tests, small pools) instead of shape-only accounting.

    Hybrid models (docs/hybrid.md): `layout` None, or a layout that is not hybrid, is the
    full-attention path, unchanged. A hybrid `layout` makes the policies registered with
    `supports_hybrid` (`paged`, `paged-nocache`, `vllm`) build their hybrid pools from
    `kv_bytes` (the KV budget of one rank in bytes, the planner's figure: kvcore.model.hybrid_plan
    sizes the pools from it); `kv_tokens` stays the size of a pool storing every layer as
    full attention. The SGLang knobs (defaults: sglang
    server_args.py, v0.5): `swa_full_tokens_ratio` (SWA pool tokens / full pool tokens),
    `mamba_full_memory_ratio` (state pool bytes / full-attention KV bytes),
    `max_mamba_cache_size` (state slots; 0: from the ratio). vLLM's `mamba_cache_mode`:
    vllm/config/cache.py's field defaults to "none" (prefix caching off); with prefix caching
    on, vLLM runs gated delta net hybrids in "align", the default here (a run resolves the
    mode its `vllm_version` picks, kvcore.model.vllm_rules). `vllm_version` names the vLLM release
    whose hybrid rules (block alignment, grouping) the `vllm` policy follows.
    """

    kv_tokens: int
    page_size: int = 1
    max_context_len: int = 2048
    max_requests: int = 256
    device: str = "cpu"
    placement: str = "first-fit"
    eviction: str = "lru"
    num_layers: int = 1
    num_kv_heads: int = 1
    head_dim: int = 1
    kv_dtype: str = "bf16"
    store_kv: bool = False
    # lower KV tiers behind the device pool (kvcore/contract/tiers.py), in slots; 0: none
    host_tokens: int = 0
    storage_tokens: int = 0
    hicache_write_policy: str = "write_through"
    # hybrid models (see the class notes)
    layout: HybridLayout | None = None
    kv_bytes: int = 0
    swa_full_tokens_ratio: float = SGLANG_SWA_FULL_TOKENS_RATIO
    mamba_full_memory_ratio: float = SGLANG_MAMBA_FULL_MEMORY_RATIO
    max_mamba_cache_size: int = 0
    mamba_cache_mode: str = "align"
    vllm_version: str = DEFAULT_VLLM_VERSION

    @property
    def is_hybrid(self) -> bool:
        """A layout with layers that are not full attention: the hybrid policies' path."""
        return self.layout is not None and self.layout.is_hybrid

    @property
    def num_pages(self) -> int:
        return self.kv_tokens // self.page_size

    @property
    def capacity(self) -> int:
        return self.num_pages * self.page_size

    @property
    def tier_config(self) -> TierConfig:
        """The lower tiers asked for (`enabled` when there is a host tier)."""
        return TierConfig(self.host_tokens, self.storage_tokens, self.hicache_write_policy)
