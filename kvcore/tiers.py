"""A hierarchical KV cache (SGLang HiCache's semantics): the device radix tree backed by a host
DRAM tier and, optionally, a storage tier, each a real page pool with its own page ids.

Why it is built this way:
* Each lower tier is a `TierTree`: a `RadixCache` over its own `PagedAllocator` (the same page
  allocator class as the device pool, host page ids, host capacity). A prefix's tier state is
  where its pages are: in the device tree (device value), in the host tree (host value), in
  the storage tree (storage presence). A prefix evicted from every tier is in no tree: it is
  gone. Composing three trees keeps the device tree (kvcore/radix_cache.py) exactly as it was,
  so a run without a tier is the same code path, and results stay identical.
* `match` answers the device-hit length, then the host hit (host pages past the device hit)
  and the storage hit (storage pages past both): a prefix is loaded device <- host <- storage.
* A host (or storage) hit is loaded into newly allocated device pages, inserted in the device
  tree and locked by the admitted request; the host pages it is read from stay locked in the
  host tree while the load is in flight (until the request's prefill completes), so nothing in
  flight is evicted.
* Device eviction only frees device pages: a prefix with a host copy keeps it. `write_back`
  copies a device-evicted leaf to the host then; `write_through` copies on every device insert;
  `write_through_selective` once a device node's hit count reaches the threshold (SGLang's
  default 2). Host eviction spills to storage when there is one.
* Lower tiers evict LRU, page-granular: the least recently used unlocked leaf loses only the
  pages needed, deepest first (a leaf is split). A parent is touched whenever a child is, so
  this is exactly an LRU over page-aligned prefixes with the tier's capacity: the property the
  reference-model test checks.

Invariants (`check_invariants`): each tree's own (pages whole, aligned, none free, none owned
twice); each lower tier's allocator conserves its pages (free + held by the tree == capacity);
the only locks in the host tree are the in-flight loads, each still linked under the root.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import torch

from kvcore.allocator import PagedAllocator
from kvcore.breakdown import MemoryBreakdown
from kvcore.radix_cache import RadixCache, TreeNode
from kvcore.radix_node import frozen
from kvcore.registry import Registry
from kvcore.validation import InvariantError


@dataclass(frozen=True)
class WritePolicy:
    """When device KV is copied to the host tier (SGLang HiCache's --hicache-write-policy,
    python/sglang/srt/mem_cache/hiradix_cache.py): on every device insert, once a prefix is
    reused (selective), or when the device evicts it (write-back). One flag each, so callers
    ask what the policy does rather than compare its name."""

    on_insert: bool = False
    on_reuse: bool = False
    on_evict: bool = False


#: the host write policies by name (TierConfig.write_policy, --hicache-write-policy)
WRITES: Registry[WritePolicy] = Registry("write policy")
WRITES.add("write_through", WritePolicy(on_insert=True))
WRITES.add("write_through_selective", WritePolicy(on_reuse=True))
WRITES.add("write_back", WritePolicy(on_evict=True))
WRITE_POLICIES: tuple[str, ...] = tuple(WRITES.names())
#: SGLang's default hit count for write_through_selective
SELECTIVE_THRESHOLD = 2


@dataclass(frozen=True)
class TierConfig:
    """Sizes of the lower tiers in slots (0: none) and the host write policy."""

    host_tokens: int = 0
    storage_tokens: int = 0
    write_policy: str = "write_through"
    write_threshold: int = SELECTIVE_THRESHOLD

    def __post_init__(self) -> None:
        for name in ("host_tokens", "storage_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        WRITES.get(self.write_policy)  # an unknown name lists the known ones
        if self.write_threshold < 1:
            raise ValueError(f"write_threshold must be >= 1, got {self.write_threshold!r}")
        if self.storage_tokens and not self.host_tokens:
            raise ValueError("a storage tier needs a host tier (storage loads go through host)")

    @property
    def enabled(self) -> bool:
        return self.host_tokens > 0

    @property
    def writes(self) -> WritePolicy:
        """What the write policy does."""
        return WRITES.get(self.write_policy)


class TierHit(NamedTuple):
    """Tokens of a prefix found in each tier, in load order: `device` from the root, `host`
    past it, `storage` past both (page-aligned)."""

    device: int
    host: int
    storage: int


class Fetch(NamedTuple):
    """What `HierarchicalCache.fetch` loaded: the device node now ending the request's prefix,
    its device slots, the tokens loaded from host and from storage, and the host node locked
    while the load is in flight (None when nothing was loaded)."""

    node: TreeNode
    indices: torch.Tensor
    host_tokens: int
    storage_tokens: int
    host_lock: TreeNode | None


class TierState(NamedTuple):
    """Lower tiers now: pages moved so far each way, and slots used / locked / held."""

    pages_h2d: int
    pages_d2h: int
    pages_s2h: int
    pages_h2s: int
    host_used: int
    host_locked: int
    host_capacity: int
    storage_used: int
    storage_capacity: int


class LowerStore(Protocol):
    """What every lower-tier store reports, whatever it is keyed by (`TierTree`: radix-tree
    path; kvcore/block_tiers.py `BlockTier`: block-hash chain). Sizes in slots; `pages_in`
    counts pages (blocks) written into it, the traffic of the link into it. The tier state and
    the host breakdown are computed from it once (`tier_state`, `store_breakdown`), for both."""

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


@dataclass
class TierCounters:
    """Pages moved between tiers that no store counts by itself: host -> device loads and
    storage -> host copies (device -> host is what the host took in less the latter)."""

    pages_h2d: int = 0
    pages_s2h: int = 0

    def state(self, host: LowerStore, storage: LowerStore | None) -> TierState:
        """The tiers now: traffic each way, host and storage occupancy."""
        return TierState(self.pages_h2d, host.pages_in - self.pages_s2h, self.pages_s2h,
                         storage.pages_in if storage is not None else 0, host.used,
                         host.locked, host.capacity,
                         storage.used if storage is not None else 0,
                         storage.capacity if storage is not None else 0)


def store_breakdown(store: LowerStore) -> MemoryBreakdown:
    """A lower tier's pool in the six parts: what loads in flight hold are token states, the
    rest of its content is cache, the rest free (whole pages only: no reservation, rounding or
    external fragmentation)."""
    return MemoryBreakdown.for_pages(store.capacity, token_states=store.locked,
                                     cached=store.cached, reserved=0, rounding=0,
                                     free=store.free)


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
        pages = num_tokens // page_size
        if pages < 1:
            raise ValueError(f"the {name} tier of {num_tokens} slots is smaller than one page "
                             f"of {page_size} tokens")
        super().__init__(page_size, PagedAllocator(pages, page_size, "cpu"), eviction="lru")
        self.name = name
        self.lower = lower
        self.pages_in = 0  # pages written into this tier (what the link into it carried)
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
                child = self._split(child, m)
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

    def check_invariants(self) -> None:
        """The tree's invariants and the pool's conservation (the tree is its only holder)."""
        super().check_invariants()
        self.pool.check_invariants()
        held = self.total_size()
        if held + self.pool.available_size() != self.capacity:
            raise InvariantError(f"{self.name} tier: {held} held + "
                                 f"{self.pool.available_size()} free != capacity "
                                 f"{self.capacity}")


class HierarchicalCache:
    """The device tree plus a host tier (and an optional storage tier behind it)."""

    def __init__(self, tree: RadixCache, config: TierConfig) -> None:
        if tree.allocator is None:
            raise ValueError("the device tree needs its allocator to load pages into")
        if not config.enabled:
            raise ValueError("a hierarchical cache needs host_tokens > 0")
        self.tree = tree
        self.config = config
        ps = tree.page_size
        self.storage = (TierTree("storage", config.storage_tokens, ps)
                        if config.storage_tokens else None)
        self.host = TierTree("host", config.host_tokens, ps, self.storage)
        self.traffic = TierCounters()  # host -> device loads, storage -> host prefetches
        self.inflight: list[TreeNode] = []  # host nodes locked by loads in flight
        self.writes = config.writes
        if self.writes.on_evict:
            tree.on_evict = self._write_back

    def _write_back(self, leaf: TreeNode) -> None:
        self.host.store(path_key(leaf))

    # -- matching and loading ----------------------------------------------------------------
    def match(self, key: np.ndarray) -> TierHit:
        """The hit in each tier, without touching anything."""
        d = self.tree.peek(key)[0]
        h = max(self.host.peek(key)[0] - d, 0)
        s = max(self.storage.peek(key)[0] - d - h, 0) if self.storage is not None else 0
        return TierHit(d, h, s)

    def after_insert(self, key: np.ndarray) -> None:
        """A prefix entered the device tree: `write_through` backs it up now."""
        if self.writes.on_insert:
            self.host.store(key)

    def fetch(self, key: np.ndarray, device: torch.Tensor, node: TreeNode,
              storage_allowance: int) -> Fetch:
        """Load what the lower tiers hold past the device hit (`device`, the slots matched,
        ending at `node`, which the caller has locked) into new device pages, as much as the
        device can free; at most `storage_allowance` tokens come from storage (the prefetch
        policy's answer). The loaded prefix is inserted in the device tree and the caller moves
        its lock to the returned node; `host_lock` stays locked until `done(host_lock)`."""
        ps = self.tree.page_size
        d = len(device)
        none = Fetch(node, device, 0, 0, None)
        if (self.writes.on_reuse and d
                and node.hit_count >= self.config.write_threshold):
            self.host.store(key[:d])
        h, hnode = self.host.touch(key)
        from_storage = 0
        if self.storage is not None and storage_allowance > 0:
            base = max(h, d)
            s = self.storage.peek(key)[0]
            take = min(s, base + storage_allowance)
            take -= take % ps
            if take > base:
                snode = self.storage.touch(key[:take])[1]
                self.storage.inc_lock_ref(snode)  # read while the host makes room
                try:
                    self.traffic.pages_s2h += self.host.store(key[:take])
                finally:
                    self.storage.dec_lock_ref(snode)
                h, hnode = self.host.touch(key)
                from_storage = max(h - base, 0)
        if h <= d:
            return none
        self.host.inc_lock_ref(hnode)  # in flight: the host copy must stay
        alloc = self.tree.allocator
        assert alloc is not None
        short = (h - d) - alloc.available_size()
        if short > 0:
            self.tree.evict(short)
        room = min(h - d, alloc.available_size())
        room -= room % ps
        if room <= 0:
            self.host.dec_lock_ref(hnode)
            return none
        pages = alloc.pop_host(room // ps)
        assert pages is not None
        new = page_slots(pages, ps)
        value = np.concatenate([device.cpu().numpy(), new]) if d else new
        already, top = self.tree.insert_path(key[: d + room], value)
        if already != d:
            raise InvariantError(f"load: the device prefix changed under its lock "
                                 f"({already} != {d})")
        self.traffic.pages_h2d += room // ps
        self.inflight.append(hnode)
        slots = torch.from_numpy(value).to(device.device)
        from_storage = min(from_storage, room)
        return Fetch(top, slots, room - from_storage, from_storage, hnode)

    def done(self, host_lock: TreeNode) -> None:
        """A load finished: its host pages may be evicted again."""
        self.inflight.remove(host_lock)
        self.host.dec_lock_ref(host_lock)

    # -- observation -------------------------------------------------------------------------
    def state(self) -> TierState:
        return self.traffic.state(self.host, self.storage)

    def check_invariants(self) -> None:
        self.host.check_invariants()
        if self.storage is not None:
            self.storage.check_invariants()
            if self.storage.protected_size():
                raise InvariantError("a storage page is locked outside a prefetch")
        locks = sum(n.own_locks for n in self.host.nodes())
        if locks != len(self.inflight):
            raise InvariantError(f"host tree holds {locks} locks, {len(self.inflight)} loads "
                                 "in flight")
        for n in self.inflight:
            top = n
            while top.parent is not None:
                if top.parent.children is None or top.parent.children.get(top.ckey) is not top:
                    raise InvariantError(f"{n!r}: a host node in flight was evicted")
                top = top.parent
            if top is not self.host.root:
                raise InvariantError(f"{n!r}: a host node in flight is not under the root")


__all__ = [
    "SELECTIVE_THRESHOLD",
    "WRITES",
    "WRITE_POLICIES",
    "Fetch",
    "HierarchicalCache",
    "LowerStore",
    "TierConfig",
    "TierCounters",
    "TierHit",
    "TierState",
    "TierTree",
    "WritePolicy",
    "page_slots",
    "path_key",
    "store_breakdown",
]
