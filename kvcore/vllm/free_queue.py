"""vLLM's free block queue: free blocks in eviction order (vllm/v1/core/kv_cache_utils.py
`FreeKVCacheBlockQueue`, v0.11; a re-implementation under the same name, not a copy).

vLLM links its free blocks into a doubly linked list: pop from the head, append at the tail,
remove from anywhere (a cache hit on an idle block). Here the list is an array of block ids
in queue order with tombstones, so a request's thousands of blocks (at page size 1 every
token is a block) are popped, appended or removed in a few numpy operations instead of one
Python step each; the order is exactly the linked list's.

* `_q[_head:_tail]` holds the queue with 0 for removed entries (block 0, the null block, is
  never queued); the array is compacted when an append reaches its end. Entries below the
  head are never read.
* `positions[b]` is b's index in `_q` while b is queued. Only `remove_n` reads positions, so
  they are written lazily: an append leaves them unwritten past `_settled` and the next
  removal writes those of the blocks still queued then (`settle`). Taking a block out
  writes only its queue entry: the pool knows membership from the ref count (queued <=>
  no holder), so a stale position is never read.
* Every tombstone of the window lies in [`_tomb_lo`, `_tomb_hi`), so a pop outside that range
  takes a plain slice without looking for them.
"""

from __future__ import annotations

import numpy as np

from kvcore.contract.validation import InvariantError

_EMPTY = np.zeros(0, dtype=np.int64)


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: pop from the head, append at the tail, remove anywhere.
    Initially blocks 1..n-1 in id order."""

    def __init__(self, num_blocks: int) -> None:
        n = num_blocks  # including the null block 0, which is never queued
        self._q = np.zeros(2 * n + 16, dtype=np.int64)
        self._q[: n - 1] = np.arange(1, n)
        # int32: a queue index is below 2n + 16, and the array is read and written at random
        # per block, so half the bytes of int64 keep more of it in the caches
        self.positions = np.full(n, -1, dtype=np.int32)
        self.positions[1:] = np.arange(n - 1)
        self._head, self._tail = 0, n - 1
        # queue indices below this hold blocks whose `positions` are written
        self._settled = n - 1
        self.num_free_blocks = n - 1
        self._tomb_lo = self._tomb_hi = 0

    def _find(self, m: int) -> np.ndarray:
        """Queue indices of the first m queued blocks (m <= num_free_blocks)."""
        q, h, t = self._q, self._head, self._tail
        size = m + 64
        while True:
            e = min(h + size, t)
            idx = np.flatnonzero(q[h:e])
            if len(idx) >= m or e == t:
                return idx[:m] + h
            size *= 4

    def peek_n(self, m: int) -> np.ndarray:
        """The next m blocks a pop would return, head first."""
        return self._q[self._find(m)] if m else _EMPTY

    def popleft_n(self, m: int) -> np.ndarray:
        """Take m blocks off the head (m <= num_free_blocks)."""
        if not m:
            return _EMPTY
        q, h = self._q, self._head
        end = h + m
        if end <= self._tail and (end <= self._tomb_lo or h >= self._tomb_hi):  # no 0 there
            blocks = q[h:end].copy()  # (a copy: callers keep it, the queue reuses its array)
            self._head = end
        else:
            pos = self._find(m)
            blocks = q[pos]
            self._head = int(pos[-1]) + 1
        self.num_free_blocks -= m
        return blocks

    def remove_n(self, blocks: np.ndarray) -> None:
        """Take queued `blocks` out wherever they are (a cache hit on an idle block)."""
        if not len(blocks):
            return
        self.settle()
        pos = self.positions[blocks]
        self._q[pos] = 0
        lo, hi = int(pos.min()), int(pos.max()) + 1
        if self._tomb_hi > self._head:  # (else every earlier tombstone is below the head)
            lo, hi = min(lo, self._tomb_lo), max(hi, self._tomb_hi)
        self._tomb_lo, self._tomb_hi = lo, hi
        self.num_free_blocks -= len(blocks)

    def settle(self) -> None:
        """Write the positions of the queued blocks appended since the last settle."""
        s, t = max(self._settled, self._head), self._tail
        if s < t:
            self.positions[self._q[s:t]] = np.arange(s, t, dtype=np.int32)
            self.positions[0] = -1  # (removed entries are 0s: block 0 is never queued)
        self._settled = t

    def append_n(self, blocks: np.ndarray) -> None:
        """Queue `blocks` at the tail, in the given order."""
        k = len(blocks)
        if not k:
            return
        if self._tail + k > len(self._q):  # compact: live entries to the front
            live = self._q[self._head : self._tail]
            live = live[live != 0]
            n = len(live)
            if n + k > len(self._q):
                self._q = np.zeros(2 * (n + k) + 16, dtype=np.int64)
            self._q[:n] = live
            self._q[n:] = 0
            self._head, self._tail = 0, n
            self._settled = 0  # every position moved: written at the next settle
            self._tomb_lo = self._tomb_hi = 0  # no tombstone left
        t = self._tail
        self._q[t : t + k] = blocks
        self._tail = t + k
        self.num_free_blocks += k

    def queued(self) -> np.ndarray:
        """Mask over block ids: which blocks the queue holds (a scan of the window: checks)."""
        mask = np.zeros(len(self.positions), dtype=bool)
        live = self._q[self._head : self._tail]
        mask[live[live != 0]] = True
        mask[0] = False
        return mask

    def check_invariants(self, settled: bool = False) -> None:
        """The window holds each queued block once, every tombstone lies in the range a pop
        avoids, and `positions` points at each block written so far (`settled`: at every
        block, as after `settle`)."""
        q, h, t = self._q, self._head, self._tail
        if not 0 <= h <= t <= len(q) or q[t:].any():
            raise InvariantError("vllm: free queue holds blocks outside its head..tail window")
        tombs = np.flatnonzero(q[h:t] == 0) + h
        if len(tombs) and not self._tomb_lo <= tombs[0] <= tombs[-1] < self._tomb_hi:
            raise InvariantError("vllm: free queue tombstone outside its recorded range")
        live_pos = np.flatnonzero(q[h:t]) + h
        live = q[live_pos]
        n = len(self.positions)
        if ((live < 1) | (live >= n)).any() or len(np.unique(live)) != len(live):
            raise InvariantError("vllm: free queue has a bad or repeated block")
        if len(live) != self.num_free_blocks:
            raise InvariantError("vllm: free queue length out of sync")
        if not 0 <= self._settled <= t or (settled and self._settled != t):
            raise InvariantError("vllm: free queue settled mark outside the window")
        if self.positions[0] != -1:
            raise InvariantError("vllm: free queue gives the null block a position")
        written = live_pos < self._settled  # (the rest are written at the next settle)
        if not np.array_equal(self.positions[live[written]], live_pos[written]):
            raise InvariantError("vllm: free queue positions out of sync")


__all__ = ["FreeKVCacheBlockQueue"]
