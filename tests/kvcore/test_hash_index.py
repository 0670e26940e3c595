"""The batched hash index and block pool against plain per-block reference models.

`BlockHashIndex` (numpy, whole batches per call) must keep exactly the holder order of a
dict of hash -> list of blocks updated one block at a time; `BlockPool` with it must hand out,
evict, hit and free the same blocks in the same order as a per-block model of vLLM's pool
(a list as the free queue, a dict index, a block-by-block lookup). Hypothesis drives random
operation streams; every invariant is checked after every step.
"""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvcore.block_hash import NONE_HASH, ChainHasher
from kvcore.block_pool import BlockPool
from kvcore.hash_index import BlockHashIndex

NB = 24  # blocks 1..24; the table has 128 home slots, so dead rows force rebuilds often
# hashes crowded on four home slots (low 7 bits) and on the last one (their cluster runs into
# the spare rows past it), plus spread and edge values; more keys than blocks, so keys come
# and go and leave dead rows behind
POOL = ([i % 4 | i << 7 for i in range(24)] + [127 | i << 8 for i in range(8)]
        + [i * 0x9E3779B97F4A7C15 % 2**64 for i in range(1, 60)] + [2**64 - 1, 2**63])


class IndexMachine(RuleBasedStateMachine):
    """BlockHashIndex against dict[hash, list[block]] (oldest first), per block. Probing in
    whole numpy rounds only (`few = 0`); the subclass below finishes a few keys one by one."""

    few = 0
    min_spare = 64

    def __init__(self) -> None:
        super().__init__()
        self.ix = BlockHashIndex.__new__(BlockHashIndex)
        self.ix.few, self.ix.min_spare = self.few, self.min_spare
        self.ix.__init__(NB)  # type: ignore[misc]
        self.model: dict[int, list[int]] = {}
        self.where: dict[int, int] = {}  # block -> its hash

    @rule(data=st.data())
    def insert(self, data: st.DataObject) -> None:
        free = [b for b in range(1, NB + 1) if b not in self.where]
        blocks = data.draw(st.permutations(free).flatmap(
            lambda p: st.integers(0, len(p)).map(lambda k: p[:k])))
        hashes = [data.draw(st.sampled_from(POOL)) for _ in blocks]
        self.ix.insert(np.array(blocks, dtype=np.int64), np.array(hashes, dtype=np.uint64))
        for b, h in zip(blocks, hashes, strict=True):
            self.model.setdefault(h, []).append(b)
            self.where[b] = h

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        held = sorted(self.where)
        blocks = data.draw(st.permutations(held).flatmap(
            lambda p: st.integers(0, len(p)).map(lambda k: p[:k])))
        self.ix.remove(np.array(blocks, dtype=np.int64))
        for b in blocks:
            h = self.where.pop(b)
            self.model[h].remove(b)
            if not self.model[h]:
                del self.model[h]

    @invariant()
    def same_holders(self) -> None:
        self.ix.check_invariants()
        for h in POOL:
            assert self.ix.holders(h) == self.model.get(h, [])
        heads = self.ix.heads(np.array(POOL, dtype=np.uint64)).tolist()
        assert heads == [self.model[h][0] if h in self.model else 0 for h in POOL]
        assert dict(self.ix.items()) == {h: hs[0] for h, hs in self.model.items()}
        assert self.ix.num_keys == len(self.model)


TestIndex = IndexMachine.TestCase
TestIndex.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


class IndexMachineFewByOne(IndexMachine):
    few = 3  # batches of up to 24 keys: rounds first, then the last keys one at a time


TestIndexFewByOne = IndexMachineFewByOne.TestCase
TestIndexFewByOne.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


class IndexMachineShortSpare(IndexMachine):
    min_spare = 1  # clusters at the last home slot run out of rows: rebuilds add more
    few = 2


TestIndexShortSpare = IndexMachineShortSpare.TestCase
TestIndexShortSpare.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


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


PS = 2
SEQS = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [1, 2, 7, 7, 7, 7],
        [5, 5, 5, 5, 5, 5, 5, 5, 5, 5], [1, 2, 3, 4, 5, 6]]


class PoolMachine(RuleBasedStateMachine):
    """BlockPool (batched) against RefPool on requests that match, allocate, cache and free;
    lookups also resume from an earlier answer, as the policy's prompt memo does."""

    few = BlockHashIndex.few

    def __init__(self) -> None:
        super().__init__()
        self.pool, self.ref = BlockPool(10, PS), RefPool(10)
        self.pool.index.few = self.few
        self.hasher = ChainHasher(PS, 64)
        self.live: list[list[int]] = []  # each request's blocks
        self.seen: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # seq -> last hit, gens

    def _lookup(self, s: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
        ids = np.array(SEQS[s], dtype=np.int64)
        hashes = self.hasher.chain(NONE_HASH, ids)
        known, gens = self.seen.get(s, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        got = self.pool.longest_cache_hit(hashes, ids, known, gens)
        self.seen[s] = (got, self.pool.gen[got])
        toks = [tuple(SEQS[s][i : i + PS]) for i in range(0, len(SEQS[s]), PS)]
        want = self.ref.hit(hashes.tolist(), toks)
        assert got.tolist() == want
        assert self.pool.longest_cache_hit(hashes, ids).tolist() == want  # fresh lookup
        return ids, hashes, want

    @rule(s=st.integers(0, len(SEQS) - 1))
    def peek(self, s: int) -> None:
        self._lookup(s)

    @rule(s=st.integers(0, len(SEQS) - 1))
    def run_request(self, s: int) -> None:
        ids, hashes, hit = self._lookup(s)
        n = len(hashes)
        idle = sum(self.ref.ref[b] == 0 for b in hit)  # hits taken out of the free queue
        if n - len(hit) > self.pool.get_num_free_blocks() - idle:
            return
        self.pool.touch(np.array(hit, dtype=np.int64))
        self.ref.touch(hit)
        new = self.pool.get_new_blocks(n - len(hit))
        assert new.tolist() == self.ref.get_new_blocks(n - len(hit))
        assert self.pool.evicted_blocks == self.ref.evicted
        k = len(hit)
        parent = int(hashes[k - 1]) if k else NONE_HASH
        self.pool.cache_full_blocks(new, hashes[k:], parent, ids[k * PS :].reshape(-1, PS))
        self.ref.cache(new.tolist(), hashes[k:].tolist(), parent,
                       [tuple(ids[i : i + PS].tolist()) for i in range(k * PS, n * PS, PS)])
        self.live.append(hit + new.tolist())

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def finish(self, i: int) -> None:
        blocks = self.live.pop(i % len(self.live))[::-1]  # chain tail first
        self.pool.free_blocks(np.array(blocks, dtype=np.int64))
        self.ref.free_blocks(blocks)

    @invariant()
    def same_pool(self) -> None:
        self.pool.check_invariants()
        assert self.pool.peek_free(self.pool.get_num_free_blocks()).tolist() == self.ref.free
        assert self.pool.ref_cnt[1:].tolist() == self.ref.ref[1:]
        for h, holders in self.ref.index.items():
            assert self.pool.get_cached_blocks(h) == holders
        assert len(self.pool.cached_block_hash_to_block) == len(self.ref.index)


TestPool = PoolMachine.TestCase
TestPool.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


class PoolMachineRounds(PoolMachine):
    few = 0


TestPoolRounds = PoolMachineRounds.TestCase
TestPoolRounds.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


def test_a_collision_falls_back_to_the_holder_whose_key_matches() -> None:
    """Two different blocks under one hash: the lookup skips the oldest holder, whose
    (parent, tokens) key differs, takes the next one, and a resumed lookup agrees."""
    pool = BlockPool(6, 2)
    h = np.array([7], dtype=np.uint64)
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(a, h, NONE_HASH, np.array([[1, 2]]))
    pool.cache_full_blocks(b, h, NONE_HASH, np.array([[3, 4]]))
    assert pool.get_cached_blocks(7) == [1, 2]
    ids = np.array([3, 4], dtype=np.int64)
    got = pool.longest_cache_hit(h, ids)
    assert got.tolist() == [2]
    assert pool.longest_cache_hit(h, ids, got, pool.gen[got]).tolist() == [2]
    assert pool.longest_cache_hit(h, np.array([5, 6], dtype=np.int64)).tolist() == []
    pool.free_blocks(a)
    pool.get_new_blocks(pool.get_num_free_blocks())  # evicts a: b becomes the oldest holder
    assert pool.get_cached_blocks(7) == [2]
    assert pool.longest_cache_hit(h, ids, got, pool.gen[got]).tolist() == [2]
