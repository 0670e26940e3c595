"""A lower KV tier keyed by radix-tree path (SGLang HiCache's host / storage tiers behind the
`paged` policy's device tree): `TierTree`, the store kvcore/sglang/hicache.py drives through
the tier controller (kvcore/tiers/controller.py; vLLM's is kvcore/vllm/block_tiers.py `BlockTier`).

Why it is built this way:
* A tier is a `RadixCache` over its own `PagedAllocator` (the same page allocator class as the
  device pool, host page ids, host capacity). A prefix's tier state is which trees hold it:
  the device tree, the host tree, the storage tree; evicted from every tier, it is gone.
  Composing trees keeps the device tree (kvcore/sglang/radix_cache.py) exactly as it was, so
  a run without a tier is the same code path.
* Lower tiers evict LRU, page-granular: the least recently used unlocked leaf loses only the
  pages needed, deepest first (a leaf is split). A parent is touched whenever a child is, so
  this is exactly an LRU over page-aligned prefixes with the tier's capacity: the property the
  reference-model test checks (tests/kvcore/test_tiers.py).
* A load in flight holds the host node it reads (`hold`: a lock on its path) until the
  request's prefill lands (`unhold`), so nothing in flight is evicted.

Invariants (`check_invariants`): the tree's own (pages whole, aligned, none free, none owned
twice) and the pool's conservation (free + held by the tree == capacity); `check_holds`: the
only locks are the loads in flight, each still linked under the root.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import torch

from kvcore.contract.tiers import tier_pages
from kvcore.contract.validation import InvariantError
from kvcore.sglang.allocator import PagedAllocator
from kvcore.sglang.node import TreeNode, frozen
from kvcore.sglang.radix_cache import RadixCache


def path_key(node: TreeNode) -> np.ndarray:
    """The token ids from the root to the end of `node` (a node only keeps its own part)."""
    parts = [n.key for n in node.path_to_root()]
    return parts[0] if len(parts) == 1 else np.concatenate(parts[::-1])


def page_slots(pages: np.ndarray, ps: int) -> np.ndarray:
    """The slots of whole pages, page after page."""
    if ps == 1:
        return pages.astype(np.int64)
    return (pages[:, None] * ps + np.arange(ps, dtype=np.int64)).reshape(-1)


class TierTree(RadixCache):
    """A lower tier (host DRAM or storage): a radix tree over its own page pool, LRU with
    page-granular eviction; evicted pages spill into `lower` when there is one."""

    def __init__(self, name: str, num_tokens: int, page_size: int,
                 lower: TierTree | None = None) -> None:
        pages = tier_pages(name, num_tokens, page_size)
        super().__init__(page_size, PagedAllocator(pages, page_size, "cpu"), eviction="lru")
        self.name = name
        self.lower = lower
        self.pages_in = 0  # pages written into this tier (what the link into it carried)
        #: also write what this tier writes into `lower` (a shared tier below the host:
        #: kvcore/tiers/shared.py); otherwise `lower` takes only what this tier evicts
        self.through = False
        if lower is not None:
            self.on_evict = self._spill

    @property
    def pool(self) -> PagedAllocator:
        assert self.allocator is not None  # always given
        return self.allocator

    @property
    def capacity(self) -> int:
        return self.pool.num_pages * self.page_size

    @property
    def used(self) -> int:
        return self.total_size()

    @property
    def locked(self) -> int:
        """Slots locked by loads in flight (reading) or by a store extending their path."""
        return self.protected_size()

    @property
    def cached(self) -> int:
        return self.evictable_size()

    @property
    def free(self) -> int:
        return self.pool.available_size()

    def _spill(self, leaf: TreeNode) -> None:
        assert self.lower is not None
        self.lower.store(path_key(leaf))

    def touch(self, key: np.ndarray) -> tuple[int, TreeNode]:
        """Match the page-aligned prefix of `key`: (its length, the node ending there, split
        if the match ends inside one). Only the pages matched become recent (the device tree
        also touches the part of a node below the match, as SGLang does), which makes this
        tier an exact LRU over pages; no slot values are gathered (nobody reads them)."""
        n = len(key) - len(key) % self.page_size
        self._clock += 1
        node, pos = self.root, 0
        while pos < n:
            children = node.children
            child = children.get(self._child_key(key, pos)) if children is not None else None
            if child is None:
                break
            m = self._match_len(child.key, key[pos:n])
            if m < len(child.key):  # the lower part keeps its priority: its heap entry holds
                child = self.split(child, m)
            child.last_access = self._clock
            child.hit_count += 1
            node, pos = child, pos + m
            if m < len(child.key):
                break
        if self._is_evictable_leaf(node):
            self._mark_leaf(node)
        return pos, node

    def _lowest_leaf(self) -> TreeNode | None:
        """The next leaf `evict` would take (stale heap entries dropped on the way)."""
        heap = self._heap
        while heap:
            key, node = heap[0]
            if node in self._evictable_leaves and key == self._priority(node):
                return node
            heapq.heappop(heap)
        return None

    def evict(self, num_tokens: int, sizes: list[int] | None = None) -> int:
        """LRU, page-granular: the oldest leaf gives only the pages still needed, its deepest
        (cut off in place: the rest keeps its key, recency and heap entry). Every page goes
        back to the pool in one push; each evicted (part of a) leaf spills to the lower tier
        first, when there is one."""
        ps, freed = self.page_size, 0
        starts: list[np.ndarray] = []
        while freed < num_tokens:
            leaf = self._lowest_leaf()
            if leaf is None:
                break
            assert leaf.host is not None  # a lower tier's tree lives on the host
            if self.on_evict is not None:
                self.on_evict(leaf)
            want = -(-(num_tokens - freed) // ps) * ps
            keep = len(leaf) - want
            if keep > 0:  # the deepest `want` tokens go; the leaf stays, shorter
                starts.append(leaf.host[keep::ps])
                leaf.key, leaf.value, leaf.host = (leaf.key[:keep], leaf.value[:keep],
                                                   leaf.host[:keep])
                gone = want
            else:
                heapq.heappop(self._heap)  # `leaf` is the top entry
                starts.append(leaf.host[::ps])
                gone = len(leaf)
                parent = leaf.parent
                assert parent is not None
                self._remove_child(parent, leaf)
                self._evictable_leaves.discard(leaf)
                if self._is_evictable_leaf(parent):
                    self._mark_leaf(parent)
            self._evictable -= gone
            freed += gone
            if sizes is not None:
                sizes.append(gone)
        if starts:
            firsts = starts[0] if len(starts) == 1 else np.concatenate(starts)
            self.pool.push_host(firsts // ps if ps > 1 else firsts)
        return freed

    def store(self, key: np.ndarray) -> int:
        """Write the page-aligned prefix `key` into this tier (touching what it has, evicting
        LRU pages for the rest, as much as fits). Returns the pages written."""
        ps = self.page_size
        n = len(key) - len(key) % ps
        if n == 0:
            return 0
        m, node = self.touch(key[:n])
        if m >= n:
            return 0
        if self.pool.available_size() < n - m:
            self.inc_lock_ref(node)  # the path it extends must stay while evicting
            self.evict(n - m - self.pool.available_size())
            self.dec_lock_ref(node)
        room = min(n - m, self.pool.available_size())
        room -= room % ps
        if room <= 0:
            return 0
        pages = self.pool.pop_host(room // ps)
        assert pages is not None  # room is free
        self._attach(node, key, m, m + room, page_slots(pages, ps))
        self.pages_in += room // ps
        if self.through and self.lower is not None:
            self.lower.store(key[: m + room])
        return room // ps

    def _attach(self, node: TreeNode, key: np.ndarray, start: int, end: int,
                slots: np.ndarray) -> None:
        """A new leaf key[start:end] under `node`, which ends at `start` with no child
        continuing the key (what `touch` returned): the insert, without walking again."""
        leaf = self._new_node(frozen(key[start:end]), torch.from_numpy(slots), node, slots)
        if self._is_evictable_leaf(node):
            self._evictable_leaves.discard(node)
        self._add_child(node, leaf)
        self._evictable += end - start
        self._mark_leaf(leaf)

    # -- loads in flight ----------------------------------------------------------------------
    def hold(self, node: TreeNode) -> None:
        """A load reads the prefix ending at `node`: its path stays until `unhold`."""
        self.inc_lock_ref(node)

    def unhold(self, node: TreeNode) -> None:
        """The load reading up to `node` landed: its pages may be evicted again."""
        self.dec_lock_ref(node)

    def check_holds(self, holds: Sequence[TreeNode]) -> None:
        """The tree's only locks are `holds` (the loads in flight), each still linked from
        the root: nothing in flight was evicted."""
        locks = sum(n.own_locks for n in self.nodes())
        if locks != len(holds):
            raise InvariantError(f"{self.name} tree holds {locks} locks, {len(holds)} loads "
                                 "in flight")
        for n in holds:
            top = n
            while top.parent is not None:
                if top.parent.children is None or top.parent.children.get(top.ckey) is not top:
                    raise InvariantError(f"{n!r}: a {self.name} node in flight was evicted")
                top = top.parent
            if top is not self.root:
                raise InvariantError(f"{n!r}: a {self.name} node in flight is not under the "
                                     "root")

    def check_invariants(self) -> None:
        """The tree's invariants and the pool's conservation (the tree is its only holder)."""
        super().check_invariants()
        self.pool.check_invariants()
        held = self.total_size()
        if held + self.pool.available_size() != self.capacity:
            raise InvariantError(f"{self.name} tier: {held} held + "
                                 f"{self.pool.available_size()} free != capacity "
                                 f"{self.capacity}")


__all__ = ["TierTree", "page_slots", "path_key"]
