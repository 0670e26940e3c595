"""A day of traffic without a million objects: generated requests held as columns
(workloads/columns.py) and the reuse passes' compact tree (workloads/run_tree.py) give
exactly what the objects and the plain tree gave.

Cost: about 1-2.5 s (two 60-request simulations under 1 s; the hypothesis test, every
example merged after each edge, 0.7-1.7 s).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import reuse_gap as reuse_gap_mod
from simulator.config import SimConfig
from simulator.reuse_gap import reuse_gap
from simulator.run import simulate
from workloads import build_workload, run_tree
from workloads.columns import GeneratedRequests, Reordered, arrival_order
from workloads.request import PromptSpec, Request, Workload, unique_prompt
from workloads.reuse import (
    RunRadixTree,
    final_runs,
    ideal_reuse_hits,
    sequence_runs,
    timed_reuse_hits,
)
from workloads.spec import WorkloadSpec


def _day(n: int = 60) -> Workload:
    return build_workload(WorkloadSpec(name="sharegpt", arrival="diurnal", rate=5.0,
                                       num_requests=n, seed=2))


def _as_list(w: Workload) -> Workload:
    return Workload(w.name, list(w.requests), seed=w.seed, meta=dict(w.meta))


def test_columns_build_the_requests_the_generator_built():
    w = _day()
    cols = w.requests
    assert isinstance(cols, GeneratedRequests) and len(cols) == 60
    for i, r in enumerate(cols):
        assert r == Request(i, float(cols.arrivals[i]),
                            unique_prompt(2, i, int(cols.prompt_lens[i])),
                            int(cols.output_lens[i]), int(cols.max_new[i]), seed=2)
    tail = cols[50:]
    assert isinstance(tail, GeneratedRequests) and tail[0] == cols[50] and cols[-1] == tail[-1]
    assert list(pickle.loads(pickle.dumps(cols))) == list(cols)
    assert arrival_order(cols) is cols  # generated in arrival order: nothing to sort
    assert cols[:2] + [cols[5]] == [cols[0], cols[1], cols[5]]  # noqa: RUF005  (a list)
    assert [cols[5]] + cols[:1] == [cols[5], cols[0]]  # noqa: RUF005
    with pytest.raises(IndexError, match="out of range"):
        cols[60]
    with pytest.raises(ValueError, match="prompt_lens has 1 values for 2 arrivals"):
        GeneratedRequests(np.zeros(2), np.ones(1), np.ones(2), np.ones(2))


def test_unsorted_columns_are_read_in_arrival_order():
    cols = GeneratedRequests(np.array([3.0, 1.0, 1.0]), np.array([5, 6, 7]),
                             np.array([1, 1, 1]), np.array([1, 1, 1]))
    order = arrival_order(cols)
    assert isinstance(order, Reordered)
    assert [r.request_id for r in order] == [1, 2, 0]
    w = Workload("w", cols)
    assert [r.request_id for r in w.nominal_order()] == \
        [r.request_id for r in w.nominal_requests()]


def test_a_run_over_columns_equals_the_run_over_objects():
    """The same summary and rows, reuse gap and overload verdict included, whether the
    workload is columns or the list of the requests they build."""
    w = _day()
    cfg = SimConfig.of(policy="paged", page_size=16, kv_tokens=6000, latency="roofline")
    a, b = simulate(w, cfg), simulate(_as_list(w), cfg)
    for k in a.summary:
        if k != "sim_wall_s":
            x, y = a.summary[k], b.summary[k]
            assert x == y or (x != x and y != y), k
    assert a.requests.equals(b.requests)
    assert reuse_gap(w, a.requests, 16) == reuse_gap(_as_list(w), b.requests, 16)


def test_reuse_gap_with_shared_runs_equals_runs_built_per_pass(monkeypatch) -> None:
    """A run of up to SHARED_RUNS requests builds its runs once for both reuse passes; a
    longer one (a day) builds them as each pass goes: the same figures. About 0.3 s."""
    w = _day()
    res = simulate(w, SimConfig.of(policy="paged", page_size=16, kv_tokens=6000))
    shared = reuse_gap(w, res.requests, 16)
    monkeypatch.setattr(reuse_gap_mod, "SHARED_RUNS", 0)
    assert reuse_gap(w, res.requests, 16) == shared
    assert shared["ideal_hit_rate"] == shared["ideal_hit_rate"]  # computed, not NaN


def test_final_runs_extend_the_prompt_runs_as_sequence_runs_does():
    r = Request(4, 0.0, PromptSpec((("ids", np.array([5, 6, 9])),)), 3, 3,
                output_namespace=0)
    assert sequence_runs(r) == [(5, 2), (9, 1)]
    assert final_runs(r, sequence_runs(r)) == sequence_runs(r, r.final_len) == \
        [(5, 2), (9, 1), (0, 2)]
    # an output run that continues the prompt's last run joins it
    r = Request(4, 0.0, PromptSpec((("unique", 0, 3, 0),)), 4, 4, output_namespace=0)
    assert final_runs(r, sequence_runs(r)) == sequence_runs(r, r.final_len)


_SEG = st.one_of(
    st.lists(st.integers(0, 6), min_size=1, max_size=6).map(
        lambda x: ("ids", np.array(x, dtype=np.int64))),
    st.tuples(st.just("unique"), st.sampled_from([20000, 20001]), st.integers(1, 5),
              st.integers(0, 4)),
)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.lists(_SEG, min_size=1, max_size=4), st.integers(0, 4),
                          st.sampled_from([None, 20000]), st.integers(0, 3)),
                min_size=1, max_size=12),
       st.sampled_from([1, 2, 4]))
def test_compact_tree_merging_often_answers_as_it_did(reqs, page_size):
    """With its buffer merged into the sorted columns after every edge, the tree gives the
    ideal and timed hits that it gives unmerged (and that the brute-force tests check)."""
    w = Workload("w", [Request(i, float(t), PromptSpec(tuple(s)), o, max(o, 1),
                               output_namespace=ns) for i, (s, o, ns, t) in enumerate(reqs)])
    times = {r.request_id: float(r.arrival_s) for r in w.requests}
    done = {k: v + 0.5 for k, v in times.items()}
    want = (ideal_reuse_hits(w, page_size).hits, timed_reuse_hits(w, page_size, times, done,
                                                                    done))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run_tree, "MERGE_MIN", 1)
        assert RunRadixTree()._merge_min == 1
        got = (ideal_reuse_hits(w, page_size).hits,
               timed_reuse_hits(w, page_size, times, done, done))
    assert np.array_equal(got[0], want[0]) and got[1] == want[1]
