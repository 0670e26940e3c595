"""vLLM v1's block pool: ref-counted blocks, one free queue, an index of cached full blocks per
KV cache group.

Modelled on vLLM v1's `BlockPool` (vllm/v1/core/block_pool.py, v0.11; a re-implementation
under the same names, not a copy). Why it looks as it does:

* `num_blocks` usable blocks, ids 1..num_blocks; block 0 is the null placeholder (the dummy
  page of kvsim's address space) and is never handed out. Every KV cache group draws its
  blocks from this one pool.
* Free blocks sit in one queue in eviction order (kvcore/vllm/free_queue.py). A block with ref
  count 0 goes to the tail still hashed: cached and reusable. Popping a hashed block for a
  new allocation drops its hash (lazy eviction, LRU); the manager frees a request's blocks in
  reverse so a chain's tail is evicted first.
* The prefix index answers what vLLM's `cached_block_hash_to_block` answers, keyed by (hash,
  group) as vLLM's `BlockHashWithGroupId` is: one chain index per KV cache group
  (kvcore/vllm/chain_index.py), each keeping a caching call's run of blocks whole. A block is
  indexed in the group that cached it. Each hashed block keeps its (parent hash, token ids)
  key and a hit compares it, so a hash collision never yields a wrong block. Everything a
  block's content is known by (hash, parent hash, token ids) is kept per block id, so a
  lower tier can be keyed by the same hash chain.

`HashedBlocks` holds what the device pool shares with a lower tier's pool
(kvcore/vllm/block_tiers.py): ref counts, the blocks' keys, the free queue as LRU with lazy
eviction; `BlockPool` adds the prefix indexes and the lookups.

Invariants (`check_invariants`), with queued(b) = b is in the free queue:

    queued(b)  <=>  ref_cnt[b] == 0                   for every block b >= 1
    ref_cnt[b] > 1  =>  is_hashed[b]                  (only cached content is shared)
    ref_cnt[0] == 0, block 0 never queued nor hashed
    num_cached_free == #{b : queued(b) and is_hashed[b]}
    b is a live entry of exactly one group's index  <=>  is_hashed[b]   (and each index's own)
    block_hash[b] == block_hashes(parent_hash[b], block_tokens[b])   for every hashed b
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from kvcore.contract.validation import InvariantError
from kvcore.vllm.block_hash import NONE_HASH, block_hashes
from kvcore.vllm.chain_index import ChainIndex
from kvcore.vllm.free_queue import FreeKVCacheBlockQueue

_U64 = np.uint64
_EMPTY = np.zeros(0, dtype=np.int64)


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
        # int32: holders of a block are requests (far fewer than 2**31), and the array is read
        # and written at random per block: half the bytes of int64 keep more of it cached
        self.ref_cnt = np.zeros(nb, dtype=np.int32)
        # per block: whether it carries a hash, the hash, its parent hash and its token ids
        self.is_hashed = np.zeros(nb, dtype=bool)
        self.block_hash = np.zeros(nb, dtype=_U64)
        self.parent_hash = np.zeros(nb, dtype=_U64)
        self.block_tokens = np.zeros((nb, page_size), dtype=np.int64)
        # at page size 1 the same array as a vector: numpy scatters and gathers a vector
        # faster than the rows of a one-column matrix, and every cached block and checked
        # hit pays one
        self._tokens1 = self.block_tokens[:, 0] if page_size == 1 else None
        self.free_block_queue = FreeKVCacheBlockQueue(nb)
        self.num_cached_free = 0  # hashed blocks in the free queue: evictable cache
        self.evicted_blocks = 0
        #: called with the blocks a pop evicts (pop order), before their hashes are dropped:
        #: a lower tier backs them up there (kvcore/vllm/tiered.py, write_back)
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
        # every queued block cached, or none: the popped ones are known without reading
        # `is_hashed` per block (a pool under load is mostly cache)
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
        if nev:
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
        without reading `is_hashed` per block."""
        # a contiguous copy first: numpy scatters through a strided index (a reversed view)
        # at a few times the cost of a contiguous one, and two scatters follow
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
    """`num_blocks` blocks of `page_size` slots shared by `num_groups` KV cache groups: ref
    counts, the free queue, one prefix index per group."""

    def __init__(self, num_blocks: int, page_size: int, num_groups: int = 1) -> None:
        super().__init__(num_blocks, page_size)
        #: per KV cache group, its prefix index: the oldest live holder of each position of a
        #: hash chain among the blocks that group cached. `index.gen[b]`: which caching put
        #: b there (0: not indexed); an unchanged generation means b stayed indexed
        self.indexes = [ChainIndex(num_blocks) for _ in range(num_groups)]
        #: several groups only: called with, per group, the blocks a pop evicted from its
        #: index (after every index dropped them; they still carry their hashes), and with
        #: (group, hashes) of blocks just cached (kvcore/vllm/state_evictions.py)
        self.on_unindexed: Callable[[list[np.ndarray]], None] | None = None
        self.on_cached: Callable[[int, np.ndarray], None] | None = None

    def _unindex(self, evicted: np.ndarray) -> None:
        indexes = self.indexes
        if len(indexes) == 1:  # (every indexed block is this group's)
            indexes[0].remove(evicted)
            return
        per_group = []
        for index in indexes:
            mine = evicted[index.gen[evicted] > 0]
            if len(mine):
                index.remove(mine)
            per_group.append(mine)
        if self.on_unindexed is not None:
            self.on_unindexed(per_group)

    @property
    def num_indexed(self) -> int:
        """Blocks indexed in any group (a lookup finds nothing while there are none)."""
        return sum(index.num_live for index in self.indexes)

    # -- the prefix indexes ----------------------------------------------------------------
    def cache_full_blocks(self, blocks: np.ndarray, hashes: np.ndarray, parent: int,
                          tokens: np.ndarray, start: int, after: int = 0,
                          group: int = 0) -> np.ndarray:
        """Hash `blocks` (a chain: block i's parent is block i-1, the first one's `parent`;
        the first one at chain position `start`, vLLM's num_cached_blocks) with their token
        ids (k, page_size) and index them in `group` after any older holders of the same
        content (duplicates allowed); returns the hashes. `after`: the block before
        `blocks[0]` in the caller's block table (0: none or unknown), so the index extends
        its run."""
        if len(blocks):
            self.cache_runs(blocks.copy(), hashes.copy(), tokens,
                            [(len(blocks), parent, start, after)], group)
        return hashes

    def cache_runs(self, every: np.ndarray, hashes: np.ndarray, tokens: np.ndarray,
                   runs: list[tuple[int, int, int, int]], group: int = 0) -> None:
        """`cache_full_blocks` of several runs into `group`'s index, in order (each its own
        caching), with the per-block arrays written once for all: the prefill chunks of one
        engine iteration. `every`, `hashes`, `tokens`: the runs' blocks, hashes and token ids
        one after the other; `runs`: (length, parent, start, after) of each, none empty, no
        block twice. The index keeps `every` and `hashes` by reference
        (`ChainIndex.insert_runs`): the caller does not write them afterwards."""
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
        self.indexes[group].insert_runs(every, hashes, runs)
        if self.on_cached is not None:
            self.on_cached(group, hashes)
        if self.kv_events is not None:
            self.kv_events(True, hashes)

    def get_cached_blocks(self, h: int, group: int = 0) -> list[int]:
        """Blocks of `group` indexed under hash h, oldest first (a scan of the per-block
        arrays: for tests, debugging and the rare hash collision)."""
        gen = self.indexes[group].gen
        b = np.flatnonzero((gen > 0) & (self.block_hash == _U64(h)))
        return b[np.argsort(gen[b], kind="stable")].tolist()

    def _key_matches(self, blocks: np.ndarray, ids: np.ndarray, hashes: np.ndarray,
                     lo: int) -> np.ndarray:
        """Whether each of `blocks`, the candidates at chain positions lo, lo + 1, ... of the
        chain `hashes` of `ids`, holds its position's key (parent hash, token ids)."""
        ps, k = self.page_size, len(blocks)
        parents = np.empty(k, dtype=_U64)
        parents[:1] = hashes[lo - 1] if lo else NONE_HASH
        parents[1:] = hashes[lo : lo + k - 1]
        if self._tokens1 is not None:  # (a vector gather at page size 1)
            same = self._tokens1[blocks] == ids[lo : lo + k]
        else:
            same = (self.block_tokens[blocks] ==
                    ids[lo * ps : (lo + k) * ps].reshape(k, ps)).all(axis=1)
        return same & (self.parent_hash[blocks] == parents)

    def _holder_of(self, group: int, hashes: np.ndarray, ids: np.ndarray, i: int) -> int:
        """The oldest block of `group` holding chain position i with its key (0: none): the
        walk over a hash's holders that a collision with the oldest one needs."""
        ps = self.page_size
        parent = hashes[i - 1] if i else _U64(NONE_HASH)
        for b in self.get_cached_blocks(int(hashes[i]), group):
            if self.parent_hash[b] == parent and np.array_equal(
                    self.block_tokens[b], ids[i * ps : (i + 1) * ps]):
                return b
        return 0

    def longest_cache_hit(self, hashes: np.ndarray, ids: np.ndarray, known: np.ndarray = _EMPTY,
                          known_gens: np.ndarray = _EMPTY, known_at: int = -1,
                          known_evicted: int = -1, group: int = 0) -> np.ndarray:
        """Cached blocks of `group` for the chain `hashes` (uint64) of the full blocks of
        `ids`, up to the first miss: at each position the oldest holder whose key (parent
        hash, token ids) matches. `known`, an earlier answer for a prefix of the same chain,
        is still the answer when all of it is still indexed under `known_gens` and either it
        covers the whole chain, or it ended at a miss when the index's newest caching was
        `known_at` and no block cached since, in a segment that starts on the chain, sits at
        the miss (holders never come back, and a younger holder before the miss changes
        nothing, so only a new holder there can extend a hit). Otherwise the chain index
        walks the chain from the end of the still-valid part of `known` (evictions take a
        hit's tail first, so that is usually most of it); only a collision (a key that
        differs under an equal hash) costs a walk over the other holders of that hash.
        `known_evicted`: the pool's `evicted_blocks` when `known` was found; if no block was
        evicted since, none left the index (a generation changes only by an eviction and a
        later caching), so `known` is still indexed under `known_gens` without reading
        them."""
        index = self.indexes[group]
        nblocks = len(hashes)
        j = min(len(known), nblocks)
        if j and known_evicted != self.evicted_blocks:
            stale = np.flatnonzero(index.gen[known[:j]] != known_gens[:j])
            j = int(stale[0]) if len(stale) else j
        if j == nblocks or not index.num_live:
            return known if j == len(known) else known[:j]  # (`known` itself: unchanged)
        if known_at >= 0 and j == len(known) and not index.any_on_since(
                np.ascontiguousarray(hashes, dtype=_U64), known_at, j):
            return known
        # the still-valid known prefix stays (its blocks are still the oldest holders and
        # their keys were checked when it was found): the walk starts where it ends
        tail = index.walk(np.ascontiguousarray(hashes, dtype=_U64), j)
        cand = np.concatenate([known[:j], tail]) if j else tail
        k = len(cand)
        if not k:
            return cand
        ok = self._key_matches(cand[j:], ids, hashes, j)
        if ok.all():
            return cand
        # a collision with the oldest holder: check the other holders, block by block
        bad = j + int(np.argmin(ok))
        blocks = cand[:bad].tolist()
        for i in range(bad, k):
            found = self._holder_of(group, hashes, ids, i)
            if not found:
                break
            blocks.append(found)
        return np.array(blocks, dtype=np.int64)

    def holders(self, hashes: np.ndarray, ids: np.ndarray, group: int) -> np.ndarray:
        """At every position of the chain `hashes` of `ids`, the oldest block of `group`
        holding that position's key (0 where none): what a group whose hit is not a prefix
        (a sliding window's, a state's) reads at any position."""
        out = self.indexes[group].holders(np.ascontiguousarray(hashes, dtype=_U64))
        if out.any():
            bad = (out > 0) & ~self._key_matches(out, ids, hashes, 0)
            for i in np.flatnonzero(bad).tolist():  # a collision with the oldest holder
                out[i] = self._holder_of(group, hashes, ids, i)
        return out

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
        indexed = np.zeros(self.num_blocks + 1, dtype=np.int64)
        for index in self.indexes:
            index.check_invariants(self.block_hash, self.parent_hash)
            indexed += index.gen > 0
        if (indexed > 1).any():
            raise InvariantError("vllm: a block is indexed in two KV cache groups")
        if not np.array_equal(np.flatnonzero(indexed), hashed):
            raise InvariantError("vllm: chain index out of sync with block hashes")


__all__ = ["BlockPool", "HashedBlocks"]
