"""The block pool's prefix index: for a prompt's block hash chain, the oldest live holder of
each block, kept per cached run of blocks rather than per block.

vLLM indexes every full block by its hash (a dict of hash -> blocks). At page size 1 every
token is a block, so a per-block index pays one random access into a table far larger than
the caches for every prompt token cached and every one evicted: most of the `vllm` policy's
time at page 1, where `paged`'s radix tree stores a prompt as one array. This index keeps
runs of blocks whole, as *segments*: a run whose hashes form a chain (each block's parent is
the one before it), and does per-block work only in small per-block arrays.

Why a segment index gives exactly the per-block answer. The holder of chain position i is
the oldest live block whose hash is chain[i]. A block at offset o of a segment has the hash
of the entry before it as its parent, so if its hash (with its parent and tokens: the pool
checks the key) matches chain[i], the segment's entry o-1 matches chain[i-1], and so on down
to its first entry, which matches chain[i-o]: every holder of a chain position lies in a
segment that *starts* on the chain. A lookup therefore tests only the segments' first hashes,
and for each segment found compares its hash array with the chain's (one vectorised
comparison, as the radix tree compares token arrays) to see how far it covers it. Among the
live entries covering a position, the one with the oldest generation (the caching that
indexed it) wins: vLLM's oldest-holder rule, with blocks of later cachings (duplicates)
behind it. A segment records the chain position of its
first block, so finding the segments that start on a chain is one vectorised test of every
live segment's first hash against the chain at that position.

* A caching call that continues a segment extends it rather than starting one: the newest
  segment's chain, or the segment that ends with the block before the new ones in the
  caller's block table (a request's next prefill chunk, even when other requests' chunks
  were cached in between: small interleaved chunks). A prompt cached in chunks is then one
  segment to a lookup, not one per chunk. A segment's blocks may then be younger than a
  later segment's, which is why a lookup ranks holders by generation.
* Each block keeps the generation of the caching that indexed it (`gen`, never reused): the
  policy's prompt memo reads it to know a block stayed indexed. A caching's run goes to one
  segment, so a block's segment is its generation's (one small per-generation array).
* Removal is lazy: a block is live while its generation equals its segment entry's; an
  eviction writes 0 there and counts the segment down. A segment with no live block leaves
  the index; segments whose dead tail grows are trimmed when the arrays held pass a bound.
* A lookup starts where the caller's still-valid hit ends (a hit stays the oldest holders
  while its blocks stay indexed) and reads the chain in windows, stopping at the first
  window with a miss: it pays for the hit it finds, not for the whole prompt.
* A group whose hit is not a prefix (a sliding window, a Mamba state) asks for the holders
  of every position (`holders`): each segment on the chain is compared once.
* Holders of one hash, for tests and debugging, come from the pool's per-block arrays.

tests/kvcore/test_chain_index.py checks the pool with this index against a per-block model
of vLLM's pool (a list as the free queue, a dict of hash -> blocks) on random streams that
make duplicates, holes and hash collisions.
"""

from __future__ import annotations

import numpy as np

from kvcore.contract.validation import InvariantError

_U64 = np.uint64
_NO_BLOCKS = np.zeros(0, dtype=np.int64)
_NEVER = np.iinfo(np.int64).max  # an age older than every generation


def _grown(a: np.ndarray, n: int, size: int) -> np.ndarray:
    """A `size`-entry array of a's dtype whose first n entries are a's (the rest unset: a
    segment reads only its first `n`), without zeroing a tail that is about to be written."""
    out = np.empty(size, dtype=a.dtype)
    out[:n] = a[:n]
    return out


class Segment:
    """A run of cached blocks whose hashes form a chain: its blocks, their hashes and the
    generation each was cached under (arrays grown by doubling, the first `n` entries used),
    the chain position of its first block, its id (`sid`: its age among segments) and how
    many of its blocks still live.

    A caching appends its run by reference (`append_part`: bounds into the caller's block
    and hash arrays, which it never writes again) and the arrays are written when read
    (`_join`): with small prefill chunks every running request's segment takes a run per
    engine iteration, and most are never read before their blocks are evicted (a lookup
    reads only the segments on a waiting prompt's chain)."""

    __slots__ = (
        "_blocks",
        "_gens",
        "_hashes",
        "_joined",
        "last_block",
        "last_hash",
        "live",
        "n",
        "pending",
        "sid",
        "slot",
        "start",
    )

    def __init__(self, sid: int, start: int) -> None:
        self.sid = sid
        self.start = start  # chain position of its first block
        self._blocks = _NO_BLOCKS
        self._hashes = np.zeros(0, dtype=_U64)
        self._gens = _NO_BLOCKS
        self.n = 0
        self._joined = 0  # entries written into the arrays; the rest are `pending` runs
        # (blocks, hashes, lo, hi, gen): entries lo..hi-1 of a caching call's arrays
        self.pending: list[tuple[np.ndarray, np.ndarray, int, int, int]] = []
        self.live = 0
        self.slot = -1  # its row in the index's per-segment arrays
        self.last_block = self.last_hash = 0  # its last entry's block and hash, as ints

    @property
    def blocks(self) -> np.ndarray:
        self._join()
        return self._blocks[: self.n]

    @property
    def hashes(self) -> np.ndarray:
        self._join()
        return self._hashes[: self.n]

    @property
    def gens(self) -> np.ndarray:
        self._join()
        return self._gens[: self.n]

    @property
    def end(self) -> int:
        """The chain position after its last block."""
        return self.start + self.n

    def append(self, blocks: np.ndarray, hashes: np.ndarray, gen: int) -> None:
        """Add a run (non-empty) cached under generation `gen`; `blocks` and `hashes` are
        kept by reference until the next read (the caller never writes them again)."""
        self.append_part(blocks, hashes, 0, len(blocks), gen)

    def append_part(self, every: np.ndarray, hashes: np.ndarray, lo: int, hi: int,
                    gen: int) -> None:
        """`append` of entries lo..hi-1 (lo < hi) of a caching call's arrays, kept as the
        arrays and the bounds: no slice is made until a read joins them."""
        self.pending.append((every, hashes, lo, hi, gen))
        self.n += hi - lo
        self.live += hi - lo
        self.last_block, self.last_hash = every.item(hi - 1), hashes.item(hi - 1)

    def _join(self) -> None:
        """Write the pending runs into the arrays, grown with room for as many entries
        again (a prompt cached whole is followed by its output, a chunk by the next; the
        untouched tail of a fresh array costs nothing)."""
        pend = self.pending
        if not pend:
            return
        j, n = self._joined, self.n
        if n > len(self._blocks):
            size = max(2 * len(self._blocks), 2 * n, 16)
            self._blocks, self._hashes, self._gens = (
                _grown(a, j, size) for a in (self._blocks, self._hashes, self._gens))
        if len(pend) == 1:
            b, h, lo, hi, g = pend[0]
            self._blocks[j:n], self._hashes[j:n], self._gens[j:n] = b[lo:hi], h[lo:hi], g
        else:
            np.concatenate([p[0][p[2] : p[3]] for p in pend], out=self._blocks[j:n])
            np.concatenate([p[1][p[2] : p[3]] for p in pend], out=self._hashes[j:n])
            self._gens[j:n] = np.repeat(np.array([p[4] for p in pend], dtype=np.int64),
                                        [p[3] - p[2] for p in pend])
        pend.clear()
        self._joined = n

    def cut(self, end: int) -> None:
        """Keep the first `end` entries only (the rest are dead), in arrays of their own."""
        self._join()
        self._blocks, self._hashes, self._gens = (
            a[:end].copy() for a in (self._blocks, self._hashes, self._gens))
        self.n = self._joined = end
        self.last_block, self.last_hash = int(self._blocks[end - 1]), int(self._hashes[end - 1])


class ChainIndex:
    """Segments of cached blocks, found by their first hash; lookups along a hash chain."""

    #: positions a walk reads first (then four times more per window); tests set it small
    window = 1024

    def __init__(self, num_blocks: int) -> None:
        nb = num_blocks + 1  # block 0 (the null block) is never indexed
        # per block: the caching it came from (0 = not indexed; never reused, so an unchanged
        # generation means the block stayed indexed in between)
        self.gen = np.zeros(nb, dtype=np.int64)
        # per generation: the segment its run went to (0 for generation 0: not indexed). A
        # caching's run goes to one segment whole, so a block's segment is that of its
        # generation: a removal reads the generations it overwrites (the same cache lines)
        # and this small array, where a per-block segment id would be one more random read
        # per evicted block and one more random write per cached block (`segment_of`)
        self._sid_of_gen = np.zeros(1024, dtype=np.int64)
        self.num_live = 0  # indexed blocks
        self.segments: dict[int, Segment] = {}  # live segments by id
        self._last_gen = 0
        self._newest: Segment | None = None  # the segment made or extended last, if live
        self._last_sid = 0
        self._held = 0  # entries the live segments' arrays hold, live or dead
        self._trim_at = 4 * nb + 1024
        # one row per live segment (rows 0..len(segments)-1): its first block's chain
        # position and hash, and its id; a lookup tests every row against the chain at once
        self._pos = np.zeros(64, dtype=np.int64)
        self._first = np.zeros(64, dtype=_U64)
        self._ids = np.zeros(64, dtype=np.int64)
        self._latest = np.zeros(64, dtype=np.int64)  # the last generation it took blocks in

    # -- changes ---------------------------------------------------------------------------
    def insert(self, blocks: np.ndarray, hashes: np.ndarray, start: int, parent: int,
               after: int = 0) -> None:
        """Index `blocks` (distinct, unindexed) under `hashes` (uint64), a chain whose first
        block is at chain position `start` with parent hash `parent` (block i's parent is
        block i-1). They are younger than every block indexed before. A run that continues
        a segment extends it rather than starting one: the newest segment's chain, or the
        segment whose last block is `after` (the block before `blocks[0]` in the caller's
        block table: a request's next prefill chunk, however many other requests' chunks
        were cached in between). A lookup then meets one segment per request where it met
        one per chunk; ages stay exact because a lookup ranks holders by their generations,
        not by their segments."""
        if len(blocks):  # (copies: a segment keeps a run's arrays, see `insert_runs`)
            self.insert_runs(blocks.copy(), hashes.copy(),
                             [(len(blocks), parent, start, after)])

    def insert_runs(self, every: np.ndarray, hashes: np.ndarray,
                    runs: list[tuple[int, int, int, int]]) -> None:
        """`insert` of several runs in order, each its own caching (generation), with the
        per-block arrays written once for all: an engine iteration's prefill chunks of
        several requests. `every`, `hashes`: the runs' blocks and hashes one after the
        other; `runs`: (length, parent, start, after) of each, none empty, no block twice.
        The segments keep slices of `every` and `hashes` until read (`Segment.append`): the
        caller must not write either array afterwards."""
        g = first = self._last_gen + 1
        sids, lens = [], []
        at = 0
        for k, parent, start, after in runs:
            seg = self._newest
            if seg is None or seg.start + seg.n != start or seg.last_hash != parent:
                seg = self._ending_at(after, start) if after else None
                if seg is None or seg.last_hash != parent:
                    seg = self._new_segment(start, hashes[at])
            seg.append_part(every, hashes, at, at + k, g)
            self._latest[seg.slot] = g
            sids.append(seg.sid)
            lens.append(k)
            at += k
            g += 1
        self._last_gen = g - 1
        if len(runs) == 1:
            self.gen[every] = first
        else:
            self.gen[every] = np.repeat(np.arange(first, g, dtype=np.int64), lens)
        self._map_gens(first, sids)
        self.num_live += at
        self._held += at
        if self._held > self._trim_at:
            self._trim()

    def _new_segment(self, start: int, first_hash: np.uint64) -> Segment:
        """A new segment at chain position `start`, the newest, with its row."""
        self._last_sid += 1
        seg = Segment(self._last_sid, start)
        self.segments[seg.sid] = seg
        row = len(self.segments) - 1
        if row == len(self._ids):
            self._pos, self._first, self._ids, self._latest = (
                np.concatenate([a, np.zeros_like(a)])
                for a in (self._pos, self._first, self._ids, self._latest))
        self._pos[row], self._first[row], self._ids[row] = start, first_hash, seg.sid
        seg.slot = row
        self._newest = seg
        return seg

    def _map_gens(self, first: int, sids: list[int]) -> None:
        """Generations first, first + 1, ... went to the segments `sids`, in order."""
        end = first + len(sids)
        if end > len(self._sid_of_gen):
            self._sid_of_gen = _grown(self._sid_of_gen, first, max(2 * len(self._sid_of_gen),
                                                                   end))
        self._sid_of_gen[first:end] = sids

    def segment_of(self, gens: np.ndarray) -> np.ndarray:
        """Segment ids of blocks indexed under generations `gens` (0 for generation 0)."""
        return self._sid_of_gen[gens]

    def _ending_at(self, block: int, end: int) -> Segment | None:
        """The live segment whose last entry is `block`, still indexed, ending at chain
        position `end`; None if there is none."""
        seg = self.segments.get(self._sid_of_gen.item(self.gen.item(block)))
        if seg is None or seg.start + seg.n != end or seg.last_block != block:
            return None
        return seg

    def remove(self, blocks: np.ndarray) -> None:
        """Unindex `blocks` (distinct, indexed); a segment left with no live block goes."""
        if not len(blocks):
            return
        # their segments through their generations: the write below then meets the cache
        # lines this read brought in
        gens = self.gen[blocks]
        self.gen[blocks] = 0
        sids = self.segment_of(gens)
        k = len(blocks)
        self.num_live -= k
        first = sids.item(0)
        if not np.count_nonzero(sids != first):  # the usual case: one segment's blocks
            pairs: zip[tuple[int, int]] | list[tuple[int, int]] = [(first, k)]
        else:
            # blocks per segment: segment ids are small (one per caching run), so a count
            # over their range is cheaper than np.unique's sort of every evicted block
            lo = int(sids.min())
            span = int(sids.max()) - lo + 1
            if span <= 4 * len(sids) + 4096:
                counts = np.bincount(sids - lo, minlength=span)
                ids = np.flatnonzero(counts)
                pairs = zip((ids + lo).tolist(), counts[ids].tolist(), strict=True)
            else:
                ids, counts = np.unique(sids, return_counts=True)
                pairs = zip(ids.tolist(), counts.tolist(), strict=True)
        for sid, c in pairs:
            seg = self.segments[sid]
            seg.live -= c
            if not seg.live:
                self._drop(seg)

    def _drop(self, seg: Segment) -> None:
        """A segment leaves: the last row moves into its row."""
        del self.segments[seg.sid]
        if seg is self._newest:
            self._newest = None
        self._held -= seg.n
        last, row = len(self.segments), seg.slot
        if row != last:
            moved = self.segments[int(self._ids[last])]
            for a in (self._pos, self._first, self._ids, self._latest):
                a[row] = a[last]
            moved.slot = row

    def _trim(self) -> None:
        """Cut every segment after its last live entry (evictions take a chain's tail
        first, so this returns most of what dead entries hold)."""
        held = 0
        for seg in self.segments.values():
            live = np.flatnonzero(self.gen[seg.blocks] == seg.gens)
            end = int(live[-1]) + 1
            if end < seg.n:
                seg.cut(end)
                if seg is self._newest:  # its chain no longer ends where a next run starts
                    self._newest = None
            held += end
        self._held = held
        self._trim_at = max(self._trim_at, 2 * held)

    # -- lookups ---------------------------------------------------------------------------
    @property
    def newest(self) -> int:
        """Generation of the latest caching so far (0: none yet)."""
        return self._last_gen

    def _on(self, chain: np.ndarray) -> np.ndarray:
        """Mask over the rows: the live segments that start on `chain` (their first hash is
        the chain's at their first block's position)."""
        n, rows = len(chain), len(self.segments)
        pos = self._pos[:rows]
        return (pos < n) & (chain[np.minimum(pos, n - 1)] == self._first[:rows])

    def any_on_since(self, chain: np.ndarray, newest: int, at: int = -1) -> bool:
        """Whether a segment that starts on `chain` got blocks cached after generation
        `newest` (a new segment, or an old one extended); with `at` >= 0, only blocks cached
        then at chain position `at` count. A hit that ended at a miss at `at` can grow only
        there (its blocks are still the oldest holders; a younger holder changes nothing),
        and a segment's generations never decrease along it, so its entries cached after
        `newest` are a tail found by bisection: running requests extending their own runs
        past the waiting prompt's miss no longer make it look again."""
        rows = len(self.segments)
        new = self._on(chain) & (self._latest[:rows] > newest)
        if at < 0 or not new.any():
            return bool(new.any())
        for sid in self._ids[:rows][new].tolist():
            seg = self.segments[sid]
            q = int(np.searchsorted(seg.gens, newest, side="right"))
            if seg.start + q <= at < seg.end:
                return True
        return False

    def walk(self, chain: np.ndarray, lo: int = 0) -> np.ndarray:
        """The oldest live holder of each position of `chain` (uint64 hashes from the first
        block) from position `lo` on, up to the first position with none (the caller knows
        the holders before `lo`).

        A segment that starts on the chain follows it from its start up to some position;
        its hashes are a chain, so an entry at position p >= lo that equals chain[p] implies
        the entries before it match too (up to a hash collision, which the pool's key check
        catches), and the comparison can start at `lo`. The chain is then read in windows
        (the first `window` positions, each next window four times larger) and the walk
        stops at the first window with a miss: a lookup pays for the hit it finds, not for
        the whole prompt."""
        n = len(chain)
        if lo >= n or not self.num_live:
            return _NO_BLOCKS
        rows = len(self.segments)
        active = [self.segments[g] for g in self._ids[:rows][self._on(chain)].tolist()]
        active = [seg for seg in active if seg.start + seg.n > lo]
        if lo and not self._held_at(active, chain, lo):
            return _NO_BLOCKS
        for seg in active:
            seg._join()
        gen, pieces = self.gen, []
        pos, width = lo, self.window
        while active and pos < n:
            hi = min(n, pos + width)
            best = np.zeros(hi - pos, dtype=np.int64)
            age = np.full(hi - pos, _NEVER, dtype=np.int64)
            later = []
            for seg in active:
                s, e = max(seg.start, pos), min(seg.start + seg.n, hi)
                if s >= e:
                    later.append(seg)  # starts after this window
                    continue
                o, k = s - seg.start, e - s
                eq = seg._hashes[o : o + k] == chain[s:e]
                m = k if eq.all() else int(eq.argmin())
                if not m:
                    continue
                blocks, g = seg._blocks[o : o + m], seg._gens[o : o + m]
                view = age[s - pos : s - pos + m]
                take = (gen[blocks] == g) & (g < view)  # live and older than any so far
                view[take] = g[take]
                best[s - pos : s - pos + m][take] = blocks[take]
                if m == k and seg.start + seg.n > hi:
                    later.append(seg)  # follows the chain into the next window
            miss = np.flatnonzero(best == 0)
            if len(miss):
                pieces.append(best[: int(miss[0])])
                break
            pieces.append(best)
            pos, width, active = hi, 4 * width, later
        if not pieces:
            return _NO_BLOCKS
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def holders(self, chain: np.ndarray) -> np.ndarray:
        """The oldest live holder of every position of `chain` (0 where none), not stopping
        at a miss. Each segment that starts on the chain follows it from its start up to its
        first differing hash (its hashes are a chain), so one comparison per segment finds
        the positions it holds."""
        n = len(chain)
        out = np.zeros(n, dtype=np.int64)
        if not n or not self.num_live:
            return out
        age = np.full(n, _NEVER, dtype=np.int64)
        gen = self.gen
        rows = len(self.segments)
        for sid in self._ids[:rows][self._on(chain)].tolist():
            seg = self.segments[sid]
            seg._join()
            s, k = seg.start, min(seg.n, n - seg.start)
            eq = seg._hashes[:k] == chain[s : s + k]
            m = k if eq.all() else int(eq.argmin())
            blocks, g = seg._blocks[:m], seg._gens[:m]
            view = age[s : s + m]
            take = (gen[blocks] == g) & (g < view)  # live and older than any so far
            view[take] = g[take]
            out[s : s + m][take] = blocks[take]
        return out

    def _held_at(self, active: list[Segment], chain: np.ndarray, at: int) -> bool:
        """Whether a live entry of one of `active` (segments that start on `chain`; those
        covering `at` are joined here) holds chain position `at`: its hash is chain[at] and
        its block still carries the entry's generation. A walk that resumes after a hit
        cut by evictions (`lo` > 0) usually finds no other holder there (evictions take a
        chain's tail first), so one scalar test per segment answers what a first window
        compared per segment."""
        want, gen = chain.item(at), self.gen
        for seg in active:
            o = at - seg.start
            if not 0 <= o < seg.n:
                continue
            seg._join()
            if seg._hashes.item(o) == want and \
                    gen.item(seg._blocks.item(o)) == seg._gens.item(o):
                return True
        return False

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self, block_hash: np.ndarray, parent_hash: np.ndarray) -> None:
        """Each live segment is a chain of the hashes its blocks carry (`block_hash`,
        `parent_hash`: the pool's per-block arrays) cached in order (generations never
        decrease along it), its live count is right, every indexed block is a live entry of
        its segment, and the per-segment rows list the live segments."""
        live_total = 0
        for sid, seg in self.segments.items():
            pend = seg.pending  # runs kept by reference: they and the arrays make up n
            if seg._joined + sum(p[3] - p[2] for p in pend) != seg.n or any(
                    len(p[0]) != len(p[1]) or not 0 <= p[2] < p[3] <= len(p[0])
                    for p in pend):
                raise InvariantError(f"vllm: chain index segment {sid} pending runs are wrong")
            b, h, g = seg.blocks, seg.hashes, seg.gens
            if seg.sid != sid or not seg.n or (np.diff(g) < 0).any() or \
                    seg.last_block != b[-1] or seg.last_hash != h[-1]:
                raise InvariantError(f"vllm: chain index segment {sid} is malformed")
            live = self.gen[b] == g
            if int(np.count_nonzero(live)) != seg.live or not seg.live:
                raise InvariantError(f"vllm: chain index segment {sid} live count is wrong")
            if not (self.segment_of(g) == sid).all():
                raise InvariantError(f"vllm: a generation of segment {sid} points elsewhere")
            if not np.array_equal(block_hash[b[live]], h[live]):
                raise InvariantError(f"vllm: a block of segment {sid} carries another hash")
            inner = live[1:]
            if not np.array_equal(parent_hash[b[1:][inner]], h[:-1][inner]):
                raise InvariantError(f"vllm: segment {sid} is not a hash chain")
            live_total += seg.live
        indexed = self.gen > 0
        if live_total != self.num_live or int(np.count_nonzero(indexed)) != self.num_live:
            raise InvariantError("vllm: chain index live count out of sync")
        if self.gen[0] or self._sid_of_gen[0] or len(self._sid_of_gen) <= self._last_gen or \
                (self.gen > self._last_gen).any():
            raise InvariantError("vllm: a block's generation has no segment")
        rows = len(self.segments)
        for row in range(rows):
            at = self.segments.get(int(self._ids[row]))
            if at is None or at.slot != row or self._pos[row] != at.start or \
                    self._first[row] != at.hashes[0] or self._latest[row] != at.gens[-1]:
                raise InvariantError(f"vllm: chain index row {row} out of sync")
