"""vLLM v1's block pool: ref-counted blocks, one free queue, an index of cached full blocks.

Modelled on the design of vLLM v1's `BlockPool` and `FreeKVCacheBlockQueue` (a
re-implementation under the same names, not a copy). Why it looks as it does:

* `num_blocks` usable blocks, ids 1..num_blocks; block 0 is the null placeholder (the dummy page
  of kvsim's address space) and is never handed out.
* Free blocks sit in one queue in eviction order. vLLM links its blocks into a doubly linked
  list; here the queue is an array of block ids with tombstones (a removed block leaves a 0
  behind; the array is compacted when it fills) and a position per block, so a request's
  thousands of blocks are popped, appended or removed in a few numpy operations instead of one
  Python step each. The order is exactly the linked list's.
* A block with ref count 0 goes to the tail still hashed: cached and reusable. Popping a hashed
  block for a new allocation drops its hash (lazy eviction, LRU); callers free a request's
  blocks in reverse so a chain's tail is evicted first.
* The prefix index answers what vLLM's hash -> blocks dict answers for a lookup (the oldest
  holder of each block of a prompt's chain; duplicates are allowed because block tables are
  append-only), but keeps each caching call's run of blocks whole (kvcore/chain_index.py):
  at page size 1 a block is a token, and per-block indexing made caching and evicting a
  random memory access per token. Each hashed block keeps its (parent hash, token ids) key
  and a hit compares it, so a hash collision never yields a wrong block. Everything a
  block's content is known by (hash, parent hash, token ids) is kept per block id, so a
  lower tier can be keyed by the same hash chain.

`HashedBlocks` holds what the device pool shares with a lower tier's pool
(kvcore/block_tiers.py): ref counts, the blocks' keys, the free queue as LRU with lazy
eviction; `BlockPool` adds the prefix index and the lookup.

Invariants (`check_invariants`), with queued(b) = b is in the free queue:

    queued(b)  <=>  ref_cnt[b] == 0                   for every block b >= 1
    ref_cnt[b] > 1  =>  is_hashed[b]                  (only cached content is shared)
    ref_cnt[0] == 0, block 0 never queued nor hashed
    num_cached_free == #{b : queued(b) and is_hashed[b]}
    index: b is a live entry of a segment  <=>  is_hashed[b]   (and the index's own checks)
    block_hash[b] == block_hashes(parent_hash[b], block_tokens[b])   for every hashed b
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from kvcore.block_hash import NONE_HASH, block_hashes
from kvcore.chain_index import ChainIndex
from kvcore.validation import InvariantError

_U64 = np.uint64
_EMPTY = np.zeros(0, dtype=np.int64)


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: pop from the head, append at the tail, remove anywhere.

    `_q[_head:_tail]` holds the queue in order with 0 for removed entries; `positions[b]` is
    b's index in `_q` while b is queued, and stale (whatever it last was, or -1 if never
    queued) otherwise: the pool knows membership from the ref count (queued <=> no holder),
    so taking a block out writes only its queue entry, not its position (at page size 1 a
    random write per popped block saved). Positions are also written late: an append leaves
    its blocks' positions unwritten (`_settled` marks where the written ones end) and the
    first `remove_n` after it writes those of the blocks still queued then (`settle`): at
    page size 1 a request's free appended thousands of positions at random, and with
    hundreds of frees only 17-22 removals read any (the rest of the blocks were popped
    first: 1.1 M of 4.9-6.0 M positions are ever written). Initially blocks 1..n-1 in id
    order."""

    def __init__(self, num_blocks: int) -> None:
        n = num_blocks  # including the null block 0, which is never queued
        self._q = np.zeros(2 * n + 16, dtype=np.int64)
        self._q[: n - 1] = np.arange(1, n)
        # int32 (a queue index is below 2n + 16): the array is read and written at random
        # per block, and half the bytes keep more of it in the caches at page size 1
        self.positions = np.full(n, -1, dtype=np.int32)
        self.positions[1:] = np.arange(n - 1)
        self._head, self._tail = 0, n - 1
        # queue indices below this hold blocks whose `positions` are written; from it to the
        # tail they are not yet (appended since the last `settle`)
        self._settled = n - 1
        self.num_free_blocks = n - 1
        # every removed entry (a 0) in the window lies in [_tomb_lo, _tomb_hi): only
        # `remove_n` makes them (17-22 calls a run at page 1), so a pop outside that range
        # takes a plain slice without counting tombstones (15 k pops at chunk 64, call-bound)
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
        """Take m blocks off the head (m <= num_free_blocks). Entries below the head are
        left as they are: nothing reads them (a compaction or an append overwrites them)."""
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
        self.num_free_blocks -= m  # (their positions go stale: see the class docstring)
        return blocks

    def remove_n(self, blocks: np.ndarray) -> None:
        """Take queued `blocks` out wherever they are (a cache hit on a free block)."""
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
        """Write the positions of the queued blocks appended since the last settle (the
        only reader, `remove_n`, needs them; blocks popped before it never do)."""
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
        self._q[t : t + k] = blocks  # (positions: at the next `settle`, if still queued)
        self._tail = t + k
        self.num_free_blocks += k

    def queued(self) -> np.ndarray:
        """Mask over block ids: which blocks the queue holds (a scan of the window: checks)."""
        mask = np.zeros(len(self.positions), dtype=bool)
        live = self._q[self._head : self._tail]
        mask[live[live != 0]] = True
        mask[0] = False
        return mask

    def check_invariants(self) -> None:
        """The window holds each queued block once and `positions` points at each."""
        q, h, t = self._q, self._head, self._tail
        if not 0 <= h <= t <= len(q) or q[t:].any():  # (below the head: not read)
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
        if not 0 <= self._settled <= t:
            raise InvariantError("vllm: free queue settled mark outside the window")
        written = live_pos < self._settled  # (the rest are written at the next settle)
        if not np.array_equal(self.positions[live[written]], live_pos[written]):
            raise InvariantError("vllm: free queue positions out of sync")


class HashedBlocks(ABC):
    """What a pool of hashed blocks shares, device or lower tier: `num_blocks` blocks of
    `page_size` slots (ids 1..num_blocks; 0 is the null block), ref counts, each block's key
    (hash, parent hash, token ids) and the free queue, whose hashed blocks are the cache in
    LRU order (head = next evicted). A pop evicts lazily; a subclass drops the evicted blocks
    from its index (`_unindex`)."""

    def __init__(self, num_blocks: int, page_size: int) -> None:
        self.num_blocks = num_blocks
        self.page_size = page_size
        nb = num_blocks + 1  # block 0 = null block
        # int32: holders of a block are requests (far fewer than 2**31); read and written at
        # random per block, so half the bytes of int64 keep more of it cached at page size 1
        self.ref_cnt = np.zeros(nb, dtype=np.int32)
        # per block: whether it carries a hash, the hash, its parent hash and its token ids
        self.is_hashed = np.zeros(nb, dtype=bool)
        self.block_hash = np.zeros(nb, dtype=_U64)
        self.parent_hash = np.zeros(nb, dtype=_U64)
        self.block_tokens = np.zeros((nb, page_size), dtype=np.int64)
        # at page size 1 the same array as a vector: a one-column row scatter or gather
        # costs about 1.6x a plain one, paid per cached block and per checked hit
        self._tokens1 = self.block_tokens[:, 0] if page_size == 1 else None
        self.free_block_queue = FreeKVCacheBlockQueue(nb)
        self.num_cached_free = 0  # hashed blocks in the free queue: evictable cache
        self.evicted_blocks = 0
        #: called with the blocks a pop evicts (pop order), before their hashes are dropped:
        #: a lower tier backs them up there (kvcore/policies/vllm_tiers.py, write_back)
        self.on_evict: Callable[[np.ndarray], None] | None = None
        #: KV events: called with (True, hashes) of blocks just cached and (False, hashes) of
        #: blocks a pop evicts (simulator/fleet/kv_events.py)
        self.kv_events: Callable[[bool, np.ndarray], None] | None = None

    @abstractmethod
    def _unindex(self, evicted: np.ndarray) -> None:
        """Drop lazily evicted blocks (still carrying their keys) from the index."""

    # -- sizes -----------------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        """Blocks an allocation can take now (cached ones included: popping evicts them)."""
        return self.free_block_queue.num_free_blocks

    # -- allocation and freeing ------------------------------------------------------------
    def get_new_blocks(self, m: int) -> np.ndarray:
        """Pop m blocks off the queue head (m <= free blocks), each with ref count 1; the
        cached ones among them lose their hash here, in pop order (lazy eviction)."""
        queue, cached = self.free_block_queue, self.num_cached_free
        # every queued block cached (15,253 of 15,758 pops at page 1, chunk 64) or none:
        # the popped ones are known without reading `is_hashed` per block
        every = cached == queue.num_free_blocks
        blocks = queue.popleft_n(m)
        if not m:
            return blocks
        if every:
            nev = m
        elif not cached:
            nev = 0
        else:
            hashed = self.is_hashed[blocks]
            nev = int(np.count_nonzero(hashed))
        if nev:  # (no compress when every block popped was cached: most pops at page 1)
            ev = blocks if nev == m else blocks[hashed]
            if self.on_evict is not None:
                self.on_evict(ev)
            if self.kv_events is not None:
                self.kv_events(False, self.block_hash[ev])
            self.num_cached_free -= len(ev)
            self.evicted_blocks += len(ev)
            self._unindex(ev)
            self.is_hashed[ev] = False
        self.ref_cnt[blocks] = 1
        return blocks

    def touch(self, blocks: np.ndarray) -> None:
        """A request takes cache hits: one more holder each; idle ones leave the free queue."""
        idle = blocks[self.ref_cnt[blocks] == 0]
        self.free_block_queue.remove_n(idle)
        self.num_cached_free -= len(idle)  # a hit is hashed
        self.ref_cnt[blocks] += 1

    def _set_tokens(self, blocks: np.ndarray, tokens: np.ndarray) -> None:
        """block_tokens[blocks] = tokens (k, page_size)."""
        if self._tokens1 is not None:
            self._tokens1[blocks] = tokens.reshape(-1)
        else:
            self.block_tokens[blocks] = tokens

    def free_blocks(self, ordered: np.ndarray, hashed: int = -1) -> None:
        """One holder fewer for each of `ordered` (distinct); those left with none join the
        queue tail in this order, still hashed (callers pass a request's blocks reversed).
        `hashed`: how many of `ordered` carry a hash, if the caller knows (-1: not known);
        the cached count then grows by it less the blocks still held (shared, so hashed)
        without reading `is_hashed` per block (at page size 1 most frees of a request
        share its hit, so the old shortcut for no sharing at all missed 314 of 317)."""
        # a contiguous copy first: callers pass a reversed view, and numpy scatters through a
        # strided index at 2-3x the cost of a contiguous one (two scatters follow: the ref
        # counts and the queue positions; measured 3-4 against 1.2-1.5 ns a block at page 1)
        ordered = np.ascontiguousarray(ordered)
        ref = self.ref_cnt
        left = ref[ordered] - 1  # one gather and one scatter (the blocks are distinct)
        ref[ordered] = left
        held = int(np.count_nonzero(left))  # blocks someone else still holds
        idle = ordered[left == 0] if held else ordered
        self.free_block_queue.append_n(idle)
        if hashed >= 0:  # a block still held was shared, and only hashed blocks are shared
            self.num_cached_free += hashed - held
        else:
            self.num_cached_free += int(np.count_nonzero(self.is_hashed[idle]))

    # -- observation -----------------------------------------------------------------------
    def peek_free(self, m: int) -> np.ndarray:
        """The next m blocks an allocation would take, head first."""
        return self.free_block_queue.peek_n(m)

    def cached_free_blocks(self) -> list[int]:
        """Free-queue blocks that still carry a hash, head (next evicted) first."""
        q = self.peek_free(self.get_num_free_blocks())
        return q[self.is_hashed[q]].tolist()

    # -- checks ----------------------------------------------------------------------------
    def check_blocks(self, who: str) -> np.ndarray:
        """The shared equations (see BlockPool's module header); returns the hashed blocks."""
        self.free_block_queue.check_invariants()
        queued = self.free_block_queue.queued()
        for b in np.flatnonzero((self.ref_cnt[1:] == 0) != queued[1:]).tolist():
            raise InvariantError(f"{who}: block {b + 1} free-queue membership wrong")
        if self.ref_cnt[0] != 0 or queued[0] or self.is_hashed[0]:
            raise InvariantError(f"{who}: the null block was handed out")
        hashed = np.flatnonzero(self.is_hashed)
        if len(hashed) and not np.array_equal(
            block_hashes(self.parent_hash[hashed], self.block_tokens[hashed]),
            self.block_hash[hashed],
        ):
            raise InvariantError(f"{who}: a block's hash does not match its parent and tokens")
        if self.num_cached_free != int(np.count_nonzero(self.is_hashed & queued)):
            raise InvariantError(f"{who}: cached-block counter out of sync")
        return hashed


class BlockPool(HashedBlocks):
    """`num_blocks` blocks of `page_size` slots: ref counts, the free queue, the prefix index."""

    def __init__(self, num_blocks: int, page_size: int) -> None:
        super().__init__(num_blocks, page_size)
        # prefix index: the oldest live holder of each position of a hash chain
        self.index = ChainIndex(num_blocks)
        # per block: which caching put it in the index (0 = not indexed); an unchanged
        # generation means the block stayed indexed in between (kvcore/chain_memo.py)
        self.gen = self.index.gen
        self.cached_block_hash_to_block = HeadView(self)

    def _unindex(self, evicted: np.ndarray) -> None:
        self.index.remove(evicted)

    # -- the prefix index ------------------------------------------------------------------
    def cache_full_blocks(self, blocks: np.ndarray, hashes: np.ndarray, parent: int,
                          tokens: np.ndarray, start: int, after: int = 0) -> np.ndarray:
        """Hash `blocks` (a chain: block i's parent is block i-1, the first one's `parent`;
        the first one at chain position `start`, vLLM's num_cached_blocks) with their token
        ids (k, page_size) and index them after any older holders of the same content
        (duplicates allowed); returns the hashes. `after`: the block before `blocks[0]` in
        the caller's block table (0: none or unknown), so the index extends its run."""
        if not len(blocks):
            return hashes
        self.is_hashed[blocks] = True
        self.block_hash[blocks] = hashes
        self.parent_hash[blocks[0]] = parent
        self.parent_hash[blocks[1:]] = hashes[:-1]
        self._set_tokens(blocks, tokens)
        self.index.insert(blocks, hashes, start, parent, after)
        if self.kv_events is not None:
            self.kv_events(True, hashes)
        return hashes

    def cache_runs(self, every: np.ndarray, hashes: np.ndarray, tokens: np.ndarray,
                   runs: list[tuple[int, int, int, int]]) -> None:
        """`cache_full_blocks` of several runs, in order (each its own caching), with the
        per-block arrays written once for all: the prefill chunks of one engine iteration.
        `every`, `hashes`, `tokens`: the runs' blocks, hashes and token ids one after the
        other; `runs`: (length, parent, start, after) of each, none empty, no block twice.
        The index keeps `every` and `hashes` by reference (`ChainIndex.insert_runs`): the
        caller does not write them afterwards."""
        self.is_hashed[every] = True
        self.block_hash[every] = hashes
        parents = np.empty_like(hashes)
        parents[1:] = hashes[:-1]  # within a run; each run's first below
        at = 0
        for k, parent, _, _ in runs:
            parents[at] = parent
            at += k
        self.parent_hash[every] = parents
        self._set_tokens(every, tokens)
        self.index.insert_runs(every, hashes, runs)
        if self.kv_events is not None:
            self.kv_events(True, hashes)

    def get_cached_blocks(self, h: int) -> list[int]:
        """Blocks indexed under hash h, oldest first (a scan of the per-block arrays: for
        tests, debugging and the rare hash collision)."""
        b = np.flatnonzero(self.is_hashed & (self.block_hash == _U64(h)))
        return b[np.argsort(self.gen[b], kind="stable")].tolist()

    def longest_cache_hit(self, hashes: np.ndarray, ids: np.ndarray, known: np.ndarray = _EMPTY,
                          known_gens: np.ndarray = _EMPTY, known_at: int = -1,
                          known_evicted: int = -1) -> np.ndarray:
        """Cached blocks for the chain `hashes` (uint64) of the full blocks of `ids`, up to the
        first miss: at each position the oldest holder whose key (parent hash, token ids)
        matches. `known`, an earlier answer for a prefix of the same chain, is still the
        answer when all of it is still indexed under `known_gens` and either it covers the
        whole chain, or it ended at a miss when the index's newest caching was `known_at`
        and no block cached since, in a segment that starts on the chain, sits at the miss
        (holders never come back, and a younger holder before the miss changes nothing, so
        only a new holder there can extend a hit). Otherwise the chain index walks the chain
        from the end of the still-valid part of `known` (evictions take a hit's tail first,
        so that is usually most of it); only a collision (a key that differs under an equal
        hash) costs a walk over the other holders of that hash. `known_evicted`: the pool's
        `evicted_blocks` when `known` was found; if no block was evicted since, none left the
        index (a generation changes only by an eviction and a later caching), so `known`
        is still indexed under `known_gens` without reading them (a peek at a waiting
        prompt re-read every generation of its hit, tens of thousands at page size 1)."""
        ps = self.page_size
        nblocks = len(hashes)
        j = min(len(known), nblocks)
        if j and known_evicted != self.evicted_blocks:
            stale = np.flatnonzero(self.gen[known[:j]] != known_gens[:j])
            j = int(stale[0]) if len(stale) else j
        if j == nblocks or not self.index.num_live:
            return known if j == len(known) else known[:j]  # (`known` itself: unchanged)
        if known_at >= 0 and j == len(known) and not self.index.any_on_since(
                np.ascontiguousarray(hashes, dtype=_U64), known_at, j):
            return known
        # the still-valid known prefix stays (its blocks are still the oldest holders and
        # their keys were checked when it was found): the walk starts where it ends
        tail = self.index.walk(np.ascontiguousarray(hashes, dtype=_U64), j)
        cand = np.concatenate([known[:j], tail]) if j else tail
        k = len(cand)
        if not k:
            return cand
        parents = np.empty(k, dtype=_U64)
        parents[0] = NONE_HASH
        parents[1:] = hashes[: k - 1]
        tok = ids[: k * ps].reshape(k, ps)
        new = cand[j:]
        if self._tokens1 is not None:  # (a vector gather at page size 1)
            same = self._tokens1[new] == ids[j:k]
        else:
            same = (self.block_tokens[new] == tok[j:]).all(axis=1)
        ok = same & (self.parent_hash[new] == parents[j:])
        if ok.all():
            return cand
        # a collision with the oldest holder: check the other holders, block by block
        bad = j + int(np.argmin(ok))
        blocks = cand[:bad].tolist()
        for i in range(bad, k):
            found = None
            for b in self.get_cached_blocks(int(hashes[i])):
                if self.parent_hash[b] == parents[i] and np.array_equal(
                        self.block_tokens[b], tok[i]):
                    found = b
                    break
            if found is None:
                break
            blocks.append(found)
        return np.array(blocks, dtype=np.int64)

    # -- observation -----------------------------------------------------------------------
    def fresh_blocks(self) -> int:
        """Blocks the next allocations take before the first one evicts cached content: the
        plain free blocks ahead of the first cached one in the queue."""
        if not self.num_cached_free:
            return self.get_num_free_blocks()
        return int(self.is_hashed[self.peek_free(self.get_num_free_blocks())].argmax())

    def cached_among_next(self, m: int) -> np.ndarray:
        """out[i] = cached blocks among the next i pops, i = 0..m (what lazy eviction takes
        from the cache, rather than from plain free memory, through i pops)."""
        out = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(self.is_hashed[self.peek_free(m)], out=out[1:])
        return out

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """The equations of the module header."""
        hashed = self.check_blocks("vllm")
        for b in np.flatnonzero((self.ref_cnt > 1) & ~self.is_hashed).tolist():
            raise InvariantError(f"vllm: unhashed block {b} is shared")
        self.index.check_invariants(self.block_hash, self.parent_hash)
        if not np.array_equal(np.flatnonzero(self.gen), hashed):
            raise InvariantError("vllm: chain index out of sync with block hashes")


class HeadView(Mapping[int, int]):
    """Read-only `hash -> oldest holder` view of a pool: vLLM's `cached_block_hash_to_block`
    under its name, for tests and debugging sessions (each access scans the pool)."""

    def __init__(self, pool: BlockPool) -> None:
        self._pool = pool

    def __getitem__(self, h: int) -> int:
        holders = self._pool.get_cached_blocks(h)
        if not holders:
            raise KeyError(h)
        return holders[0]

    def _hashes(self) -> np.ndarray:
        pool = self._pool
        return np.unique(pool.block_hash[pool.is_hashed])

    def __iter__(self) -> Iterator[int]:
        return iter(self._hashes().tolist())

    def __len__(self) -> int:
        return len(self._hashes())
