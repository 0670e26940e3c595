"""The summary read from numpy columns (simulator/request_table.py `RequestColumns`) instead of
a pandas frame: the same doubles as pandas' reductions, the same post-run columns from either
form, and a run that reads only its summary never imports pandas.

Cost: the hypothesis test about 0.5 s; the small simulation about 1 s; the subprocess about
3 s (it imports torch).
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.config import SimConfig
from simulator.overload import backlog_floor, delay_by_window, ttft_halves
from simulator.request_table import RequestColumns, nan_mean, nan_median, nan_sum
from simulator.reuse_gap import reuse_gap
from simulator.run import simulate
from workloads import build_workload
from workloads.spec import WorkloadSpec

_FLOATS = st.one_of(st.just(math.nan),
                    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=60, deadline=None)
@given(st.lists(_FLOATS, max_size=300))
def test_reductions_are_pandas_bit_for_bit(values):
    """Lengths past numpy's pairwise-sum blocks, NaN anywhere: pandas fills NaN with 0 and
    sums the whole array, which a sum over the non-NaN values alone would not match."""
    arr = np.array(values, dtype=np.float64)
    s = pd.Series(arr)
    assert _same(nan_mean(arr), float(s.mean()))
    assert _same(nan_median(arr), float(s.median()))
    assert _same(nan_sum(arr), float(s.sum()))
    ints = np.arange(len(values), dtype=np.int64) * 7
    assert nan_sum(ints) == float(pd.Series(ints).sum())


def test_post_run_columns_equal_from_columns_and_frame():
    """The overload and reuse figures read the run's `RequestColumns`; the same functions
    given the pandas frame of it (as tests and callers do) return the same values."""
    w = build_workload(WorkloadSpec(name="chat", num_requests=60, seed=3,
                                    max_context_len=2048))
    res = simulate(w, SimConfig.of(policy="paged", page_size=16, kv_tokens=1200,
                                   max_context_len=2048, latency="constant"))
    table, frame = res.table, res.requests
    assert isinstance(table, RequestColumns) and len(table) == len(frame) > 0
    assert (frame.status == "rejected").any()  # the rejected-row filters are exercised
    assert reuse_gap(w, table, 16) == reuse_gap(w, frame, 16)
    end = float(frame.finish_s.max())
    edges = np.linspace(0.0, end, 5)
    assert np.array_equal(backlog_floor(table, edges), backlog_floor(frame, edges))
    assert np.array_equal(delay_by_window(table, edges), delay_by_window(frame, edges),
                          equal_nan=True)
    assert all(_same(a, b) for a, b in zip(ttft_halves(table, 0.0, end),
                                           ttft_halves(frame, 0.0, end), strict=True))
    assert res.timeline.columns[0] == "time_s" and len(res.timeline) > 0


def test_a_summary_only_run_imports_no_pandas():
    code = ("import sys\n"
            "from simulator.config import SimConfig\n"
            "from simulator.run import simulate\n"
            "from workloads.registry import build_workload\n"
            "from workloads.spec import WorkloadSpec\n"
            "w = build_workload(WorkloadSpec(name='azure-conv', num_requests=40))\n"
            "r = simulate(w, SimConfig.of(policy='paged', page_size=16, kv_tokens=60000))\n"
            "assert r.summary['requests_completed'] == 40, r.summary['requests_completed']\n"
            "print(sorted(m for m in ('pandas', 'pyarrow', 'matplotlib', 'scipy')"
            " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
