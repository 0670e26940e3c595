"""`HiCache`: SGLang HiCache's host (and storage) tier behind the device radix cache, the `paged`
manager's tier member (`SGLangPolicy.tiers`, built when the configuration asks for a host
tier; kvcore/sglang/policy.py).

It is the tier controller (kvcore/tiers/controller.py: write policy decisions, reuse counts,
loads in flight, traffic) over radix-path stores (kvcore/sglang/tier_tree.py `TierTree`), plus
what depends on the device tree: an admission's device match continues into the host and
storage trees and the hit is loaded into new device pages, which the request then holds like
any cached prefix (`cached` covers them: they are not prefilled). A prefix is loaded device <-
host <- storage: the host hit is what the host holds past the device hit, the storage hit what
storage holds past both (at most the prefetch allowance; copied to the host first). The host
pages a load reads stay held until the request's prefill completes (`cache_prefix`) or it
leaves (`release` / `finish`): that is the load's time in flight, which the engine charges.

Device eviction only frees device pages: a prefix with a host copy keeps it. The write
policies (the controller's decisions): `write_through` stores a prefix on the host whenever
the device tree takes it; `write_back` stores a device leaf the tree evicts, before its pages
go; `write_through_selective` stores the part of an admission's device hit whose pages became
due (reuse counted per device page; along a tree path the counts never grow with depth, so
the due pages are a prefix of the hit).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import torch

from kvcore.contract.tiers import TierConfig, TierHit
from kvcore.contract.validation import InvariantError
from kvcore.sglang.allocator import PagedAllocator
from kvcore.sglang.node import MatchResult, TreeNode
from kvcore.sglang.radix_cache import RadixCache
from kvcore.sglang.tier_tree import TierTree, page_slots, path_key
from kvcore.tiers.controller import TierController

__all__ = ["HiCache"]


class HiCache(TierController[TierTree, TreeNode]):
    """The host (+ storage) tier of one device radix cache over `allocator`'s pages."""

    def __init__(self, config: TierConfig, tree: RadixCache, allocator: PagedAllocator) -> None:
        super().__init__(config, TierTree, tree.page_size, allocator.num_pages)
        self.tree, self.allocator = tree, allocator
        if self.write_on_evict or self.counts_reuse:
            tree.on_evict = self.device_evicted

    # -- writing to the host -------------------------------------------------------------------
    def device_evicted(self, leaf: TreeNode) -> None:
        """The device tree evicts `leaf`: its pages' reuse counts end; write_back stores it."""
        if self.counts_reuse:
            self.forget(self._pages(leaf.value))
        if self.write_on_evict:
            self.host.store(path_key(leaf))

    def inserted(self, key: np.ndarray) -> None:
        """The device tree took the prefix `key`: write_through backs it up now."""
        if self.write_on_insert:
            self.host.store(key)

    def _pages(self, slots: torch.Tensor) -> np.ndarray:
        """The device pages of whole-page `slots`."""
        ps = self.page_size
        return slots[::ps].cpu().numpy() // ps

    # -- admission -----------------------------------------------------------------------------
    def peek(self, token_ids: np.ndarray, device: int) -> TierHit:
        """The hit of each tier past the `device` hit (read-only)."""
        h = max(self.host.peek(token_ids)[0] - device, 0)
        s = (max(self.storage.peek(token_ids)[0] - device - h, 0)
             if self.storage is not None else 0)
        return TierHit(device, h, s)

    def load(self, rid: int, key: np.ndarray, match: MatchResult,
             allowance: int) -> tuple[MatchResult, int, int]:
        """The device match (locked by the caller), extended by what the lower tiers hold past
        it, loaded into new device pages as far as the device can free them: (the match to
        hold instead, host tokens loaded, storage tokens loaded). write_through_selective first
        stores the due part of the device hit. `allowance`: storage tokens the prefetch
        delivered."""
        ps = self.page_size
        device, d = match.indices, len(match.indices)
        if self.counts_reuse and d:
            due = self.reused(self._pages(device))
            k = len(due) if due.all() else int(np.argmin(due))  # the leading due pages
            if k:
                self.host.store(key[: k * ps])
        h, hnode = self.host.touch(key)
        from_storage = 0
        allow = self.prefetch_pages(allowance)
        if allow:
            h, hnode, from_storage = self._from_storage(key, max(h, d), allow, h, hnode)
        if h <= d:
            return match, 0, 0
        return self._copy_down(rid, key, match, h, hnode, from_storage)

    def _from_storage(self, key: np.ndarray, base: int, allow: int, h: int,
                      hnode: TreeNode) -> tuple[int, TreeNode, int]:
        """Copy what storage holds past `base` (at most `allow` pages) to the host. Returns
        the host hit after, its node, and the tokens of it that came from storage."""
        ps = self.page_size
        assert self.storage is not None
        take = min(self.storage.peek(key)[0], base + allow * ps)
        take -= take % ps
        if take <= base:
            return h, hnode, 0
        snode = self.storage.touch(key[:take])[1]
        self.storage.hold(snode)  # read while the host makes room
        try:
            self.copied_up(self.host.store(key[:take]))
        finally:
            self.storage.unhold(snode)
        h, hnode = self.host.touch(key)
        return h, hnode, max(h - base, 0)

    def _copy_down(self, rid: int, key: np.ndarray, match: MatchResult, h: int,
                   hnode: TreeNode, from_storage: int) -> tuple[MatchResult, int, int]:
        """Load host[d:h] into new device pages (evicting device cache for them; as much as
        fits, whole pages), insert them in the device tree, hold `hnode` until the prefill
        lands."""
        ps, alloc, tree = self.page_size, self.allocator, self.tree
        device, d = match.indices, len(match.indices)
        self.host.hold(hnode)  # in flight: the host copy must stay
        short = (h - d) - alloc.available_size()
        if short > 0:
            tree.evict(short)
        room = min(h - d, alloc.available_size())
        room -= room % ps
        if room <= 0:
            self.host.unhold(hnode)
            return match, 0, 0
        pages = alloc.pop_host(room // ps)
        assert pages is not None
        new = page_slots(pages, ps)
        value = np.concatenate([device.cpu().numpy(), new]) if d else new
        already, top = tree.insert(key[: d + room], value)
        if already != d:
            raise InvariantError(f"load: the device prefix changed under its lock "
                                 f"({already} != {d})")
        self.loaded(rid, hnode, room // ps)
        from_storage = min(from_storage, room)
        return (MatchResult(torch.from_numpy(value).to(device.device), top, match.token_hit),
                room - from_storage, from_storage)

    # -- checks --------------------------------------------------------------------------------
    def check(self, live: Collection[int]) -> None:
        """The controller's invariants, with the device pages the device tree holds."""
        cached = np.zeros(self.allocator.num_pages + 1, dtype=bool)
        if self.counts_reuse:
            for n in self.tree.nodes():
                cached[self._pages(n.value)] = True
        self.check_invariants(live, cached)
