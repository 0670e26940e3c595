"""`ChainIndex.any_on_since` (the test a remembered hit that ended at a miss runs before
walking again) against its definition written out over every row: whatever runs were cached
(some continuing segments) and blocks evicted, for chains pieced together from several
segments' hashes, any generation and any miss position, the answer is that of "a live
segment that starts on the chain got an entry cached after `newest` (at position `at`, when
given)". About 1 s."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.vllm.chain_index import ChainIndex
from tests.kvcore.draws import chain_runs

N = 40

_RUNS = st.lists(st.tuples(st.integers(1, 5), st.booleans()), min_size=1, max_size=3)
_STEP = st.one_of(st.tuples(st.just("cache"), _RUNS),
                  st.tuples(st.just("evict"), st.integers(0, 2**16), st.integers(1, 6)))


def _model(idx: ChainIndex, chain: np.ndarray, newest: int, at: int) -> bool:
    for seg in idx.segments.values():
        if not (seg.start < len(chain) and chain[seg.start] == seg.hashes[0]):
            continue
        young = np.flatnonzero(seg.gens > newest)
        if len(young) and (at < 0 or seg.start + int(young[0]) <= at < seg.end):
            return True
    return False


@settings(max_examples=120, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=25), st.integers(0, 2**16))
def test_any_on_since_is_its_definition(steps: list[tuple], seed: int) -> None:
    idx = ChainIndex(N)
    free = list(range(1, N + 1))
    ends: list[tuple[int, int, int]] = []
    nxt = 1
    for step in steps:
        if step[0] == "cache":
            every, hashes, runs, free, nxt = chain_runs(step[1], free, ends, nxt)
            if runs:
                idx.insert_runs(np.array(every, dtype=np.int64),
                                np.array(hashes, dtype=np.uint64), runs)
        else:
            held = np.flatnonzero(idx.gen)
            if len(held):
                rng = np.random.default_rng(step[1])
                gone = rng.choice(held, size=min(step[2], len(held)), replace=False)
                idx.remove(gone.astype(np.int64))
                free += gone.tolist()
                ends = [e for e in ends if idx.gen[e[0]]]
    rng = np.random.default_rng(seed)
    segs = list(idx.segments.values())
    length = max([s.end for s in segs], default=0) + int(rng.integers(1, 4))
    chain = rng.integers(nxt, nxt + 5, size=length).astype(np.uint64)  # no entry's hash
    for s in rng.permutation(len(segs)).tolist():  # pieces of several segments' chains
        seg = segs[s]
        lo = seg.start + int(rng.integers(0, seg.n))
        chain[seg.start : lo + 1] = seg.hashes[: lo + 1 - seg.start]
    for newest in range(0, idx.newest + 1):
        for at in range(-1, length):
            got = idx.any_on_since(chain, newest, at)
            assert got == _model(idx, chain, newest, at), (newest, at)
