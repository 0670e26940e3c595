"""`SlidingWindow`: the sliding-window (or chunked local) attention pool kind of SGLang's manager.

The pool is kvcore/sglang/swa_pool.py's `SWAPagePool` (every full page allocated with an SWA
page); this kind keeps what the radix cache and the running requests add to it, after SGLang
v0.5's `SWARadixCache` (python/sglang/srt/mem_cache/swa_radix_cache.py) and the scheduler's
SWA frees:

* **Tombstones.** A node's SWA KV can be freed while its full KV stays (a tombstone): the SWA
  pool is smaller than the full pool, and only a request's last window needs SWA KV. SWA
  eviction (`evict`) takes unlocked non-tombstone nodes least recently used first (at equal
  use, the nodes nearer the root first: SGLang resets a matched path so that parents are older
  than their children): an inner node is tombstoned, a leaf is evicted whole. Leaves are never
  tombstones: one left by an eviction below it is deleted at once (`dead`).
* **Window locks.** A request locks full KV on its whole path but SWA KV only on the nodes that
  hold its last `window` tokens; the node where the window is reached carries a uuid that the
  unlock walk stops at (SGLang's `swa_uuid_for_lock`; a split hands it to the upper part,
  which is then the boundary).
* **Match rule.** A prefix can be reused only if its last `window` tokens have SWA KV, or if no
  node on its path is a tombstone (SGLang `_match_prefix_helper`, "match_len_since_tombstone >=
  sliding_window_size"). In the reuse accounting every cut of this rule is the window's
  (sliding-window eviction), a tombstone's too: SWA KV is kept only for the windows the pool
  has room for, by design of the rule (`rule_walker` is `walker`).
* **Inserts.** Tokens whose SWA KV a request already freed go in as a tombstone; an existing
  tombstone whose tokens the request still has SWA KV for is revived with the request's SWA
  pages (SGLang's insert with `swa_evicted_seqlen`).
* **Out of the window** (managers/schedule_batch.py, `ScheduleBatch._evict_swa`, the form
  `max(swa_evicted_seqlen, pre_len - sliding_window_size)` floored to whole pages and never
  below `cache_protected_len`, from `prepare_for_decode`): a decoding request frees the SWA
  pages of its private tokens that left the window, once every `window` decode steps
  (`decode_batch_idx % sliding_window_size == 1`: the first decode step, then every window;
  here `(steps - 1) % window == 0`, the same for windows > 1). With the radix cache nothing is
  freed during prefill (the tree owns a prefilled prefix and tombstones it under SWA
  pressure); without it (`paged-nocache`, SGLang's chunk cache) each prefill chunk frees what
  precedes its window. These frees happen before a decode or chunk allocates and are not
  undone when the allocation then fails (SGLang's order). A running request whose decoding
  freed SWA KV of its own tokens is not cached until it finishes (SGLang caches a running
  request only between prefill chunks, `cache_unfinished_req`, before any such free).
* **Admission budget** (`other_pools`): SGLang v0.5's PrefillAdder budgets a hybrid SWA model
  on the smaller of the two pools (`rem_total_tokens`: min of full and SWA available +
  evictable, managers/schedule_policy.py).

Invariants (`check_invariants`, `check_row`):

    a non-tombstone node's pages all have an SWA page; a tombstone's have none
    no tombstone leaf; a tombstone has no window lock; lock counts equal the live locks'
    a running request has SWA pages exactly on its own pages at or past `evicted`, and on
    every page of its last window
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvcore.contract.capabilities import PoolUsage
from kvcore.contract.req_to_token_pool import ReqToTokenPool
from kvcore.contract.validation import InvariantError, positive_int
from kvcore.sglang.node import TreeNode
from kvcore.sglang.pool_kind import PoolKind, side_lru
from kvcore.sglang.radix_cache import RadixCache, Walker
from kvcore.sglang.swa_pool import SWAPagePool

__all__ = ["SlidingWindow"]


class SlidingWindow(PoolKind):
    """SWA KV of a `window`-token window in `pool`; `kind` "swa" or "chunked" (the pool's name
    in `pool_usage`); `bytes_per_token` of the windowed layers."""

    rule = "window"  # a tombstone (SWA KV evicted under the pool's pressure) cuts by the rule

    def __init__(self, kind: str, window: int, pool: SWAPagePool, bytes_per_token: int) -> None:
        self.kind = kind
        self.window = positive_int("sliding window", window)
        self.pool = pool
        self.page_size = pool.page_size
        self.bytes_per_token = bytes_per_token
        self.tombs: set[TreeNode] = set()
        self.tomb_tokens = 0
        self.locks: dict[TreeNode, int] = {}  # node -> window locks on it
        self.locked_tokens = 0  # tokens of the nodes with a window lock
        self.uuids: dict[TreeNode, int] = {}  # lock boundaries
        self.next_uuid = 0

    def attach(self, tree: RadixCache, table: ReqToTokenPool) -> None:
        super().attach(tree, table)
        rows = table.size + 1
        self.evicted = np.zeros(rows, dtype=np.int64)  # own tokens [cached, evicted): no SWA
        self.decodes = np.zeros(rows, dtype=np.int64)  # decode steps taken
        self.boundary = np.zeros(rows, dtype=np.int64)  # the uuid its window lock stops at

    # -- sizes -----------------------------------------------------------------------------
    def sizes(self) -> tuple[int, int]:
        """(evictable, protected) SWA tokens the tree holds."""
        held = self.tree.total_size() - self.tomb_tokens
        return held - self.locked_tokens, self.locked_tokens

    def _pages(self, node: TreeNode) -> np.ndarray:
        """The node's full pages (its values are whole pages)."""
        slots = node.host if node.host is not None else node.value.cpu().numpy()
        return slots[:: self.page_size] // self.page_size

    def _row_pages(self, row: int, start: int, end: int) -> np.ndarray:
        """Full pages behind positions [start, end) of a row (`start` page-aligned)."""
        ps = self.page_size
        return self.table.read_at(row, slice(start, end, ps)).astype(np.int64) // ps

    def _tombstone(self, node: TreeNode) -> None:
        self.tombs.add(node)
        self.tomb_tokens += len(node.key)

    def _revive(self, node: TreeNode) -> None:
        self.tombs.discard(node)
        self.tomb_tokens -= len(node.key)

    # -- the tree's hooks ----------------------------------------------------------------------
    def walker(self) -> Walker:
        since = 1 << 62  # tokens matched since the last tombstone
        window, tombs = self.window, self.tombs

        def accept(node: TreeNode, matched: int, whole: bool) -> bool:
            nonlocal since
            since = 0 if node in tombs else since + matched
            return since >= window

        return accept

    def split(self, upper: TreeNode, lower: TreeNode) -> None:
        if lower in self.tombs:
            self.tombs.add(upper)
        locks = self.locks.get(lower)
        if locks:
            self.locks[upper] = locks
        uuid = self.uuids.pop(lower, 0)
        if uuid:
            self.uuids[upper] = uuid

    def removed(self, leaf: TreeNode) -> None:
        if leaf in self.tombs:
            self._revive(leaf)
        self.uuids.pop(leaf, None)

    def dead(self, leaf: TreeNode) -> bool:
        return leaf in self.tombs

    # -- SWA eviction ----------------------------------------------------------------------------
    def evict(self, pages: int) -> int:
        """Free at least `pages` SWA pages if the cache can: tombstone unlocked inner nodes,
        evict unlocked leaves whole, least recently used first. Returns SWA pages freed."""
        tree = self.tree
        if tree.disable or pages <= 0:
            return 0
        freed = 0
        cands = [x for x in tree.nodes() if x not in self.tombs and x not in self.locks]
        for x in side_lru(cands):
            if freed >= pages:
                break
            if not tree.attached(x) or x in self.tombs:
                continue
            if x.children or x.lock_ref:
                freed += self.pool.free_swa(self._pages(x))
                self._tombstone(x)
            else:
                parent = x.parent
                assert parent is not None
                freed += len(x.key) // self.page_size
                tree.delete_leaf(x)
                tree.drop_dead_leaves(parent)
        return freed

    # -- the manager's hooks -------------------------------------------------------------------
    def lock(self, row: int, node: TreeNode) -> None:
        uuid = 0
        if not self.tree.disable:
            acc, cur, root = 0, node, self.tree.root
            while cur is not root and acc < self.window:
                if cur in self.tombs:
                    raise InvariantError(f"{cur!r}: SWA lock on a tombstone within the window")
                held = self.locks.get(cur, 0)
                if not held:
                    self.locked_tokens += len(cur.key)
                self.locks[cur] = held + 1
                acc += len(cur.key)
                if acc >= self.window:
                    uuid = self.uuids.get(cur, 0)
                    if not uuid:
                        self.next_uuid += 1
                        uuid = self.uuids[cur] = self.next_uuid
                parent = cur.parent
                assert parent is not None
                cur = parent
        self.boundary[row] = uuid

    def unlock(self, row: int, node: TreeNode) -> None:
        if self.tree.disable:
            return
        uuid, root, n = int(self.boundary[row]), self.tree.root, node
        while n is not root:
            held = self.locks[n] - 1
            if held:
                self.locks[n] = held
            else:
                del self.locks[n]
                self.locked_tokens -= len(n.key)
            if uuid and self.uuids.get(n, 0) == uuid:
                break
            parent = n.parent
            assert parent is not None
            n = parent

    def admit(self, row: int, node: TreeNode, hit: int) -> bool:
        self.evicted[row] = hit
        self.decodes[row] = 0
        return True

    def _leave_window(self, row: int, pre_len: int, cached: int) -> None:
        """SGLang `_evict_swa(req, pre_len)`: free the SWA pages of the request's own tokens
        before `pre_len - window`, in whole pages, never below what the tree owns."""
        ev = max(int(self.evicted[row]), cached)
        new = max(ev, pre_len - self.window) // self.page_size * self.page_size
        if new > ev:
            self.pool.free_swa(self._row_pages(row, ev, new))
        self.evicted[row] = max(new, ev)

    def before_extend(self, rows: Sequence[int] | np.ndarray, written: Sequence[int] | np.ndarray,
                      cached: Sequence[int] | np.ndarray) -> None:
        if self.tree.disable:  # the chunk cache: a chunk frees what precedes its window
            for row, w, c in zip(rows, written, cached, strict=True):
                self._leave_window(int(row), int(w), int(c))

    def before_decode(self, rows: np.ndarray, written: np.ndarray, cached: np.ndarray) -> None:
        steps = self.decodes[rows] + 1
        self.decodes[rows] = steps
        for i in np.flatnonzero((steps - 1) % self.window == 0).tolist():
            self._leave_window(int(rows[i]), int(written[i]), int(cached[i]))

    def make_room(self, pages: int) -> None:
        pool = self.pool
        if 0 < pages <= pool.free_page_count() and pool.swa_free_pages() < pages:
            self.evict(pages - pool.swa_free_pages())

    def may_cache(self, row: int, cached: int) -> bool:
        return int(self.evicted[row]) <= cached

    def keeps(self, row: int, end: int) -> bool:
        return int(self.evicted[row]) < end  # else the whole insert would be a tombstone leaf

    def inserted(self, row: int, node: TreeNode, cached: int, dup: int, end: int) -> None:
        ps, gone = self.page_size, int(self.evicted[row])
        if dup < end and gone > dup:  # the new leaf starts without SWA KV: a tombstone
            upper = self.tree.split(node, gone - dup)
            if self.pool.has_swa(self._pages(upper)).any():
                raise InvariantError("a tombstone part of an insert still has SWA pages")
            self._tombstone(upper)
        lo, stop = max(cached, gone), end
        for p in node.path_to_root():  # revive tombstones the request has SWA KV for
            start = stop - len(p.key)
            if p in self.tombs and start >= lo and stop <= dup:
                mine = self.table.read_at(row, slice(start, stop, ps)).astype(np.int64) // ps
                self.pool.move_swa(mine, self._pages(p))
                self._revive(p)
            stop = start

    def cached_to(self, row: int, end: int) -> None:
        self.evicted[row] = max(int(self.evicted[row]), end)

    def drop(self, row: int) -> None:
        self.evicted[row] = self.decodes[row] = self.boundary[row] = 0

    # -- observation ---------------------------------------------------------------------------
    def other_pools(self, available: int) -> int:
        """What the full pool has beyond the SWA pool (the SWA tree walk only when the SWA
        pool's free pages alone fall short)."""
        swa = self.pool.swa_free_pages() * self.page_size
        if swa < available:
            swa += self.sizes()[0]
        return max(available - swa, 0)

    def usage(self, hit: int, queried: int) -> PoolUsage:
        tokens, bpt = self.page_size, self.bytes_per_token
        return PoolUsage(self.kind, self.pool.swa.num_pages * tokens * bpt,
                         self.pool.swa_used_pages() * tokens * bpt, self.sizes()[0] * bpt,
                         hit, queried)

    def check_row(self, rid: int, row: int, written: int, cached: int,
                  slots: np.ndarray) -> None:
        ps, ev = self.page_size, int(self.evicted[row])
        if ev % ps:
            raise InvariantError(f"request {rid}: swa_evicted {ev} is not page-aligned")
        own = slots[cached::ps] // ps
        if (self.pool.has_swa(own) != (np.arange(cached, written, ps) >= ev)).any():
            raise InvariantError(f"request {rid}: SWA pages disagree with swa_evicted {ev}")
        lo = max(0, written - self.window)
        if not self.pool.has_swa(slots[lo:written] // ps).all():
            raise InvariantError(f"request {rid}: a freed SWA page is in its window "
                                 f"[{lo}, {written})")

    def check_invariants(self, holders: list[tuple[int, TreeNode]]) -> None:
        nodes = self.tree.nodes()
        on_tree = set(nodes)
        if not (self.tombs <= on_tree and set(self.locks) <= on_tree
                and set(self.uuids) <= on_tree):
            raise InvariantError("SWA data kept for a node no longer in the tree")
        for x in nodes:
            has = self.pool.has_swa(self._pages(x))
            if x in self.tombs and (has.any() or not x.children or x in self.locks):
                raise InvariantError(f"{x!r}: a tombstone with SWA pages, a lock or no children")
            if x not in self.tombs and not has.all():
                raise InvariantError(f"{x!r}: a live node lost SWA pages")
        tombs = sum(len(x.key) for x in self.tombs)
        locked = sum(len(x.key) for x in self.locks)
        if (tombs, locked) != (self.tomb_tokens, self.locked_tokens):
            raise InvariantError(f"SWA counters (tombstones, locked) {self.tomb_tokens}, "
                                 f"{self.locked_tokens} != recounted {tombs}, {locked}")
        want: dict[TreeNode, int] = {}
        if not self.tree.disable:
            for row, node in holders:
                uuid, n = int(self.boundary[row]), node
                while n is not self.tree.root:
                    want[n] = want.get(n, 0) + 1
                    if uuid and self.uuids.get(n, 0) == uuid:
                        break
                    parent = n.parent
                    assert parent is not None
                    n = parent
        if want != self.locks:
            raise InvariantError("window lock counts differ from the running requests' locks")
