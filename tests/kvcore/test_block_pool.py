"""The vLLM structures on their own: the free-block queue against a plain list (the doubly
linked list vLLM keeps), the block pool's lazy eviction and duplicate hash index, and the
chained hash against the block-by-block definition."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvcore.vllm.block_hash import NONE_HASH, ChainHasher, block_hash
from kvcore.vllm.block_pool import BlockPool
from kvcore.vllm.free_queue import FreeKVCacheBlockQueue
from tests.kvcore.vllm_views import cached_free


class QueueMachine(RuleBasedStateMachine):
    """popleft_n / append_n / remove_n in any order, through compactions, keep the order of
    a list with O(n) operations."""

    N = 12

    def __init__(self) -> None:
        super().__init__()
        self.q = FreeKVCacheBlockQueue(self.N + 1)
        self.model = list(range(1, self.N + 1))

    @rule(data=st.data())
    def pop(self, data) -> None:
        m = data.draw(st.integers(0, len(self.model)))
        assert self.q.peek_n(m).tolist() == self.model[:m]
        assert self.q.popleft_n(m).tolist() == self.model[:m]
        del self.model[:m]

    @rule(data=st.data())
    def append(self, data) -> None:
        out = sorted(set(range(1, self.N + 1)) - set(self.model))
        blocks = data.draw(st.permutations(out).map(lambda p: p[: len(p) // 2 + 1])) if out \
            else []
        self.q.append_n(np.array(blocks, dtype=np.int64))
        self.model += blocks

    @rule(data=st.data())
    def remove(self, data) -> None:
        if not self.model:
            return
        gone = data.draw(st.sets(st.sampled_from(self.model)))
        self.q.remove_n(np.array(sorted(gone), dtype=np.int64))
        self.model = [b for b in self.model if b not in gone]

    @rule()
    def settle(self) -> None:
        """Appends leave positions unwritten until a removal reads them: once settled,
        every queued block's position is its index in the queue."""
        self.q.settle()
        self.q.check_invariants(settled=True)

    @invariant()
    def same_order(self) -> None:
        self.q.check_invariants()
        assert self.q.num_free_blocks == len(self.model)
        assert self.q.peek_n(len(self.model)).tolist() == self.model
        # membership comes from the window, not from positions (stale once taken out)
        assert np.flatnonzero(self.q.queued()).tolist() == sorted(self.model)


TestQueue = QueueMachine.TestCase
TestQueue.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def _chain(pool: BlockPool, hasher: ChainHasher, ids: np.ndarray) -> np.ndarray:
    """Allocate and cache the full blocks of `ids` as one request would."""
    blocks = pool.get_new_blocks(len(ids) // pool.page_size)
    pool.cache_full_blocks(blocks, hasher.chain(NONE_HASH, ids), NONE_HASH,
                           ids.reshape(-1, pool.page_size), 0)
    return blocks


def test_lazy_eviction_pops_the_chain_tail_first_and_keeps_duplicates() -> None:
    pool, hasher = BlockPool(6, 2), ChainHasher(2, 64)
    ids = np.arange(6, dtype=np.int64)
    a = _chain(pool, hasher, ids)
    b = _chain(pool, hasher, ids)  # the same content again: indexed as a duplicate
    assert a.tolist() == [1, 2, 3] and b.tolist() == [4, 5, 6]
    h = int(pool.block_hash[1])
    assert pool.get_cached_blocks(h) == [1, 4]
    blocks = pool.longest_cache_hit(hasher.chain(NONE_HASH, ids), ids).tolist()
    assert blocks == [1, 2, 3]  # the oldest holder of each hash
    pool.free_blocks(a[::-1])
    pool.free_blocks(b[::-1])
    assert cached_free(pool) == [3, 2, 1, 6, 5, 4]
    assert pool.fresh_blocks() == 0 and pool.cached_among_next(3).tolist() == [0, 1, 2, 3]
    got = pool.get_new_blocks(2)  # evicts 3 then 2: the tail of the first chain
    assert got.tolist() == [3, 2] and pool.evicted_blocks == 2
    assert pool.get_cached_blocks(h) == [1, 4] and pool.num_cached_free == 4
    pool.touch(np.array([4], dtype=np.int64))
    assert pool.ref_cnt[4] == 1 and pool.num_cached_free == 3
    pool.check_invariants()


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_free_with_a_hashed_count_equals_free_without(data) -> None:
    """`free_blocks(ordered, hashed)` (the policy's count of hashed blocks) leaves the pool
    as `free_blocks(ordered)` does, shared blocks (the fallback) and page size 1 included."""
    ps = data.draw(st.sampled_from([1, 2]), label="page size")
    hasher = ChainHasher(ps, 64)
    pools = [BlockPool(24, ps), BlockPool(24, ps)]
    ids = np.array(data.draw(st.lists(st.integers(0, 3), min_size=2 * ps, max_size=8 * ps)),
                   dtype=np.int64)
    full = len(ids) // ps
    nhashed = data.draw(st.integers(0, full), label="hashed")
    plain = data.draw(st.integers(0, 3), label="unhashed blocks after")
    share = data.draw(st.integers(0, nhashed), label="blocks another request holds")
    for pool in pools:
        blocks = pool.get_new_blocks(nhashed + plain)
        if nhashed:
            pool.cache_full_blocks(blocks[:nhashed], hasher.chain(NONE_HASH, ids)[:nhashed],
                                   NONE_HASH, ids[: nhashed * ps].reshape(-1, ps), 0)
        pool.touch(blocks[:share])
    pools[0].free_blocks(blocks[::-1])
    pools[1].free_blocks(blocks[::-1], nhashed)
    for pool in pools:
        pool.check_invariants()
    a, b = pools
    assert a.num_cached_free == b.num_cached_free
    assert cached_free(a) == cached_free(b)
    assert a.peek_free(a.get_num_free_blocks()).tolist() == \
        b.peek_free(b.get_num_free_blocks()).tolist()
    assert np.array_equal(a.ref_cnt, b.ref_cnt)


def test_chain_hasher_equals_the_block_by_block_definition() -> None:
    hasher = ChainHasher(4, 64)
    ids = np.arange(100, 124, dtype=np.int64) * 7
    parent = NONE_HASH
    for i, h in enumerate(hasher.chain(NONE_HASH, ids).tolist()):
        parent = block_hash(parent, ids[4 * i : 4 * i + 4].tobytes())
        assert h == parent
    assert hasher.chain(parent, ids[:3]).tolist() == []  # no full block
