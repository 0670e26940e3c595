"""The block pool with its chain index against a plain per-block model of vLLM's pool (a
prefix walk, and every position's holder for the groups whose hit is not a prefix).

`BlockPool` (the prefix index keeps whole segments, kvcore/vllm/chain_index.py) must hand out,
evict, hit and free the same blocks in the same order as a per-block model (a list as the
free queue, a dict of hash -> blocks oldest first, a block-by-block lookup). Hypothesis drives
random operation streams that cache chains in pieces, cache content again without looking it
up (duplicates), free in any order (holes in a chain) and collide hashes; every invariant is
checked after every step.
"""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvcore.vllm.block_hash import NONE_HASH, ChainHasher
from kvcore.vllm.block_pool import BlockPool
from tests.kvcore.vllm_views import heads


class RefPool:
    """vLLM's block pool one block at a time: the free queue a list, the index a dict."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(1, num_blocks + 1))
        self.ref = [0] * (num_blocks + 1)
        self.key: dict[int, tuple[int, int, tuple[int, ...]]] = {}  # block -> hash, parent, ids
        self.index: dict[int, list[int]] = {}
        self.evicted = 0

    def get_new_blocks(self, m: int) -> list[int]:
        out = []
        for _ in range(m):
            b = self.free.pop(0)
            if b in self.key:  # lazy eviction
                h = self.key.pop(b)[0]
                self.index[h].remove(b)
                if not self.index[h]:
                    del self.index[h]
                self.evicted += 1
            self.ref[b] = 1
            out.append(b)
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1

    def free_blocks(self, ordered: list[int]) -> None:
        for b in ordered:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)

    def cache(self, blocks: list[int], hashes: list[int], parent: int,
              ids: list[tuple[int, ...]]) -> None:
        for b, h, toks in zip(blocks, hashes, ids, strict=True):
            self.key[b] = (h, parent, toks)
            self.index.setdefault(h, []).append(b)
            parent = h

    def hit(self, hashes: list[int], ids: list[tuple[int, ...]]) -> list[int]:
        out: list[int] = []
        parent = NONE_HASH
        for h, toks in zip(hashes, ids, strict=True):
            match = [b for b in self.index.get(h, []) if self.key[b] == (h, parent, toks)]
            if not match:
                break
            out.append(match[0])
            parent = h
        return out

    def holders(self, hashes: list[int], ids: list[tuple[int, ...]]) -> list[int]:
        """At every position, the oldest block whose key is that position's (0: none), not
        stopping at a miss: what a sliding window's or a state's hit reads."""
        out = []
        for i, (h, toks) in enumerate(zip(hashes, ids, strict=True)):
            key = (h, hashes[i - 1] if i else NONE_HASH, toks)
            out.append(next((b for b in self.index.get(h, []) if self.key[b] == key), 0))
        return out


PS = 2
SEQS = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [1, 2, 7, 7, 7, 7],
        [5, 5, 5, 5, 5, 5, 5, 5, 5, 5], [1, 2, 3, 4, 5, 6]]


class PoolMachine(RuleBasedStateMachine):
    """BlockPool against RefPool on requests that match, allocate, cache and free. A request
    caches its new blocks in one or two pieces, or caches its whole prompt again without
    using its hit (the duplicates vLLM makes when two requests prefill one prefix at once);
    lookups also resume from an earlier answer, as the policy's prompt memo does. A hasher
    with few distinct hashes (`collide`) makes equal hashes for different blocks."""

    collide = False

    def __init__(self) -> None:
        super().__init__()
        self.pool, self.ref = BlockPool(10, PS), RefPool(10)
        self.hasher = ChainHasher(PS, 64)
        self.live: list[list[int]] = []  # each request's blocks
        self.seen: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}  # seq -> hit, gens, at

    def _hashes(self, ids: np.ndarray) -> np.ndarray:
        hashes = self.hasher.chain(NONE_HASH, ids)
        if not self.collide:
            return hashes
        # a chain hash with 3 values per position: a function of (parent hash, tokens) like
        # the real one (the parent gives the position), so different blocks at one position
        # collide all the time. (A collision across positions would need a cycle in a
        # chain of 64-bit hashes.)
        out = np.zeros(len(hashes), dtype=np.uint64)
        parent = NONE_HASH
        for i in range(len(hashes)):
            parent = (parent // 8 + 1) * 8 + (parent % 8 * 31 + int(ids[i * PS]) % 2) % 3
            out[i] = parent
        return out

    def _lookup(self, s: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
        ids = np.array(SEQS[s], dtype=np.int64)
        hashes = self._hashes(ids)
        empty = np.zeros(0, np.int64)
        known, gens, at = self.seen.get(s, (empty, empty, -1))
        got = self.pool.longest_cache_hit(hashes, ids, known, gens, at)
        at = self.pool.indexes[0].newest if len(got) < len(hashes) else -1
        self.seen[s] = (got, self.pool.indexes[0].gen[got], at)
        toks = [tuple(SEQS[s][i : i + PS]) for i in range(0, len(SEQS[s]), PS)]
        want = self.ref.hit(hashes.tolist(), toks)
        assert got.tolist() == want
        assert self.pool.longest_cache_hit(hashes, ids).tolist() == want  # fresh lookup
        assert self.pool.holders(hashes, ids, 0).tolist() == \
            self.ref.holders(hashes.tolist(), toks)
        return ids, hashes, want

    def _take_blocks(self, s: int, use_hit: bool
                     ) -> tuple[np.ndarray, np.ndarray, list[int], np.ndarray] | None:
        """A request for sequence `s`: its hit (none unless `use_hit`) touched and its new
        blocks popped, in the pool and the model alike; None when they do not fit."""
        ids, hashes, hit = self._lookup(s)
        if not use_hit:
            hit = []
        n = len(hashes)
        idle = sum(self.ref.ref[b] == 0 for b in hit)  # hits taken out of the free queue
        if n - len(hit) > self.pool.get_num_free_blocks() - idle:
            return None
        self.pool.touch(np.array(hit, dtype=np.int64))
        self.ref.touch(hit)
        new = self.pool.get_new_blocks(n - len(hit))
        assert new.tolist() == self.ref.get_new_blocks(n - len(hit))
        return ids, hashes, hit, new

    def _cache(self, new: np.ndarray, hashes: np.ndarray, ids: np.ndarray, k: int,
               after: int = 0) -> None:
        """Cache `new` at chain position k (`after`: the block before them in the request's
        table, for a chunk that extends its run; 0, the pool's default: none)."""
        parent = int(hashes[k - 1]) if k else NONE_HASH
        self.pool.cache_full_blocks(new, hashes[k : k + len(new)], parent,
                                    ids[k * PS : (k + len(new)) * PS].reshape(-1, PS), k, after)
        self.ref.cache(new.tolist(), hashes[k : k + len(new)].tolist(), parent,
                       [tuple(ids[i : i + PS].tolist())
                        for i in range(k * PS, (k + len(new)) * PS, PS)])

    @rule(s=st.integers(0, len(SEQS) - 1))
    def peek(self, s: int) -> None:
        self._lookup(s)

    @rule(s=st.integers(0, len(SEQS) - 1), split=st.integers(0, 5), use_hit=st.booleans())
    def run_request(self, s: int, split: int, use_hit: bool) -> None:
        taken = self._take_blocks(s, use_hit)
        if taken is None:
            return
        ids, hashes, hit, new = taken
        assert self.pool.evicted_blocks == self.ref.evicted
        k = len(hit)
        cut = min(split, len(new))  # cache in two pieces (two prefill chunks)
        for lo, hi in ((0, cut), (cut, len(new))):
            if hi > lo:
                self._cache(new[lo:hi], hashes, ids, k + lo)
        self.live.append(hit + new.tolist())

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), reverse=st.booleans())
    def finish(self, i: int, reverse: bool) -> None:
        blocks = self.live.pop(i % len(self.live))
        if reverse:
            blocks = blocks[::-1]  # chain tail first, as the policy frees
        self.pool.free_blocks(np.array(blocks, dtype=np.int64))
        self.ref.free_blocks(blocks)

    @invariant()
    def same_pool(self) -> None:
        if not self.collide:
            self.pool.check_invariants()
        else:
            self.pool.free_block_queue.check_invariants()
            self.pool.indexes[0].check_invariants(self.pool.block_hash, self.pool.parent_hash)
        assert self.pool.peek_free(self.pool.get_num_free_blocks()).tolist() == self.ref.free
        assert self.pool.ref_cnt[1:].tolist() == self.ref.ref[1:]
        for h, holders in self.ref.index.items():
            assert self.pool.get_cached_blocks(h) == holders
        assert len(heads(self.pool)) == len(self.ref.index)


TestPool = PoolMachine.TestCase
TestPool.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


class PoolMachineCollisions(PoolMachine):
    collide = True


TestPoolCollisions = PoolMachineCollisions.TestCase
TestPoolCollisions.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_a_collision_falls_back_to_the_holder_whose_key_matches() -> None:
    """Two different blocks under one hash: the lookup skips the oldest holder, whose
    (parent, tokens) key differs, takes the next one, and a resumed lookup agrees."""
    pool = BlockPool(6, 2)
    h = np.array([7], dtype=np.uint64)
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(a, h, NONE_HASH, np.array([[1, 2]]), 0)
    pool.cache_full_blocks(b, h, NONE_HASH, np.array([[3, 4]]), 0)
    assert pool.get_cached_blocks(7) == [1, 2]
    ids = np.array([3, 4], dtype=np.int64)
    got = pool.longest_cache_hit(h, ids)
    assert got.tolist() == [2]
    assert pool.longest_cache_hit(h, ids, got, pool.indexes[0].gen[got]).tolist() == [2]
    assert pool.longest_cache_hit(h, np.array([5, 6], dtype=np.int64)).tolist() == []
    pool.free_blocks(a)
    pool.get_new_blocks(pool.get_num_free_blocks())  # evicts a: b becomes the oldest holder
    assert pool.get_cached_blocks(7) == [2]
    assert pool.longest_cache_hit(h, ids, got, pool.indexes[0].gen[got]).tolist() == [2]
