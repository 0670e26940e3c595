"""The block pool's prefix index: for a prompt's block hash chain, the oldest live holder of
each block, kept per cached run of blocks rather than per block.

vLLM indexes every full block by its hash (a dict of hash -> blocks). At page size 1 every
token is a block, so a per-block index pays one random access into a table far larger than
the caches for every prompt token cached and every one evicted: most of the `vllm` policy's
time at page 1, where `paged`'s radix tree stores a prompt as one array. This index keeps
what a caching call hands over as it is, a *segment*: a run of blocks whose hashes form a
chain (each block's parent is the one before it), and does per-block work only in small
per-block arrays.

Why a segment index gives exactly the per-block answer. The holder of chain position i is
the oldest live block whose hash is chain[i]. A block at offset o of a segment has the hash
of the entry before it as its parent, so if its hash (with its parent and tokens: the pool
checks the key) matches chain[i], the segment's entry o-1 matches chain[i-1], and so on down
to its first entry, which matches chain[i-o]: every holder of a chain position lies in a
segment that *starts* on the chain. A lookup therefore tests only the segments' first hashes,
and for each segment found compares its hash array with the chain's
(one vectorised comparison, as the radix tree compares token arrays) to see how far it
covers it. Among the live entries covering a position, the oldest segment's wins: vLLM's
oldest-holder rule, with blocks of later cachings (duplicates) behind it. A segment records
the chain position of its first block, so finding the segments that start on a chain is one
vectorised test of every live segment's first hash against the chain at that position.

* Removal is lazy: a block is live while its generation (`gen`, its segment's id) is set; an
  eviction writes 0 there and counts the segment down. A segment with no live block leaves
  the index; segments whose dead tail grows are trimmed when the arrays held pass a bound.
* Holders of one hash, for tests and debugging, come from the pool's per-block arrays.

tests/kvcore/test_chain_index.py checks the pool with this index against a per-block model
of vLLM's pool (a list as the free queue, a dict of hash -> blocks) on random streams that
make duplicates, holes and hash collisions.
"""

from __future__ import annotations

import numpy as np

from kvcore.validation import InvariantError

_U64 = np.uint64
_NO_BLOCKS = np.zeros(0, dtype=np.int64)


class Segment:
    """One caching call's blocks (a hash chain), its id (`gen`) and how many still live."""

    __slots__ = ("blocks", "gen", "hashes", "live", "slot", "start")

    def __init__(self, blocks: np.ndarray, hashes: np.ndarray, gen: int, start: int) -> None:
        self.blocks = blocks
        self.hashes = hashes
        self.gen = gen
        self.start = start  # chain position of its first block
        self.live = len(blocks)
        self.slot = -1  # its row in the index's per-segment arrays

    def cover(self, chain: np.ndarray, start: int, gen: np.ndarray) -> tuple[int, np.ndarray]:
        """How far this segment, starting at chain position `start`, follows `chain` (m
        entries), and the mask of its live entries among those m."""
        k = min(len(self.hashes), len(chain) - start)
        if k <= 0:
            return 0, np.zeros(0, dtype=bool)
        eq = self.hashes[:k] == chain[start : start + k]
        m = k if eq.all() else int(eq.argmin())
        return m, gen[self.blocks[:m]] == self.gen


class ChainIndex:
    """Segments of cached blocks, found by their first hash; lookups along a hash chain."""

    def __init__(self, num_blocks: int) -> None:
        nb = num_blocks + 1  # block 0 (the null block) is never indexed
        self.gen = np.zeros(nb, dtype=np.int64)  # per block: its segment's id, 0 = none
        self.num_live = 0  # indexed blocks
        self.segments: dict[int, Segment] = {}  # live segments by id
        self._last_gen = 0
        self._held = 0  # entries the live segments' arrays hold, live or dead
        self._trim_at = 4 * nb + 1024
        # one row per live segment (rows 0..len(segments)-1): its first block's chain
        # position and hash, and its id; a lookup tests every row against the chain at once
        self._pos = np.zeros(64, dtype=np.int64)
        self._first = np.zeros(64, dtype=_U64)
        self._ids = np.zeros(64, dtype=np.int64)

    # -- changes ---------------------------------------------------------------------------
    def insert(self, blocks: np.ndarray, hashes: np.ndarray, start: int) -> None:
        """Index `blocks` (distinct, unindexed) under `hashes` (uint64), a chain whose first
        block is at chain position `start` (block i's parent is block i-1). They form one
        segment, younger than every segment before."""
        if not len(blocks):
            return
        self._last_gen += 1
        g = self._last_gen
        self.gen[blocks] = g
        seg = Segment(np.array(blocks, dtype=np.int64), np.array(hashes, dtype=_U64), g, start)
        self.segments[g] = seg
        row = len(self.segments) - 1
        if row == len(self._ids):
            self._pos, self._first, self._ids = (np.concatenate([a, np.zeros_like(a)]) for a in
                                                 (self._pos, self._first, self._ids))
        self._pos[row], self._first[row], self._ids[row] = start, seg.hashes[0], g
        seg.slot = row
        self.num_live += len(blocks)
        self._held += len(blocks)
        if self._held > self._trim_at:
            self._trim()

    def remove(self, blocks: np.ndarray) -> None:
        """Unindex `blocks` (distinct, indexed); a segment left with no live block goes."""
        if not len(blocks):
            return
        gens = self.gen[blocks]
        self.gen[blocks] = 0
        self.num_live -= len(blocks)
        ids, counts = np.unique(gens, return_counts=True)
        for g, c in zip(ids.tolist(), counts.tolist(), strict=True):
            seg = self.segments[g]
            seg.live -= c
            if not seg.live:
                self._drop(seg)

    def _drop(self, seg: Segment) -> None:
        """A segment leaves: the last row moves into its row."""
        del self.segments[seg.gen]
        self._held -= len(seg.blocks)
        last, row = len(self.segments), seg.slot
        if row != last:
            moved = self.segments[int(self._ids[last])]
            self._pos[row], self._first[row], self._ids[row] = (
                self._pos[last], self._first[last], self._ids[last])
            moved.slot = row

    def _trim(self) -> None:
        """Cut every segment after its last live entry (evictions take a chain's tail
        first, so this returns most of what dead entries hold)."""
        held = 0
        for seg in self.segments.values():
            live = np.flatnonzero(self.gen[seg.blocks] == seg.gen)
            end = int(live[-1]) + 1
            if end < len(seg.blocks):
                seg.blocks, seg.hashes = seg.blocks[:end].copy(), seg.hashes[:end].copy()
            held += end
        self._held = held
        self._trim_at = max(self._trim_at, 2 * held)

    # -- lookups ---------------------------------------------------------------------------
    @property
    def newest(self) -> int:
        """Id of the latest segment so far (0: none yet): segments after it are newer."""
        return self._last_gen

    def _on(self, chain: np.ndarray) -> np.ndarray:
        """Ids of the live segments that start on `chain` (their first hash is the chain's at
        their first block's position)."""
        n, rows = len(chain), len(self.segments)
        pos = self._pos[:rows]
        on = (pos < n) & (chain[np.minimum(pos, n - 1)] == self._first[:rows])
        return self._ids[:rows][on]

    def segments_on(self, chain: np.ndarray) -> list[Segment]:
        """The live segments that start on `chain`, youngest first."""
        return [self.segments[g] for g in np.sort(self._on(chain))[::-1].tolist()]

    def any_on_since(self, chain: np.ndarray, newest: int) -> bool:
        """Whether a segment newer than `newest` starts on `chain`."""
        return bool((self._on(chain) > newest).any())

    def walk(self, chain: np.ndarray) -> tuple[np.ndarray, list[Segment]]:
        """The oldest live holder of each position of `chain` (uint64 hashes from the first
        block), up to the first position with none; and the segments on the chain (for a
        caller that must look past a holder whose key differs)."""
        n = len(chain)
        if not n or not self.num_live:
            return _NO_BLOCKS, []
        found = self.segments_on(chain)
        best = np.zeros(n, dtype=np.int64)
        for seg in found:  # youngest first: the oldest writes last
            m, live = seg.cover(chain, seg.start, self.gen)
            if m:
                view = best[seg.start : seg.start + m]
                view[live] = seg.blocks[:m][live]
        miss = np.flatnonzero(best == 0)
        return (best[: int(miss[0])] if len(miss) else best), found

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self, block_hash: np.ndarray, parent_hash: np.ndarray) -> None:
        """Each live segment is a chain of the hashes its blocks carry (`block_hash`,
        `parent_hash`: the pool's per-block arrays), its live count is right, every indexed
        block is a live entry of its segment, and the start index lists the live segments."""
        live_total = 0
        for g, seg in self.segments.items():
            b, h = seg.blocks, seg.hashes
            if seg.gen != g or len(b) != len(h) or not len(b):
                raise InvariantError(f"vllm: chain index segment {g} is malformed")
            live = self.gen[b] == g
            if int(np.count_nonzero(live)) != seg.live or not seg.live:
                raise InvariantError(f"vllm: chain index segment {g} live count is wrong")
            if not np.array_equal(block_hash[b[live]], h[live]):
                raise InvariantError(f"vllm: a block of segment {g} carries another hash")
            inner = live[1:]
            if not np.array_equal(parent_hash[b[1:][inner]], h[:-1][inner]):
                raise InvariantError(f"vllm: segment {g} is not a hash chain")
            live_total += seg.live
        if live_total != self.num_live or int(np.count_nonzero(self.gen)) != self.num_live:
            raise InvariantError("vllm: chain index live count out of sync")
        if self.gen[0] or not set(np.unique(self.gen[self.gen > 0]).tolist()) <= set(
                self.segments):
            raise InvariantError("vllm: a block belongs to no live segment")
        rows = len(self.segments)
        for row in range(rows):
            at = self.segments.get(int(self._ids[row]))
            if at is None or at.slot != row or self._pos[row] != at.start or \
                    self._first[row] != at.hashes[0]:
                raise InvariantError(f"vllm: chain index row {row} out of sync")
