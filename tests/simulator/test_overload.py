"""The overload verdict (simulator/overload.py) and the reuse-gap split (simulator/reuse_gap.py):
each threshold on both sides, and real simulations that are and are not overloaded."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.model.presets import get_gpu, get_model
from simulator.latency import make_latency_model
from simulator.overload import (
    THRESHOLDS,
    Unfinished,
    backlog_floor,
    delay_by_window,
    overload_verdict,
    queue_growth,
    theil_sen,
    unloaded_prefill_s,
    window_arrivals,
)
from tests.simulator.helpers import chat, identical, kshot, run
from workloads.request import Workload

LAT = make_latency_model("constant", get_model("opt-13b"), get_gpu("a100-40gb"), 1, "fp16")


def _requests(arrivals: np.ndarray, admits: np.ndarray, ttft: float = 0.05) -> pd.DataFrame:
    return pd.DataFrame({"arrival_s": arrivals, "admit_s": admits, "status": "completed",
                         "ttft_s": ttft})


def _stream(n=100, span=100.0, admit_rate=None) -> tuple[np.ndarray, np.ndarray]:
    """`n` arrivals evenly over [0, span]; admitted on arrival, or at `admit_rate` per second
    (the service rate) when that is slower."""
    t = np.linspace(0, span, n)
    admit = t if admit_rate is None else np.maximum(t, np.arange(n) / admit_rate)
    return t, admit


def _verdict(arrivals, admits, *, start=0.0, end=None, backlog=0, rows=True, prompt=100):
    end = float(arrivals.max()) if end is None else end
    req = _requests(arrivals, admits)
    return overload_verdict(
        arrivals=arrivals, prompt_lens=np.full(len(arrivals), prompt),
        requests=req if rows else req.iloc[:0], start=start, end=end, backlog=backlog,
        latency=LAT, chunk=0, page_size=16)


def test_unloaded_prefill_sums_the_chunks():
    whole = unloaded_prefill_s(LAT, 1000, 0, 16)
    assert whole == pytest.approx(LAT.iteration_time([(1000, 0)], (), 16))
    chunked = unloaded_prefill_s(LAT, 1000, 256, 16)
    assert chunked == pytest.approx(sum(LAT.iteration_time([(min(256, 1000 - b), b)], (), 16)
                                        for b in range(0, 1000, 256)))
    assert unloaded_prefill_s(LAT, 0, 256, 16) == 0.0


@given(slope=st.floats(-5, 5), icpt=st.floats(-100, 100),
       outliers=st.lists(st.tuples(st.integers(0, 9), st.floats(-1e6, 1e6)), max_size=2))
@settings(max_examples=60, deadline=None)
def test_theil_sen_ignores_two_outlying_windows_of_ten(slope, icpt, outliers):
    """Ten points on a line, up to two replaced by anything (a burst): the slope is the
    line's, exactly (the median of the 45 pairwise slopes is one of the 28 clean ones)."""
    x = np.arange(10, dtype=float)
    y = icpt + slope * x
    for i, v in outliers:
        y[i] = v
    assert theil_sen(x, y) == pytest.approx(slope, abs=1e-6 * (1 + abs(icpt) + abs(slope)))
    assert theil_sen(x[:1], y[:1]) == 0.0


@given(rate=st.floats(0.5, 20), ratio=st.floats(0.1, 1.0))
@settings(max_examples=30, deadline=None)
def test_backlog_floor_grows_at_arrivals_minus_admissions(rate, ratio):
    """Arrivals at `rate`, admissions at `ratio` x rate: the queue never drains and its low
    point grows at the difference; requests never admitted stay queued; nothing outside the
    window counts."""
    n = 2000
    t = np.arange(n) / rate
    admit = np.arange(n) / (rate * ratio)
    admit[admit > t[-1]] = np.nan  # not admitted within the run
    req = pd.DataFrame({"arrival_s": t, "admit_s": admit, "status": "completed"})
    span = t[-1]
    got = queue_growth(req, 0.0, span)
    assert got == pytest.approx(rate * (1 - ratio), abs=0.02 * rate + 0.05)
    assert queue_growth(req, 0.0, math.inf) == 0.0
    assert queue_growth(req.iloc[:0], 0.0, span) == 0.0


def test_backlog_floor_is_the_low_point_of_each_window():
    # queue: 0 until 1, 3 arrivals at 1, one admitted at 2 and 3 -> floor of [0, 2] is 0,
    # of [2, 4] is 1 (after the admission at 3)
    req = pd.DataFrame({"arrival_s": [1.0, 1.0, 1.0], "admit_s": [2.0, 3.0, np.nan],
                        "status": "completed"})
    assert list(backlog_floor(req, np.array([0.0, 2.0, 4.0]))) == [0.0, 1.0]
    rejected = req.assign(status=["completed", "completed", "rejected"])
    assert list(backlog_floor(rejected, np.array([0.0, 2.0, 4.0]))) == [0.0, 0.0]


def test_a_light_run_is_not_overloaded():
    v = _verdict(*_stream())
    assert v["overloaded"] is False and v["overload_reason"] == ""
    assert v["queue_growth_req_s"] == 0.0 and v["queue_delay_growth"] == 0.0


def test_a_burst_at_the_window_end_is_not_overload():
    """The issue's case: a light stream whose slice ends in a burst of 30 requests within
    1.2 s, 25 of them still queued at the last arrival. The old rule read that backlog at one
    instant and called it overload; the floor and the wait of the other windows are flat."""
    t, admit = _stream()
    burst = 100.0 + np.linspace(0, 1.2, 30)
    burst_admit = np.where(np.arange(30) < 5, burst + 0.1, np.nan)
    v = _verdict(np.concatenate([t, burst]), np.concatenate([admit, burst_admit]),
                 backlog=25)
    assert v["overloaded"] is False, v["overload_reason"]


def test_a_drained_burst_mid_run_is_not_overload():
    t, admit = _stream(n=200, span=200.0)
    burst = 100.0 + np.linspace(0, 2.0, 80)  # 40 req/s for 2 s, drained in 8 s
    burst_admit = 102.0 + np.arange(80) * 0.1
    v = _verdict(np.concatenate([t, burst]), np.concatenate([admit, burst_admit]))
    assert v["overloaded"] is False, v["overload_reason"]


def test_sustained_overload_fires_both_signals():
    v = _verdict(*_stream(admit_rate=0.8))  # 1 req/s in, 0.8 served: the queue grows
    assert v["overloaded"]
    assert "backlog floor" in v["overload_reason"] and "queueing delay" in v["overload_reason"]
    assert v["queue_growth_req_s"] == pytest.approx(0.2, abs=0.03)
    assert v["queue_delay_growth"] == pytest.approx(0.25, abs=0.04)  # (1 - 0.8) / 0.8


def test_backlog_floor_threshold_both_sides():
    slow = _verdict(*_stream(admit_rate=0.97))  # +3 % of arrivals: below 5 %
    assert "backlog floor" not in slow["overload_reason"]
    # the same 20 % shortfall on a 5 s window adds up to 1 request: no trend
    short = _verdict(*_stream(n=6, span=5.0, admit_rate=0.96))
    assert "backlog floor" not in short["overload_reason"]


def test_queueing_delay_alone_decides_a_sparse_stream():
    """10 requests over 100 s, served at half their rate: the queue adds up to 5 requests
    (below the 10-request floor), but each waits ~1 s longer per second of trace."""
    v = _verdict(*_stream(n=10, span=100.0, admit_rate=0.045))
    assert v["overloaded"] and v["overload_reason"].startswith("queueing delay"), v
    assert "backlog floor" not in v["overload_reason"]
    # a wait growing 0.04 s per s (below 0.05) is not overload
    t = np.linspace(0, 100, 100)
    assert not _verdict(t, t + 0.04 * t)["overloaded"]
    # one growing 0.5 s per s over a 1 s window adds up to half a second: no
    t = np.linspace(0, 1, 20)
    assert not _verdict(t, t + 0.5 * t)["overloaded"]
    assert THRESHOLDS.delay_margin_s == 1.0


def test_a_request_never_admitted_waits_until_the_window_end():
    """Issue 39 item 7: the wait of a request not admitted by the window end is censored at
    that end (not 0, not its own window's end), and the requests the run ended with count.
    Window [0, 10): a row admitted after 0.5 s, two queued from 2 and 3 s (never admitted:
    18 and 17 s to the end at 20) -> median 17. Window [10, 20]: one admitted after 1 s,
    two never admitted from 14 and 16 s (6 and 4 s) -> median 4."""
    rows = _requests(np.array([1.0]), np.array([1.5]))
    left = Unfinished(np.array([2.0, 3.0, 12.0, 14.0, 16.0]),
                      np.array([np.nan, np.nan, 13.0, np.nan, np.nan]))
    edges = np.array([0.0, 10.0, 20.0])
    assert delay_by_window(rows, edges, left).tolist() == [17.0, 4.0]
    # without the unfinished requests only the completed row is seen
    assert delay_by_window(rows, edges)[0] == 0.5


def test_the_arrival_rate_counts_the_window_only():
    """Issue 39 item 7: the backlog floor's growth is compared with the arrivals of the
    window [start, end] (both ends in), not with the warmup's. 2 req/s over 200 s, a 100 s
    warmup served on arrival, then 1.86 req/s served: the floor grows 0.13 req/s, 7 % of the
    window's 2.01 req/s (over the 5 % threshold); counted over all 401 arrivals it would read
    3 % and miss the overload."""
    assert window_arrivals(np.array([5.0, 10.0, 15.0, 20.0, 25.0]), 10.0, 20.0) == 3
    t = np.linspace(0, 200, 401)
    admit = t.copy()
    late = t > 100
    admit[late] = np.maximum(t[late], 100 + np.arange(late.sum()) / 1.86)
    assert window_arrivals(t, 100.0, 200.0) == 201
    v = _verdict(t, admit, start=100.0, end=200.0)
    assert v["queue_growth_req_s"] == pytest.approx(0.1333, rel=0.01)
    assert "backlog floor" in v["overload_reason"] and "(7% of arrivals" in v["overload_reason"]


@pytest.mark.parametrize("backlog, flagged", [(10, False), (11, True)])
def test_without_rows_the_backlog_at_the_end_decides(backlog, flagged):
    # 100 requests: the fallback threshold is max(10, 5 % of 100) = 10
    v = _verdict(*_stream(), backlog=backlog, rows=False)
    assert v["overloaded"] is flagged
    assert ("no per-request rows" in v["overload_reason"]) is flagged


def test_simulations_flag_an_overloaded_stream_and_not_a_light_one():
    heavy = run(identical(200, 400, 200, spacing_s=0.001), check_invariants=False)
    assert heavy.summary["overloaded"] and heavy.summary["queue_backlog"] > 10
    assert "backlog floor" in heavy.summary["overload_reason"]
    light = run(identical(20, 100, 20, spacing_s=5.0), check_invariants=False)
    assert not light.summary["overloaded"] and light.summary["overload_reason"] == ""


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _brute_force_gap(w, q: pd.DataFrame, page_size: int) -> dict[str, float]:
    """The reuse-gap columns recomputed the plain way, from token ids and the request rows:
    for each admitted request, its longest common prefix with every earlier request's prompt +
    output (nominal order: the ideal), or with the prompts / sequences already computed when it
    was admitted (the run's timing), capped at prompt - 1 and floored to pages. Shares no code
    with workloads/reuse.py (no runs, no radix tree)."""
    reqs = w.nominal_requests()
    prompt = {r.request_id: r.prompt_ids() for r in reqs}
    seq = {r.request_id: r.sequence_ids(r.final_len) for r in reqs}
    rows = q.set_index("request_id")
    admitted = rows[rows.admit_s.notna()]

    def best(rid: int, sources) -> int:
        m = min(max((_lcp(prompt[rid], s) for s in sources), default=0),
                max(len(prompt[rid]) - 1, 0))
        return m

    ideal1 = ideal_ps = timed = 0
    order = [r.request_id for r in reqs]
    for i, rid in enumerate(order):
        if rid not in admitted.index:
            continue
        m = best(rid, [seq[j] for j in order[:i]])
        ideal1 += m
        ideal_ps += m - m % page_size
        t = admitted.at[rid, "admit_s"]
        done = [seq[j] if rows.at[j, "finish_s"] <= t else prompt[j] for j in rows.index
                if j != rid and pd.notna(rows.at[j, "first_token_s"])
                and rows.at[j, "first_token_s"] <= t]
        mt = best(rid, done)
        timed += mt - mt % page_size
    total = admitted.prompt_len.sum()
    achieved = admitted.cached_tokens.sum()
    return {"ideal_hit_rate": ideal1 / total, "reuse_gap_alignment": (ideal1 - ideal_ps) / total,
            "reuse_gap_not_arrived": (ideal_ps - timed) / total,
            "reuse_gap_capacity": (timed - achieved) / total,
            "prefix_hit_rate": achieved / total}


def test_a_simulated_burst_at_the_end_is_not_overload():
    """A real engine: 60 light requests a second apart, then 60 within 0.3 s just before the
    window ends. Many are still queued at the last arrival (the old one-instant rule's
    'backlog'), but the engine was idle most of the run: not overloaded."""
    light = identical(60, 100, 10, spacing_s=1.0)
    burst = identical(60, 100, 10, spacing_s=0.005, seed=12)
    reqs = list(light.requests) + [
        replace(r, request_id=60 + r.request_id, arrival_s=59.5 + r.arrival_s)
        for r in burst.requests]
    w = Workload("burst", reqs, seed=11)
    s = run(w, check_invariants=False, max_running_requests=8).summary
    assert s["queue_backlog"] > 10  # what the old rule read at one instant
    assert not s["overloaded"], s["overload_reason"]


@pytest.mark.parametrize("policy", ["paged", "paged-nocache", "vllm"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_reuse_gap_matches_a_brute_force_count(policy, page_size):
    """Each reuse-gap part equals the same quantity counted independently (token-by-token
    prefix matches over the request rows), not merely their sum: the parts add up to the ideal
    by construction, so a sum check could not fail."""
    for w in (kshot(), chat()):
        r = run(w, policy=policy, page_size=page_size)
        s = r.summary
        want = _brute_force_gap(w, r.requests, page_size)
        for col, v in want.items():
            assert s[col] == pytest.approx(v, abs=1e-12), (col, s[col], v)
        assert s["reuse_gap_alignment"] >= 0
        if page_size == 1:
            assert s["reuse_gap_alignment"] == 0
        if policy == "paged-nocache":  # nothing cached: all that was there is lost to capacity
            assert s["prefix_hit_rate"] == 0 and s["reuse_gap_capacity"] > 0
        else:
            assert s["prefix_hit_rate"] > 0


def test_a_roomy_cache_loses_nothing_to_capacity():
    s = run(kshot(rate=0.5), kv_tokens=1 << 16, page_size=1).summary
    assert s["ideal_hit_rate"] > 0.3
    assert s["reuse_gap_capacity"] == pytest.approx(0, abs=1e-12)
    assert s["prefix_hit_rate"] == pytest.approx(s["ideal_hit_rate"] - s["reuse_gap_not_arrived"])


def test_the_timeline_drops_to_what_is_held_across_an_idle_gap():
    """Two requests 100 s apart: the timeline has rows at both ends of the gap with no token
    states (only cache), so a step plot does not carry the busy sample across 100 idle s
    (issue 26 item 6; tens of milliseconds)."""
    res = run(identical(2, 100, 10, spacing_s=100.0), check_invariants=False)
    tl = res.timeline
    first_done = float(res.requests["finish_s"].min())
    gap = tl[(tl["time_s"] >= first_done) & (tl["time_s"] <= 100.0)]
    assert len(gap) >= 2, tl
    assert (gap["token_states"] == 0).all() and (gap["running"] == 0).all()
    assert gap["time_s"].max() == pytest.approx(100.0)


def test_requests_the_run_ended_with_count_in_the_verdict():
    """Issue 38 item 11: only the completed requests have rows. A queue that grows to
    hundreds of requests which never got through is invisible in those rows (the backlog
    floor read -1.73 req/s); counted from the engine (`Unfinished`), the same run is
    overloaded, and its never-admitted requests' waits count (censored at the window end)."""
    from simulator.overload import Unfinished

    t, admit = _stream(n=300, span=10.0, admit_rate=3.0)  # 30 req/s in, 3 req/s served
    done = admit <= 10.0
    rows = _requests(t[done], admit[done])
    common = {"arrivals": t, "prompt_lens": np.full(300, 100), "start": 0.0, "end": 10.0,
              "backlog": int((~done).sum()), "latency": LAT, "chunk": 0, "page_size": 16}
    blind = overload_verdict(requests=rows, **common)
    assert "backlog floor" not in blind["overload_reason"]
    assert blind["queue_growth_req_s"] <= 0.5
    left = Unfinished(t[~done], np.full(int((~done).sum()), np.nan))
    assert left.count == left.queued == 269
    seen = overload_verdict(requests=rows, unfinished=left, **common)
    assert seen["overloaded"] and "backlog floor" in seen["overload_reason"]
    assert seen["queue_growth_req_s"] == pytest.approx(27.0, rel=0.15)


def test_a_no_drain_run_that_ends_with_a_queue_is_overloaded(tmp_path):
    """The real case: 300 Mooncake requests replayed at 100 req/s without draining: one
    completes and 280 are still queued at the end, which the verdict must see (it read
    "not overloaded", growth 0, from the one completed row)."""
    from typer.testing import CliRunner

    from cli import app

    out = tmp_path / "r"
    r = CliRunner().invoke(app, ["run", "--workload", "mooncake-conv", "--num-requests", "300",
                                 "--rate", "100", "--no-drain", "--no-progress", "--out",
                                 str(out)])
    assert r.exit_code == 0, r.output
    row = pd.read_csv(out / "summary.csv").iloc[0]
    assert row["queue_backlog"] > 200 and row["requests_completed"] < 10
    assert bool(row["overloaded"]) and row["queue_growth_req_s"] > 50
    assert "warning: overloaded" in r.output
