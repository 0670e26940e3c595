"""The overload verdict (simulator/overload.py) and the reuse-gap split (simulator/reuse_gap.py):
each threshold on both sides, and real simulations that are and are not overloaded."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.presets import get_gpu, get_model
from simulator.latency import make_latency_model
from simulator.overload import THRESHOLDS, overload_verdict, queue_growth, unloaded_prefill_s
from tests.simulator.helpers import chat, identical, kshot, run

LAT = make_latency_model("constant", get_model("opt-13b"), get_gpu("a100-40gb"), 1, "fp16")


def _requests(n: int, span: float, early: float, late: float,
              admit_rate: float | None = None) -> pd.DataFrame:
    """Completed requests arriving evenly over [0, span]: TTFT `early` in the first half of
    the window, `late` in the second; admitted at `admit_rate` per second (default: on
    arrival)."""
    t = np.linspace(0, span, n)
    admit = t if admit_rate is None else np.maximum(t, np.arange(n) / admit_rate)
    return pd.DataFrame({"arrival_s": t, "admit_s": admit, "status": "completed",
                         "ttft_s": np.where(t < span / 2, early, late)})


def _verdict(*, backlog=0, ttft=0.05, early=None, n=100, span=100.0, prompt=100,
             admit_rate=None):
    return overload_verdict(
        arrivals=np.linspace(0, span, n), prompt_lens=np.full(n, prompt),
        requests=_requests(n, span, ttft if early is None else early, ttft, admit_rate),
        start=0.0, end=span, backlog=backlog, latency=LAT, chunk=0, page_size=16)


def test_unloaded_prefill_sums_the_chunks():
    whole = unloaded_prefill_s(LAT, 1000, 0, 16)
    assert whole == pytest.approx(LAT.iteration_time([(1000, 0)], (), 16))
    chunked = unloaded_prefill_s(LAT, 1000, 256, 16)
    assert chunked == pytest.approx(sum(LAT.iteration_time([(min(256, 1000 - b), b)], (), 16)
                                        for b in range(0, 1000, 256)))
    assert unloaded_prefill_s(LAT, 0, 256, 16) == 0.0


@given(rate=st.floats(0.5, 20), ratio=st.floats(0.1, 1.0))
@settings(max_examples=30, deadline=None)
def test_queue_growth_is_arrivals_minus_admissions(rate, ratio):
    """Arrivals at `rate`, admissions at `ratio` x rate: the queue grows at the difference;
    requests never admitted stay queued; nothing outside the window counts."""
    n = 2000
    t = np.arange(n) / rate
    admit = np.arange(n) / (rate * ratio)
    admit[admit > t[-1]] = np.nan  # not admitted within the run
    req = pd.DataFrame({"arrival_s": t, "admit_s": admit})
    span = t[-1]
    got = queue_growth(req, 0.0, span)
    assert got == pytest.approx(rate * (1 - ratio), abs=0.02 * rate + 0.05)
    assert queue_growth(req, 0.0, math.inf) == 0.0
    assert queue_growth(req.iloc[:0], 0.0, span) == 0.0


def test_a_light_run_is_not_overloaded():
    v = _verdict()
    assert v["overloaded"] is False and v["overload_reason"] == ""


@pytest.mark.parametrize("backlog, flagged", [(10, False), (11, True)])
def test_backlog_threshold(backlog, flagged):
    # 100 requests: the threshold is max(10, 5 % of 100) = 10
    v = _verdict(backlog=backlog)
    assert v["overloaded"] is flagged
    assert ("backlog" in v["overload_reason"]) is flagged


def test_queue_growth_threshold():
    grows = _verdict(admit_rate=0.8)  # 1 req/s arrivals, 0.8 admitted: +0.2 req/s, +~17
    assert grows["overloaded"] and "queue growth" in grows["overload_reason"]
    slow = _verdict(admit_rate=0.97)  # below 5 % of the arrival rate
    assert not slow["overloaded"]
    short = _verdict(admit_rate=0.8, n=5, span=5.0)  # the same rate, adding up to 1 request
    assert not short["overloaded"]


def test_ttft_threshold_needs_the_factor_the_margin_and_growth():
    unloaded = unloaded_prefill_s(LAT, 100, 0, 16)  # 0.01 s with the constant model
    high = unloaded * 10 + THRESHOLDS.ttft_margin_s + 1
    far = _verdict(ttft=high, early=unloaded)
    assert far["overloaded"] and "TTFT" in far["overload_reason"]
    assert far["ttft_over_unloaded"] >= THRESHOLDS.ttft_factor
    burst = _verdict(ttft=high, early=high * 0.6)  # high, but not growing: bursts, not overload
    assert not burst["overloaded"]
    near = _verdict(ttft=unloaded * 5, early=unloaded)
    assert not near["overloaded"]
    tiny = _verdict(ttft=unloaded * 50, early=unloaded)  # 50x, but half a second
    assert unloaded * 50 - unloaded < THRESHOLDS.ttft_margin_s and not tiny["overloaded"]


def test_simulations_flag_an_overloaded_stream_and_not_a_light_one():
    heavy = run(identical(200, 400, 200, spacing_s=0.001), check_invariants=False)
    assert heavy.summary["overloaded"] and heavy.summary["queue_backlog"] > 10
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
