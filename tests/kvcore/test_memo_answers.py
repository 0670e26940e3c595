"""The `vllm` policy's remembered lookups (kvcore/vllm/chain_memo.py, `BlockPool.longest_cache_hit`
with a known hit, the chain index's walk resumed after a cut) against a fresh lookup, after
any sequence of admissions, prefill chunks, decode steps (whose pops evict), finishes and
releases in the middle of a prefill (whose entry keeps its admission hit): the same prompt
buffers are peeked at again and again, as the engine peeks at a waiting queue head, and every
answer (hit blocks, idle hit blocks) must be the one a lookup from scratch gives.

About 2 s (30 examples of up to 30 steps, pools of a few dozen blocks)."""

from __future__ import annotations

import numpy as np
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from kvcore.vllm.block_hash import NONE_HASH
from tests.kvcore.test_vllm_block import VLLMMachine, make


class RepeatedPeeks(VLLMMachine):
    """`VLLMMachine` with a few prompt buffers kept for the whole run and peeked at again."""

    def __init__(self) -> None:
        super().__init__()
        self.bufs: list[np.ndarray] = []

    @initialize(page_size=st.sampled_from([1, 2]), pages=st.integers(8, 40),
                window=st.sampled_from([1, 2, 1024]))
    def create(self, page_size: int, pages: int, window: int) -> None:  # type: ignore[override]
        self.pol = make(pages * page_size, page_size, max_context_len=48, max_requests=5)
        self.pol.pool.indexes[0].window = window  # walks that cross windows too
        for k in range(3):  # shared heads, own tails
            self.bufs.append(np.concatenate([np.arange(12 + 4 * k), 70_000 + 100 * k
                                             + np.arange(10)]).astype(np.int64))

    def _fresh(self, ids: np.ndarray) -> np.ndarray:
        pol = self.pol
        assert pol is not None
        n = len(ids) // pol.page_size
        if not n or not pol.pool.num_indexed:
            return np.zeros(0, dtype=np.int64)
        return pol.pool.longest_cache_hit(pol.hasher.chain(NONE_HASH, ids[: n * pol.page_size]),
                                          ids)

    @rule(k=st.integers(0, 2), out=st.integers(1, 8))
    def admit_kept(self, k: int, out: int) -> None:
        """Admit a kept buffer (the prompt the peeks asked about) as a new request."""
        pol = self.pol
        assert pol is not None
        toks = self.bufs[k]
        if any(p is toks for p, _ in self.live.values()):
            return
        rid = self.next_rid
        self.next_rid += 1
        want = len(self._fresh(toks[:-1])) * pol.page_size
        res = pol.admit(rid, toks, len(toks) + out - 1, out)
        if res is not None:
            assert res.cached_len == want
            self.live[rid] = (toks, len(toks) + out - 1)
            self.record(rid)

    @rule(k=st.integers(0, 2))
    def peek_again(self, k: int) -> None:
        pol = self.pol
        assert pol is not None
        key = self.bufs[k][:-1]
        hit = self._fresh(key)
        ps = pol.page_size
        idle = int(np.count_nonzero(pol.pool.ref_cnt[hit] == 0))
        got = pol.peek_admission(key)
        assert (got.hit, got.evictable) == (len(hit) * ps, idle * ps)
        assert pol.peek_prefix(key) == len(hit) * ps
        event(f"hit={len(hit) > 0}")

    @invariant()
    def memo_bounded(self) -> None:
        if self.pol is not None:
            assert len(self.pol.memo) <= self.pol.memo.capacity


TestRepeatedPeeks = RepeatedPeeks.TestCase
TestRepeatedPeeks.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
