"""--max-concurrency (the benchmark clients' closed loop) and inter-token latency (ITL).

Cost: about 3 s (a dozen small constant-latency simulations, hypothesis over numpy only).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.metrics import weighted_percentiles
from tests.simulator.helpers import identical, kshot, run


def in_flight_peak(df: pd.DataFrame) -> int:
    """Most requests between their (send) arrival and finish at any instant; a finish at t
    frees its slot before a send at t."""
    events = sorted([(t, 1) for t in df.arrival_s] + [(t, -1) for t in df.finish_s],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_a_request_beyond_the_bound_is_sent_when_one_finishes():
    res = run(identical(12, 50, 20), max_concurrency=3)
    df = res.requests
    assert (df.status == "completed").all()
    assert in_flight_peak(df) == 3
    arrivals, finishes = np.sort(df.arrival_s.to_numpy()), np.sort(df.finish_s.to_numpy())
    assert (arrivals[:3] == 0).all()
    np.testing.assert_array_equal(arrivals[3:], finishes[:9])  # each sent as one finished
    # the engine never batches more than the clients send; the measurement window is the
    # whole closed-loop run, not the span of the nominal arrivals (all at 0 here)
    assert res.summary["peak_batch_size"] <= 3
    assert res.summary["window_end_s"] == res.summary["sim_end_s"] > 0
    assert res.summary["avg_batch_size"] > 2


def test_rate_and_concurrency_both_bound_the_load():
    w = kshot(n=40, rate=20.0)
    nominal = {r.request_id: r.arrival_s for r in w.requests}
    free = run(w)
    bound = run(w, max_concurrency=2)
    df = bound.requests
    assert in_flight_peak(df) <= 2 < in_flight_peak(free.requests)
    assert all(row.arrival_s >= nominal[row.request_id] for row in df.itertuples())
    assert (df.arrival_s > df.request_id.map(nominal)).any()  # some waited for a slot
    # a bound nobody reaches changes no request (only the window: a gated run is measured to
    # its end, since its sends are not known in advance)
    loose = run(w, max_concurrency=1000)
    pd.testing.assert_frame_equal(free.requests, loose.requests)
    for k in ("ttft_p99_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s", "throughput_tok_s"):
        assert free.summary[k] == loose.summary[k], k


def test_stretches_equal_stepping_under_a_concurrency_bound():
    w = kshot(n=30, rate=50.0)
    a = run(w, max_concurrency=4)
    b = run(w, max_concurrency=4, max_steps_per_stretch=1)
    for k in a.summary:
        if k not in ("sim_wall_s", "max_steps_per_stretch"):
            assert str(a.summary[k]) == str(b.summary[k]), k
    pd.testing.assert_frame_equal(a.requests, b.requests)


def test_itl_at_batch_one_is_the_decode_step():
    res = run(identical(3, 40, 12, spacing_s=5.0))  # constant model: 0.02 s per decode step
    s = res.summary
    assert s["itl_p50_s"] == pytest.approx(0.02, rel=1e-9)  # differences of clock times
    assert s["itl_p99_s"] == pytest.approx(0.02, rel=1e-9)
    assert s["tpot_p50_s"] == pytest.approx(s["itl_p50_s"], rel=1e-9)


def test_itl_pools_gaps_over_requests_and_differs_from_tpot():
    """A request that waits behind another's prefill has one long gap: ITL p99 sees it,
    while its TPOT (a mean over its tokens) dilutes it."""
    res = run(kshot(n=30, rate=40.0))
    s = res.summary
    assert s["itl_p99_s"] > s["tpot_p99_s"]
    assert s["itl_p50_s"] >= 0.02  # no gap is shorter than a decode step


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(0, 10, allow_nan=False), min_size=1,
                                   max_size=6), st.integers(1, 5)), min_size=1, max_size=8),
       st.sampled_from([0, 1, 25, 50, 90, 99, 100]))
def test_weighted_percentiles_equal_numpy_on_the_expanded_gaps(groups, q):
    arrays = [(np.array(v), c) for v, c in groups]
    flat = np.concatenate([np.repeat(v, c) for v, c in arrays])
    assert weighted_percentiles(arrays, (q,))[0] == float(np.percentile(flat, q))
