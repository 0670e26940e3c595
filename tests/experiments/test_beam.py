"""The beam-search memory model: block-table invariants under any fork/prune sequence, the two
closed-form extremes, and the survivor processes staying between them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.validation.beam import (
    SURVIVORS,
    BeamConfig,
    BeamGroup,
    beam_memory,
    sharing_bounds,
    top_logits,
)
from kvcore.sglang.allocator import PagedAllocator


def _group(prompt: int, width: int, ps: int, longest: int):
    alloc = PagedAllocator(width * -(-longest // ps), ps)
    refs = np.zeros(alloc.num_pages + 1, dtype=np.int64)
    return alloc, refs, BeamGroup(alloc, refs, prompt)


@settings(max_examples=150, deadline=None)
@given(prompt=st.integers(1, 40), ps=st.sampled_from([1, 2, 4, 16]), width=st.integers(1, 5),
       data=st.data())
def test_invariants_under_any_fork_and_prune(prompt, ps, width, data) -> None:
    steps = data.draw(st.integers(0, 30), label="steps")
    alloc, refs, g = _group(prompt, width, ps, prompt + steps + 1)
    g.check_invariants()
    beams = 1
    for _ in range(steps):
        parents = data.draw(st.lists(st.integers(0, beams - 1), min_size=width,
                                     max_size=width), label="parents")
        g.fork(parents)
        g.check_invariants()  # refcount = holders, nothing free and held, held = distinct
        beams = width
        g.append()
        g.check_invariants()
        assert g.held <= g.own_pages()
    g.release()
    g.check_invariants()
    assert alloc.free_page_count() == alloc.num_pages and not refs.any()
    alloc.check_invariants()


def test_copy_on_write_by_hand() -> None:
    # prompt 20 at page 16: one full page and a partial one, shared by both first beams
    alloc, refs, g = _group(20, 2, 16, 40)
    g.fork([0, 0])
    assert g.held == 2 and refs[g.tables[0][-1]] == 2
    g.append()  # beam 0 copies the shared partial page, beam 1 then writes in place
    assert g.held == 3 and g.own_pages() == 4
    assert g.tables[0][0] == g.tables[1][0] and g.tables[0][1] != g.tables[1][1]
    g.fork([1, 1])  # beam 0 dies: only its private page goes back
    assert g.held == 2 and alloc.free_page_count() == alloc.num_pages - 2
    g.check_invariants()
    with pytest.raises(ValueError, match="parents"):
        g.fork([0, 2])


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 80), st.integers(1, 60)), min_size=1,
                        max_size=6),
       width=st.integers(1, 6), ps=st.sampled_from([1, 4, 16]))
def test_extremes_match_the_closed_forms(lengths, width, ps) -> None:
    p, o = (np.array(x) for x in zip(*lengths, strict=True))
    lo, hi = sharing_bounds(p, o, width, ps)
    ind = beam_memory(p, o, BeamConfig(width, page_size=ps, survivors="independent"))
    coal = beam_memory(p, o, BeamConfig(width, page_size=ps, survivors="coalesced"))
    if ind.steps == 0:
        assert np.isnan(lo) and np.isnan(ind.saved_pct)
        return
    assert ind.saved_pct == pytest.approx(lo, abs=1e-9)
    assert coal.saved_pct == pytest.approx(hi, abs=1e-9)
    assert ind.steps == int((o - 1).sum()) and coal.groups == len(lengths)


@pytest.mark.parametrize("survivors", ["top-k", "uniform"])
def test_stochastic_survivors_lie_between_the_bounds(survivors) -> None:
    rng = np.random.default_rng(3)
    p = rng.integers(1, 60, 40)
    o = rng.integers(1, 120, 40)
    for k in (2, 4):
        cfg = BeamConfig(k, survivors=survivors, seed=5)
        m = beam_memory(p, o, cfg, check=True)
        lo, hi = sharing_bounds(p, o, k)
        assert lo - 1e-9 <= m.saved_pct <= hi + 1e-9
        assert m.saved_pct > lo + 1  # some beams do share their decoded history
        assert beam_memory(p, o, cfg) == m  # seeded: the same every time
    # width 1 shares nothing
    assert beam_memory(p, o, BeamConfig(1, survivors=survivors)).saved_pct == 0.0


def test_top_logits_are_the_top_order_statistics() -> None:
    rng = np.random.default_rng(0)
    fast = top_logits(rng, (20_000,), 3, 200)
    assert (np.diff(fast, axis=-1) < 0).all()
    brute = -np.sort(-rng.standard_normal((20_000, 200)), axis=-1)[:, :3]
    assert fast.mean(axis=0) == pytest.approx(brute.mean(axis=0), abs=0.02)
    assert fast.std(axis=0) == pytest.approx(brute.std(axis=0), abs=0.02)


def test_config_is_checked() -> None:
    assert set(SURVIVORS) == {"top-k", "uniform", "coalesced", "independent"}
    with pytest.raises(ValueError):
        BeamConfig(0)
    with pytest.raises(ValueError):
        BeamConfig(2, survivors="best")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        beam_memory([1, 2], [3], BeamConfig(2))
