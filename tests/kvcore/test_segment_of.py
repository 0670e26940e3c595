"""A chain index finds an indexed block's segment through its generation
(kvcore/vllm/chain_index.py `segment_of`: a caching's run goes to one segment whole): whatever
the runs cached together (`insert_runs`, some continuing earlier segments) and the blocks
evicted, every indexed block's segment, found that way, holds it as a live entry, and the
segments' live counts are those of a model that keeps each block's segment. About 1 s."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.vllm.chain_index import ChainIndex
from tests.kvcore.draws import chain_runs

N = 60  # blocks 1..N

# each step: ("cache", [(run length, continue a chain?) ...]) | ("evict", seed, how many)
_RUNS = st.lists(st.tuples(st.integers(1, 6), st.booleans()), min_size=1, max_size=4)
_STEP = st.one_of(st.tuples(st.just("cache"), _RUNS),
                  st.tuples(st.just("evict"), st.integers(0, 2**16), st.integers(1, 12)))


@settings(max_examples=80, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=30))
def test_an_indexed_blocks_segment_is_its_generations(steps: list[tuple]) -> None:
    idx = ChainIndex(N)
    bh = np.zeros(N + 1, dtype=np.uint64)  # the pool's per-block hash and parent hash
    ph = np.zeros(N + 1, dtype=np.uint64)
    free = list(range(1, N + 1))
    ends: list[tuple[int, int, int]] = []  # (last block, its hash, chain end) of each chain
    model: dict[int, int] = {}  # indexed block -> segment id
    nxt = 1
    for step in steps:
        if step[0] == "cache":
            every, hashes, runs, free, nxt = chain_runs(step[1], free, ends, nxt)
            if not runs:
                continue
            b = np.array(every, dtype=np.int64)
            hs = np.array(hashes, dtype=np.uint64)
            at = 0
            for k, parent, _, _ in runs:
                bh[b[at : at + k]] = hs[at : at + k]
                ph[b[at]] = parent
                ph[b[at + 1 : at + k]] = hs[at : at + k - 1]
                at += k
            idx.insert_runs(b, hs, runs)
            newest: dict[int, tuple[int, int]] = {}  # block -> (entry generation, segment)
            for seg in idx.segments.values():  # (an evicted block recached is in two)
                for blk, g in zip(seg.blocks.tolist(), seg.gens.tolist(), strict=True):
                    newest[blk] = max(newest.get(blk, (0, 0)), (g, seg.sid))
            for blk in every:  # the model: the segment whose entry for it is the newest
                model[blk] = newest[blk][1]
        elif model:
            rng = np.random.default_rng(step[1])
            held = sorted(model)
            gone = rng.choice(held, size=min(step[2], len(held)), replace=False)
            idx.remove(gone.astype(np.int64))
            for blk in gone.tolist():
                del model[blk]
                free.append(blk)
            ends = [e for e in ends if e[0] in model]
        idx.check_invariants(bh, ph)
        indexed = np.flatnonzero(idx.gen)
        assert sorted(model) == indexed.tolist()
        sids = idx.segment_of(idx.gen[indexed]).tolist()
        assert sids == [model[b] for b in indexed.tolist()]
        for sid, seg in idx.segments.items():
            assert seg.live == sum(1 for s in model.values() if s == sid)
