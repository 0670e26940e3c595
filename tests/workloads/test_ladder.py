"""The QPS ladder (workloads/ladder.py): inference-perf's stage counts and timers, the stage
boundaries and the per-request stage, by property over random ladders.

Cost: about 3 s.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.errors import WorkloadError
from workloads.ladder import (
    Ladder,
    Stage,
    constant_offsets,
    format_ladder,
    parse_ladder,
    poisson_offsets,
)

stages = st.lists(st.builds(Stage, st.sampled_from([0.5, 1.0, 2.5, 3.0, 7.0, 15.0, 60.0]),
                            st.integers(2, 30)),
                  min_size=1, max_size=5).filter(lambda ss: all(s.num_requests >= 1 for s in ss))


@settings(max_examples=60, deadline=None)
@given(stages, st.sampled_from(["poisson", "constant"]), st.floats(0, 5), st.integers(0, 2**31))
def test_stage_counts_boundaries_and_stage_of(ss, kind, gap, seed):
    """Each stage sends int(rate x seconds) requests, all inside (start, start + span], the
    next stage starting `gap` after the last arrival; times sorted; stage_of inverts the
    ranges."""
    ladder = Ladder(tuple(ss), kind, gap)
    t, sched = ladder.generate(np.random.default_rng(seed))
    assert len(sched.stages) == len(ss)
    assert len(t) == sched.num_requests == sum(s.num_requests for s in ss)
    assert np.all(np.diff(t) >= 0)
    for k, (row, stage) in enumerate(zip(sched.stages, ss, strict=True)):
        assert (row.rate, row.duration_s, row.count) == (stage.rate, stage.duration_s,
                                                       stage.num_requests)
        mine = t[row.first: row.first + row.count]
        assert np.all(mine > row.start_s) and np.all(mine <= row.end_s + 1e-9)
        assert mine[-1] == pytest.approx(row.end_s)
        if kind == "constant":  # the gaps add up to the duration exactly
            assert row.span_s == pytest.approx(stage.duration_s)
        if k + 1 < len(ss):
            assert sched.stages[k + 1].start_s == pytest.approx(row.end_s + gap)
            assert sched.stages[k + 1].first == row.first + row.count
    idx = np.arange(len(t))
    expect = np.concatenate([np.full(r.count, r.index) for r in sched.stages])
    assert np.array_equal(sched.stage_of(idx), expect)
    assert sched.stage_of([len(t)])[0] == -1


@settings(max_examples=40, deadline=None)
@given(st.floats(0.2, 80), st.integers(1, 400), st.integers(0, 2**31))
def test_poisson_seconds_end_on_the_second(rate, count, seed):
    """inference-perf's Poisson timer fills whole seconds: in every second but the stage's
    last, the last request leaves at the second's end; none leaves at 0."""
    t = poisson_offsets(rate, count, np.random.default_rng(seed))
    assert len(t) == count and np.all(np.diff(t) >= 0) and t[0] > 0
    sec = np.ceil(t).astype(int) - 1
    for s in np.unique(sec)[:-1]:
        assert t[sec == s].max() == pytest.approx(s + 1.0, abs=1e-12)


def test_rates_hold_over_long_stages():
    """A long stage's span is about count / rate: Poisson counts per second make the time to
    send n requests n / rate +/- sqrt(n) / rate (5 sd here); constant stages end exactly."""
    rng = np.random.default_rng(3)
    for rate in (3.0, 15.0, 60.0):
        n = int(rate * 300)
        span = poisson_offsets(rate, n, rng)[-1]
        assert abs(span - 300) <= 5 * np.sqrt(n) / rate + 1
        assert constant_offsets(n, 300.0, rng)[-1] == 300.0


def test_same_seed_same_times_and_other_seed_other_times():
    ladder = Ladder.parse("15x50,3x20,60x25")
    a = ladder.generate(np.random.default_rng(1))[0]
    b = ladder.generate(np.random.default_rng(1))[0]
    c = ladder.generate(np.random.default_rng(2))[0]
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_bounds_cut_the_ladder():
    ladder = Ladder.parse("10x10,20x10,30x10")
    t, sched = ladder.generate(np.random.default_rng(0), num_requests=150)
    assert len(t) == 150 and [r.count for r in sched.stages] == [100, 50]
    t, sched = ladder.generate(np.random.default_rng(0), duration_s=15.0)
    assert np.all(t < 15.0) and len(sched.stages) == 2


def test_parse_and_format():
    ss = parse_ladder("15x50, 3x20,2.5X4")
    assert ss == (Stage(15.0, 50), Stage(3.0, 20), Stage(2.5, 4))
    assert format_ladder(ss) == "15x50,3x20,2.5x4"
    assert Stage(2.5, 3).num_requests == 7  # int(7.5): inference-perf truncates


@pytest.mark.parametrize("text, words", [
    ("", "empty"), ("3y20", "not RATExSECONDS"), ("3x20,abc", "stage 2"),
    ("0x20", "rate must be > 0"), ("3x0", "duration must be >= 1"),
    ("0.01x20", "sends no request"), ("3x2.5", "not RATExSECONDS"),
])
def test_bad_ladders_get_one_line(text, words):
    with pytest.raises(WorkloadError) as e:
        parse_ladder(text)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_bad_ladder_kind_and_gap():
    with pytest.raises(WorkloadError, match="ladder type"):
        Ladder((Stage(1.0, 2),), "burst")
    with pytest.raises(WorkloadError, match="gap"):
        Ladder((Stage(1.0, 2),), "poisson", -1.0)
