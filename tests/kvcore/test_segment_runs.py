"""A chain index segment keeps appended runs by reference and writes its arrays when read
(kvcore/vllm/chain_index.py `Segment.append` / `_join`): whatever the order of appends, reads
and cuts, its blocks, hashes and generations are those of a segment written at every
append (the model: plain lists), and the index's checks count pending runs. About 1 s."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.contract.validation import InvariantError
from kvcore.vllm.chain_index import ChainIndex, Segment

# each step: ("append", run length, entries around it) | ("read",) | ("cut", fraction of n
# kept); with entries around it, the run is a part of a larger caching call's arrays
# (`Segment.append_part`, as `ChainIndex.insert_runs` appends)
_STEP = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 40), st.integers(0, 3)),
    st.tuples(st.just("read")),
    st.tuples(st.just("cut"), st.floats(0.05, 1.0)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=40))
def test_a_segment_reads_what_was_appended(steps: list[tuple]) -> None:
    seg = Segment(1, 3)
    blocks: list[int] = []
    hashes: list[int] = []
    gens: list[int] = []
    nxt, gen = 1, 0
    for step in steps:
        if step[0] == "append":
            k, pad = step[1], step[2]
            gen += 1
            b = np.arange(nxt, nxt + k, dtype=np.int64)
            h = (b * 7919 + 11).astype(np.uint64)
            nxt += k
            if pad:  # other runs' entries on both sides, never read through this segment
                wide = np.arange(-pad, k + pad, dtype=np.int64) + b[0]
                wide[:pad] = wide[-pad:] = -1
                seg.append_part(wide, (wide * 7919 + 11).astype(np.uint64), pad, pad + k, gen)
            else:
                seg.append(b, h, gen)
            blocks += b.tolist()
            hashes += h.tolist()
            gens += [gen] * k
            # the caller never writes its arrays again; a fresh array per run here
        elif step[0] == "read":
            assert seg.blocks.tolist() == blocks
            assert seg.hashes.tolist() == hashes
            assert seg.gens.tolist() == gens
        elif blocks:
            end = max(1, int(len(blocks) * step[1]))
            seg.cut(end)
            del blocks[end:], hashes[end:], gens[end:]
        assert seg.n == len(blocks) and seg.end == 3 + len(blocks)
        if blocks:
            assert (seg.last_block, seg.last_hash) == (blocks[-1], hashes[-1])
    assert seg.blocks.tolist() == blocks
    assert seg.hashes.tolist() == hashes
    assert seg.gens.tolist() == gens


def test_the_index_checks_pending_runs() -> None:
    idx = ChainIndex(64)
    blocks = np.arange(1, 9, dtype=np.int64)
    hashes = np.arange(100, 108, dtype=np.uint64)
    bh = np.zeros(65, dtype=np.uint64)
    ph = np.zeros(65, dtype=np.uint64)
    bh[blocks] = hashes
    ph[blocks[1:]] = hashes[:-1]
    idx.insert_runs(blocks[:4], hashes[:4], [(4, 0, 0, 0)])
    idx.insert_runs(blocks[4:], hashes[4:], [(4, int(hashes[3]), 4, 4)])
    (seg,) = idx.segments.values()
    assert len(seg.pending) == 2  # nothing written yet
    idx.check_invariants(bh, ph)  # reads them (and so joins)
    assert not seg.pending and seg.blocks.tolist() == blocks.tolist()
    seg.append(np.array([9], dtype=np.int64), np.array([108], dtype=np.uint64), 3)
    seg.n += 1  # a run miscounted
    try:
        idx.check_invariants(bh, ph)
    except InvariantError as err:
        assert "pending" in str(err)
    else:
        raise AssertionError("a miscounted pending run passed the index's checks")
    seg.n -= 1
    seg.pending.append((blocks, hashes, 3, 3, 4))  # an empty part: the counts still agree
    try:
        idx.check_invariants(bh, ph)
    except InvariantError as err:
        assert "pending" in str(err)
    else:
        raise AssertionError("an empty pending part passed the index's checks")
