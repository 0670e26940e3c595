"""The one tier controller: what a tiered policy does with its lower KV tiers (host DRAM and an
optional storage tier), written once for both ways a store keys prefixes.

A tiered policy owns one `TierController` as `policy.tiers`. The controller builds the stores
(the host spilling into storage) from the store class of its backend:
kvcore/sglang/tier_tree.py `TierTree` (keyed by radix-tree path, `paged`) or
kvcore/vllm/block_tiers.py `BlockTier` (keyed by block-hash chain, `vllm`). Both satisfy
`TierStore`: sizes in slots, pages written in, and a hold on what a load reads. The policy
finds a prefix in the stores and loads it into device pages (the part that depends on how it
names a prefix); everything else is here:

* the write policy, as three decisions: `write_on_insert` (write_through: a prefix entering
  the device cache is stored on the host), `write_on_evict` (write_back: a device page the
  pool evicts is stored first) and `reused` (write_through_selective: below);
* "reused" (write_through_selective), one definition for both policies, per device page (=
  block): a page counts 1 when it enters the device cache and 1 more at every admission whose
  device hit covers it; once the count reaches `TierConfig.write_threshold` (SGLang's 2) the
  page is due on the host, at the admission that reaches it. The count ends when the device
  evicts the page (`forget`). SGLang counts the same way per radix node: `_inc_hit_count` on
  the node an insert creates and on every node an insert passes over, a backup once the count
  reaches `write_through_threshold` (python/sglang/srt/mem_cache/hiradix_cache.py, SGLang main
  as read in late 2026); kvsim counts at the admission's device hit, where both policies see
  a reuse, and per page, so the answer does not depend on how a tree splits its nodes;
* the loads in flight (`inflight`: request id -> what its load holds in the host store) and
  their end (`landed`: the prefill completed or the request left);
* the storage prefetch allowance in pages (`prefetch_pages`);
* the traffic counters (`pages_h2d` host -> device loads, `pages_s2h` storage -> host copies;
  device -> host and host -> storage are what the stores took in), the tier state and the host
  breakdown.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from kvcore.contract.breakdown import MemoryBreakdown
from kvcore.contract.tiers import TierConfig, TierState
from kvcore.contract.validation import InvariantError

H = TypeVar("H")  # what a load holds in the host store: a tree node, or the host blocks
S = TypeVar("S", bound="TierStore[Any]")  # the store class: TierTree or BlockTier


class TierStore(Protocol[H]):
    """What a lower-tier store offers the controller, whatever it is keyed by. Sizes in slots;
    `pages_in` counts pages (blocks) written into it, the traffic of the link into it."""

    @property
    def capacity(self) -> int: ...
    @property
    def used(self) -> int: ...
    @property
    def locked(self) -> int: ...
    @property
    def cached(self) -> int: ...
    @property
    def free(self) -> int: ...
    @property
    def pages_in(self) -> int: ...
    def unhold(self, held: H, /) -> None: ...
    def check_holds(self, holds: list[H], /) -> None: ...
    def check_invariants(self) -> None: ...


def store_breakdown(store: TierStore[Any]) -> MemoryBreakdown:
    """A lower tier's pool in the six parts: what loads in flight hold are token states, the
    rest of its content is cache, the rest free (whole pages only: no reservation, rounding or
    external fragmentation)."""
    return MemoryBreakdown.for_pages(store.capacity, token_states=store.locked,
                                     cached=store.cached, reserved=0, rounding=0,
                                     free=store.free)


class TierController(Generic[S, H]):
    """The host (and storage) tier of one device pool: write policy, reuse counts, loads in
    flight, prefetch allowance, traffic, state (see the module docstring)."""

    def __init__(self, config: TierConfig, make_store: Callable[[str, int, int, S | None], S],
                 page_size: int, device_pages: int) -> None:
        """`make_store(name, slots, page_size, lower)` builds one store; `device_pages`: the
        device pool's page (block) ids are below device_pages + 1."""
        if not config.enabled:
            raise ValueError("a tier controller needs host_tokens > 0")
        self.config = config
        self.page_size = page_size
        self.storage: S | None = (make_store("storage", config.storage_tokens, page_size, None)
                                  if config.storage_tokens else None)
        self.host: S = make_store("host", config.host_tokens, page_size, self.storage)
        writes = config.writes
        selective = writes.on_reuse
        #: write_through (or a selective threshold of 1: due when it enters the device cache)
        self.write_on_insert = writes.on_insert or (selective and config.write_threshold <= 1)
        self.write_on_evict = writes.on_evict
        self.counts_reuse = selective and not self.write_on_insert
        # device hits of each device page since it entered the device cache (selective only)
        self._hits = np.zeros(device_pages + 1 if self.counts_reuse else 0, dtype=np.int64)
        self.inflight: dict[int, H] = {}  # request id -> what its load holds in the host
        self.pages_h2d = 0  # pages loaded host -> device
        self.pages_s2h = 0  # pages copied storage -> host (the rest of host pages_in: d2h)

    # -- write_through_selective ---------------------------------------------------------------
    def reused(self, pages: np.ndarray) -> np.ndarray:
        """An admission's device hit covers `pages` (distinct device page ids): one more use
        each. Returns which of them are now due on the host (a mask: 1 for entering the
        device cache + the hits since >= the threshold)."""
        hits = self._hits
        hits[pages] += 1
        return hits[pages] + 1 >= self.config.write_threshold

    def forget(self, pages: np.ndarray) -> None:
        """The device evicts `pages`: their content, and so their count, ends."""
        if self.counts_reuse:
            self._hits[pages] = 0

    # -- loads -----------------------------------------------------------------------------------
    def prefetch_pages(self, allowance: int) -> int:
        """Pages past the host hit a load may take from storage: what the prefetch delivered
        (`allowance` tokens, the engine's prefetch policy; whole pages), 0 without storage."""
        return allowance // self.page_size if self.storage is not None and allowance > 0 else 0

    def copied_up(self, pages: int) -> None:
        """`pages` were copied storage -> host for a load."""
        self.pages_s2h += pages

    def loaded(self, rid: int, held: H, pages: int) -> None:
        """`rid`'s admission loaded `pages` host -> device, reading `held` (held in the host
        store until `landed`)."""
        if rid in self.inflight:
            raise ValueError(f"request {rid} already has a load in flight")
        self.pages_h2d += pages
        self.inflight[rid] = held

    def landed(self, rid: int) -> None:
        """`rid`'s prefill completed or it left: what its load read may be evicted again."""
        held = self.inflight.pop(rid, None)
        if held is not None:
            self.host.unhold(held)

    # -- observation -----------------------------------------------------------------------------
    def state(self) -> TierState:
        """The tiers now: traffic each way, host and storage occupancy."""
        host, st = self.host, self.storage
        return TierState(self.pages_h2d, host.pages_in - self.pages_s2h, self.pages_s2h,
                         st.pages_in if st is not None else 0, host.used, host.locked,
                         host.capacity, st.used if st is not None else 0,
                         st.capacity if st is not None else 0)

    def host_breakdown(self) -> MemoryBreakdown:
        return store_breakdown(self.host)

    def check_invariants(self, live: Collection[int], cached_pages: np.ndarray) -> None:
        """Each store's invariants; the host holds exactly the loads in flight, each of a live
        request (`live`); nothing in storage is held outside an admission; reuse counts only
        on device pages the device cache holds (`cached_pages`: a mask over page ids)."""
        self.host.check_invariants()
        if self.storage is not None:
            self.storage.check_invariants()
            if self.storage.locked:
                raise InvariantError("a storage page is held outside an admission")
        for rid in self.inflight:
            if rid not in live:
                raise InvariantError(f"request {rid} left with a host load in flight")
        self.host.check_holds(list(self.inflight.values()))
        if self.counts_reuse and (self._hits[: len(cached_pages)][~cached_pages] != 0).any():
            raise InvariantError("a device page the cache does not hold keeps a reuse count")
        self.host_breakdown().check_invariants()


__all__ = ["TierController", "TierStore", "store_breakdown"]
