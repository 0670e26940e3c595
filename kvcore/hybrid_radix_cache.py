"""HybridRadixCache: SGLang's radix cache for hybrid models (sliding window and / or Mamba state).

It is kvcore's `RadixCache` (keys, full-attention slots as values, full locks, LRU eviction of
unlocked leaves), with more on each node, after SGLang v0.5's `SWARadixCache`
(python/sglang/srt/mem_cache/swa_radix_cache.py) and `MambaRadixCache` (mamba_radix_cache.py,
the "v1" cache of the default `no_buffer` strategy, which asserts page size 1):

* **SWA tombstones.** A node's SWA KV can be freed while its full KV stays (`tomb`): the SWA
  pool is smaller than the full pool, and only a request's last window needs SWA KV. SWA
  eviction takes unlocked non-tombstone nodes least recently used first (at equal use, the
  nodes nearer the root first: SGLang resets a matched path so that parents are older than
  their children): an inner node is tombstoned, a leaf is evicted whole. Leaves are never
  tombstones: one left by an eviction below it is deleted at once (SGLang
  `_iteratively_delete_tombstone_leaf`).
* **SWA locks.** A request locks full KV on its whole path but SWA KV only on the nodes that
  hold its last `window` tokens (`swa_lock`); the node where the window is reached carries a
  `swa_uuid` that the unlock walk stops at (SGLang's `swa_uuid_for_lock`; a split hands it
  to the upper part, which is then the boundary).
* **Match rule.** A prefix can be reused only if its last `window` tokens have SWA KV, or if
  no node on its path is a tombstone: the match is the longest such prefix (SGLang
  `_match_prefix_helper`, "match_len_since_tombstone >= sliding_window_size").
* **Mamba states.** A node may hold a state slot (`state`): the recurrent state after its
  last token. A match must end at a node with a state (its state is copied into the
  request's slot: copy on write); a split leaves the state on the lower part. A request
  locks the state of the node its match ended at (`state_lock`, SGLang `mamba_lock_ref`).
  State eviction takes unlocked states least recently used first: an inner (or locked) node
  loses its state (marked `STATE_EVICTED`, so the reuse accounting tells a state the pool
  evicted from one never kept there), an unlocked leaf is evicted whole.

Full eviction (`evict`) is the base class's, which frees each evicted leaf's SWA page and
state too (through `on_evict`), then deletes tombstone / stateless leaves left behind.

Invariants (`check_invariants`), besides RadixCache's:

    a non-tombstone node's pages all have an SWA page; a tombstone's have none
    no tombstone leaf; a tombstone has no SWA lock; locks are >= 0
    node states are distinct slots in use; a state lock implies a state
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvcore.mamba_pool import MambaPool
from kvcore.radix_cache import RadixCache
from kvcore.radix_node import TreeNode, as_key
from kvcore.swa_pool import SWAPagePool
from kvcore.validation import InvariantError

__all__ = ["NO_STATE", "STATE_EVICTED", "HybridLock", "HybridNode", "HybridRadixCache",
           "ReuseCuts"]

#: a node's `state` without a slot: never kept there (the state after a node's last token is
#: kept only at the end of an inserted sequence), or kept and then evicted from the state pool
NO_STATE = -1
STATE_EVICTED = -2


@dataclass(frozen=True)
class ReuseCuts:
    """Where a hybrid prefix match was cut, in tokens of the key (each <= the one before):
    `content`, the page-aligned prefix whose full-attention KV the cache holds; `windowed`,
    the longest prefix of it whose last sliding window still has its SWA KV (no window:
    `content`); `boundary`, the longest of those that ends where the cache kept a state
    (no state layers: `windowed`). The hit itself is <= `boundary`: a state kept and then
    evicted from its pool counts in `boundary` and not in the hit."""

    content: int
    windowed: int
    boundary: int


class HybridNode(TreeNode):
    """A radix node with SWA and Mamba-state bookkeeping (see the module notes)."""

    __slots__ = ("state", "state_lock", "swa_lock", "swa_uuid", "tomb")

    def __init__(self, key: np.ndarray, value: torch.Tensor, parent: TreeNode | None,
                 nid: int) -> None:
        super().__init__(key, value, parent, nid)
        self.tomb = False
        self.swa_lock = 0
        self.swa_uuid = 0
        self.state = NO_STATE
        self.state_lock = 0


@dataclass(frozen=True)
class HybridLock:
    """What `lock` took, for `unlock`: the node, the SWA boundary's uuid (0: the SWA locks
    reach the root) and whether the node's state was locked."""

    node: HybridNode
    swa_uuid: int
    state: bool


class HybridRadixCache(RadixCache):
    """The radix cache of SGLang's hybrid pools. `window` is the sliding window in tokens
    (None: no SWA layers); `states` the Mamba state pool (None: no state layers)."""

    node_class = HybridNode

    def __init__(self, page_size: int, pool: SWAPagePool, window: int | None,
                 states: MambaPool | None, eviction: str = "lru",
                 disable: bool = False) -> None:
        if window is not None and window < 1:
            raise ValueError(f"sliding window must be >= 1 token, got {window}")
        if states is not None and page_size != 1 and not disable:
            raise ValueError(f"page_size {page_size}: SGLang's Mamba radix cache (v0.5, "
                             "no_buffer) needs page size 1")
        if (window is None) != (pool.swa is None):
            raise ValueError("a sliding window needs an SWA pool, and an SWA pool a window")
        super().__init__(page_size, pool.full, eviction=eviction, disable=disable)
        self.pool = pool
        self.window = window
        self.states = states
        self._uuid = 0
        self._parents: list[TreeNode] = []
        self.on_evict = self._on_full_evict

    # -- node helpers ----------------------------------------------------------------------
    def _pages(self, node: TreeNode) -> np.ndarray:
        """The node's full pages (its values are whole pages)."""
        slots = node.host if node.host is not None else node.value.cpu().numpy()
        return slots[:: self.page_size] // self.page_size

    def _attached(self, node: TreeNode) -> bool:
        parent = node.parent
        return parent is not None and parent.children is not None \
            and parent.children.get(node.ckey) is node

    @staticmethod
    def _depth(node: TreeNode) -> int:
        """Tokens above the node (its start offset)."""
        return sum(len(n.key) for n in node.path_to_root()) - len(node.key)

    def _split(self, child: TreeNode, m: int) -> TreeNode:
        upper = super()._split(child, m)
        assert isinstance(upper, HybridNode) and isinstance(child, HybridNode)
        upper.tomb, upper.swa_lock = child.tomb, child.swa_lock
        upper.swa_uuid, child.swa_uuid = child.swa_uuid, 0  # the upper part is the boundary
        return upper  # the state (after the last token) stays on the lower part

    # -- matching --------------------------------------------------------------------------
    def _walk_hybrid(self, key: np.ndarray) -> tuple[int, int, ReuseCuts]:
        """(hit, the part of it that is unlocked: evictable, where each rule cut the match),
        read-only. Locks cover root paths, so the unlocked nodes of a match are a suffix of
        it."""
        n = len(key) - len(key) % self.page_size
        best = (0, 0)
        node, pos, since, evictable = self.root, 0, 1 << 62, 0
        window, states = self.window, self.states is not None
        content = windowed = boundary = 0
        while pos < n:
            children = node.children
            child = children.get(self._child_key(key, pos)) if children is not None else None
            if child is None:
                break
            assert isinstance(child, HybridNode)
            m = self._match_len(child.key, key[pos:n])
            if m == 0:
                break
            content = pos + m
            since = 0 if child.tomb else since + m
            if child.lock_ref == 0:
                evictable += m
            whole = m == len(child.key)
            if window is None or since >= window:
                windowed = pos + m
                if not states or (whole and child.state != NO_STATE):
                    boundary = pos + m
                if not states or (whole and child.state >= 0):
                    best = (pos + m, evictable)
            if not whole:
                break
            node, pos = child, pos + m
        return (*best, ReuseCuts(content, windowed, boundary))

    def reuse_cuts(self, key: object) -> ReuseCuts:
        """Where the match rules cut a match of `key` (read-only; all 0 with the cache
        off): the full-attention KV the tree holds, the part whose window still has SWA KV,
        and the part ending where a state was kept (now, or until the state pool evicted
        it)."""
        if self.disable:
            return ReuseCuts(0, 0, 0)
        return self._walk_hybrid(as_key(key))[2]

    def peek_hybrid(self, key: object) -> tuple[int, int]:
        """(hit a match would give now, the part of it that is evictable), read-only."""
        if self.disable:
            return 0, 0
        return self._walk_hybrid(as_key(key))[:2]

    def match(self, key: object) -> tuple[torch.Tensor, HybridNode]:
        """The usable prefix of `key` (see the match rule): its slots and the node it ends at.
        It is RadixCache's match of the key cut to that prefix, so a layout whose rule cuts
        nothing (no tombstone, no state layer) matches, splits and touches exactly as the
        full-attention cache does."""
        key = as_key(key)
        hit = 0 if self.disable else self._walk_hybrid(key)[0]
        indices, node = self.match_prefix(key[:hit])
        assert isinstance(node, HybridNode) and len(indices) == hit
        return indices, node

    # -- locks -----------------------------------------------------------------------------
    def lock(self, node: HybridNode) -> HybridLock:
        """Lock `node`'s path for a running request: full KV to the root, SWA KV over its
        last window, the node's state if it has one."""
        self.inc_lock_ref(node)
        uuid = 0
        if self.window is not None and not self.disable:
            acc = 0
            cur: TreeNode = node
            while cur is not self.root and acc < self.window:
                assert isinstance(cur, HybridNode)
                if cur.tomb:
                    raise InvariantError(f"{cur!r}: SWA lock on a tombstone within the window")
                cur.swa_lock += 1
                acc += len(cur.key)
                if acc >= self.window:
                    if not cur.swa_uuid:
                        self._uuid += 1
                        cur.swa_uuid = self._uuid
                    uuid = cur.swa_uuid
                parent = cur.parent
                assert parent is not None
                cur = parent
        state = self.states is not None and not self.disable and node.state >= 0
        if state:
            node.state_lock += 1
        return HybridLock(node, uuid, state)

    def unlock(self, lock: HybridLock) -> None:
        node = lock.node
        self.dec_lock_ref(node)
        if self.window is not None and not self.disable:
            n: TreeNode = node
            while n is not self.root:
                assert isinstance(n, HybridNode)
                n.swa_lock -= 1
                if lock.swa_uuid and n.swa_uuid == lock.swa_uuid:
                    break
                parent = n.parent
                assert parent is not None
                n = parent
        if lock.state:
            node.state_lock -= 1

    # -- insertion -------------------------------------------------------------------------
    def insert_hybrid(self, key: np.ndarray, row_slots: np.ndarray, cached: int,
                      swa_evicted: int, state: int) -> tuple[int, int, TreeNode | None, bool]:
        """Cache a request's first `len(key)` tokens (whole pages; slots `row_slots`).
        `cached`: its tokens the tree already owned; `swa_evicted`: page-aligned, its tokens
        [cached, swa_evicted) have no SWA KV left; `state`: its state slot (-1: none).

        Returns (dup, kept, node, adopted): the request's slots for [cached, dup) duplicate the
        tree's and [kept, len(key)) were not taken (the caller frees both); the tree now owns
        [dup, kept); `node` ends at `kept` (None when nothing was inserted); `adopted`: the
        tree took `state`. Like SGLang's insert with `swa_evicted_seqlen`: tokens whose SWA
        KV is gone go in as a tombstone; an existing tombstone whose tokens the request still
        has SWA KV for is revived with the request's SWA pages."""
        n = len(key)
        if self.disable or n <= cached:
            return cached, cached, None, False
        window = self.window
        if window is not None and swa_evicted >= n:  # would be a tombstone leaf: keep none
            return cached, cached, None, False
        dup, node = self.insert_path(key, row_slots)
        assert isinstance(node, HybridNode)
        ps = self.page_size
        if window is not None:
            if dup < n and swa_evicted > dup:  # the new leaf starts without SWA KV
                upper = self._split(node, swa_evicted - dup)
                assert isinstance(upper, HybridNode)
                if self.pool.has_swa(self._pages(upper)).any():
                    raise InvariantError("a tombstone part of an insert still has SWA pages")
                upper.tomb = True
            lo = max(cached, swa_evicted)
            end = n
            for p in node.path_to_root():  # revive tombstones the request has SWA KV for
                start = end - len(p.key)
                assert isinstance(p, HybridNode)
                if p.tomb and start >= lo and end <= dup:
                    mine = row_slots[start:end:ps] // ps
                    self.pool.move_swa(mine, self._pages(p))
                    p.tomb = False
                end = start
        adopted = False
        if self.states is not None and state >= 0 and node.state < 0:
            node.state = state
            adopted = True
        return dup, n, node, adopted

    # -- eviction --------------------------------------------------------------------------
    def _on_full_evict(self, leaf: TreeNode) -> None:
        """A leaf leaves by full eviction: its SWA page and state go with it."""
        assert isinstance(leaf, HybridNode)
        if not leaf.tomb:
            self.pool.free_swa(self._pages(leaf))
        if leaf.state >= 0:
            assert self.states is not None
            self.states.free(leaf.state)
            leaf.state = -1
        if leaf.parent is not None:
            self._parents.append(leaf.parent)

    def evict(self, num_tokens: int, sizes: list[int] | None = None) -> int:
        """Full eviction (RadixCache's), then the tombstone / stateless leaves it left."""
        self._parents = []
        freed = super().evict(num_tokens, sizes)
        for p in self._parents:
            freed += self._drop_dead_leaves(p)
        self._parents = []
        return freed

    def _dead(self, node: TreeNode) -> bool:
        """An unlocked leaf no match can end at or pass through usefully."""
        assert isinstance(node, HybridNode)
        return (node is not self.root and not node.children and node.lock_ref == 0
                and (node.tomb or (self.states is not None and node.state < 0)))

    def _drop_dead_leaves(self, node: TreeNode) -> int:
        freed = 0
        while self._attached(node) and self._dead(node):
            parent = node.parent
            assert parent is not None
            freed += self._delete_leaf(node)
            node = parent
        return freed

    def _delete_leaf(self, leaf: TreeNode) -> int:
        """Remove an unlocked leaf: free its full pages, SWA pages and state."""
        assert isinstance(leaf, HybridNode) and leaf.lock_ref == 0 and not leaf.children
        pages = self._pages(leaf)
        if not leaf.tomb:
            self.pool.free_swa(pages)
        if leaf.state >= 0:
            assert self.states is not None
            self.states.free(leaf.state)
            leaf.state = -1
        self.pool.full.push_host(pages)
        parent = leaf.parent
        assert parent is not None
        self._remove_child(parent, leaf)
        self._evictable_leaves.discard(leaf)
        self._evictable -= len(leaf.key)
        leaf.parent = None
        if self._is_evictable_leaf(parent):
            self._mark_leaf(parent)
        return len(leaf.key)

    def _lru_order(self, nodes: list[HybridNode]) -> list[HybridNode]:
        return sorted(nodes, key=lambda x: (x.last_access, self._depth(x), x.id))

    def evict_swa(self, pages: int) -> int:
        """Free at least `pages` SWA pages if the cache can: tombstone unlocked inner nodes,
        evict unlocked leaves whole, least recently used first. Returns SWA pages freed."""
        if self.disable or self.window is None or pages <= 0:
            return 0
        ps, freed = self.page_size, 0
        cands = [x for x in self.nodes()
                 if isinstance(x, HybridNode) and not x.tomb and x.swa_lock == 0]
        for x in self._lru_order(cands):
            if freed >= pages:
                break
            if not self._attached(x) or x.tomb:
                continue
            if x.children or x.lock_ref:
                freed += self.pool.free_swa(self._pages(x))
                x.tomb = True
            else:
                parent = x.parent
                freed += len(x.key) // ps
                self._delete_leaf(x)
                assert parent is not None
                self._drop_dead_leaves(parent)
        return freed

    def evict_states(self, slots: int) -> int:
        """Free at least `slots` cached states if the cache can: an inner or locked node
        loses its state, an unlocked leaf is evicted whole (SGLang evict_mamba), least
        recently used first. Returns states freed."""
        if self.disable or self.states is None or slots <= 0:
            return 0
        freed = 0
        cands = [x for x in self.nodes()
                 if isinstance(x, HybridNode) and x.state >= 0 and x.state_lock == 0]
        for x in self._lru_order(cands):
            if freed >= slots:
                break
            if not self._attached(x) or x.state < 0:
                continue
            freed += 1
            if x.children or x.lock_ref:
                self.states.free(x.state)
                x.state = STATE_EVICTED
            else:
                parent = x.parent
                self._delete_leaf(x)
                assert parent is not None
                self._drop_dead_leaves(parent)
        return freed

    # -- sizes and checks --------------------------------------------------------------------
    def swa_sizes(self) -> tuple[int, int]:
        """(evictable, protected) SWA tokens the tree holds."""
        ev = pr = 0
        for x in self.nodes():
            assert isinstance(x, HybridNode)
            if not x.tomb and self.window is not None:
                if x.swa_lock:
                    pr += len(x.key)
                else:
                    ev += len(x.key)
        return ev, pr

    def state_sizes(self) -> tuple[int, int]:
        """(evictable, protected) states the tree holds."""
        ev = pr = 0
        for x in self.nodes():
            assert isinstance(x, HybridNode)
            if x.state >= 0:
                if x.state_lock:
                    pr += 1
                else:
                    ev += 1
        return ev, pr

    def node_states(self) -> list[int]:
        return [x.state for x in self.nodes() if isinstance(x, HybridNode) and x.state >= 0]

    def check_locks(self, locks: list[HybridLock]) -> None:
        """SWA and state lock counts equal what the live `locks` took (recomputed)."""
        swa: dict[int, int] = {}
        st: dict[int, int] = {}
        for lk in locks:
            if lk.state:
                st[lk.node.id] = st.get(lk.node.id, 0) + 1
            if self.window is None or self.disable:
                continue
            n: TreeNode = lk.node
            while n is not self.root:
                assert isinstance(n, HybridNode)
                swa[n.id] = swa.get(n.id, 0) + 1
                if lk.swa_uuid and n.swa_uuid == lk.swa_uuid:
                    break
                parent = n.parent
                assert parent is not None
                n = parent
        for x in self.nodes():
            assert isinstance(x, HybridNode)
            if x.swa_lock != swa.get(x.id, 0) or x.state_lock != st.get(x.id, 0):
                raise InvariantError(f"{x!r}: swa_lock {x.swa_lock} / state_lock "
                                     f"{x.state_lock} != live locks {swa.get(x.id, 0)} / "
                                     f"{st.get(x.id, 0)}")

    def check_invariants(self) -> None:
        super().check_invariants()
        states = []
        for x in self.nodes():
            assert isinstance(x, HybridNode)
            if x.swa_lock < 0 or x.state_lock < 0:
                raise InvariantError(f"{x!r}: negative SWA / state lock")
            if self.window is not None:
                has = self.pool.has_swa(self._pages(x))
                if x.tomb and (has.any() or not x.children or x.swa_lock):
                    raise InvariantError(f"{x!r}: a tombstone with SWA pages, a lock or no "
                                         "children")
                if not x.tomb and not has.all():
                    raise InvariantError(f"{x!r}: a live node lost SWA pages")
            elif x.tomb:
                raise InvariantError(f"{x!r}: a tombstone without SWA layers")
            if x.state >= 0:
                states.append(x.state)
            elif x.state_lock:
                raise InvariantError(f"{x!r}: a state lock without a state")
        if states:
            if self.states is None:
                raise InvariantError("a node holds a state without a state pool")
            if len(set(states)) != len(states):
                raise InvariantError("a state slot is held by two nodes")
            in_use = set(self.states.in_use().tolist())
            if not set(states) <= in_use:
                raise InvariantError("a node's state slot is free")
