"""Named workloads, the spec, frames and stats."""

from __future__ import annotations

import numpy as np
import pytest

from tests.workloads.conftest import FIXTURES
from workloads import (
    DEFAULT_WORKLOAD,
    WorkloadError,
    WorkloadSpec,
    build_workload,
    list_workloads,
    trace_stats,
)


def test_list_is_one_line_each():
    names = list_workloads()
    for n in ("sharegpt", "alpaca", "kshot", "chat", "tot", "parallel-sampling",
              "azure-conv", "mooncake-conv", "sharegpt-real"):
        assert n in names and "\n" not in names[n] and names[n]
    assert DEFAULT_WORKLOAD == "sharegpt"


def test_default_is_small():
    """Small enough to run in seconds: asserted by its size, never by a wall clock (a timing
    under load is a flaky test; benchmarks/ measures speed)."""
    w = build_workload()
    assert 100 <= w.num_requests <= 200
    df = w.to_frame()
    assert list(df.columns) == ["request_id", "arrival_s", "prompt_len", "output_len",
                                "max_new_tokens", "session_id", "turn", "closed_loop"]
    assert df.arrival_s.iloc[-1] < 200


@pytest.mark.parametrize("name", sorted(list_workloads()))
def test_every_named_workload_builds(name):
    spec = WorkloadSpec(name=name, num_requests=50)
    w = build_workload(spec)
    assert w.num_requests == 50
    s = trace_stats(w, 16)
    assert s["rows"] == 50 and 0 <= s["ideal_reuse"] <= 1
    for r in w.nominal_requests()[:5]:
        assert r.prompt_len >= 1 and 1 <= r.output_len <= r.max_new_tokens


def test_spec_options_reach_the_workload():
    w = build_workload(WorkloadSpec(name="sharegpt", rate=10.0, arrival="fixed",
                                    num_requests=5, max_new_tokens=64))
    assert [r.arrival_s for r in w.requests] == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert all(r.max_new_tokens == 64 and r.output_len <= 64 for r in w.requests)
    w = build_workload(WorkloadSpec(name="alpaca", duration_s=2.0, rate=5.0, arrival="gamma",
                                    cv=2.0))
    assert all(r.arrival_s < 2.0 for r in w.requests)
    w = build_workload(WorkloadSpec(name="azure-conv", duration_s=60.0, rate_scale=2.0))
    assert w.requests[-1].arrival_s < 60 and len(w.requests) > 300
    w = build_workload(WorkloadSpec(trace=str(FIXTURES / "vidur_sample.csv")))
    assert w.num_requests == 4 and w.name == "vidur_sample"
    with pytest.raises(WorkloadError, match="--workload 'nope' is not one of: sharegpt"):
        WorkloadSpec(name="nope")  # the spec checks its name when built
    with pytest.raises(WorkloadError, match="arrival 'trace'"):
        build_workload(WorkloadSpec(name="chat", arrival="trace"))


def test_chat_frame_and_stats():
    w = build_workload(WorkloadSpec(name="chat", num_requests=12))
    df = w.to_frame()
    assert df.closed_loop.all() and df.session_id.notna().all()
    assert len(w.sessions) == 3
    s = trace_stats(w, 1)
    assert s["sessions"] == 3 and s["ideal_reuse"] > 0.4


def test_stats_keys(azure):
    s = trace_stats(azure, 16)
    assert s["rows"] == 19366 and s["ideal_reuse"] == 0.0
    assert s["duration_s"] == pytest.approx(3501.722, abs=1e-3)
    assert s["rate"] == pytest.approx(5.530, abs=1e-3)
    assert s["input"]["p90"] == pytest.approx(2734.5) and s["output"]["max"] == 1000
    assert np.isfinite(s["input"]["mean"])


def _mean_rate(w) -> float:
    t = np.array([r.arrival_s for r in w.nominal_requests()])
    return len(t) / (t.max() - t.min())


def test_rate_rescales_a_traces_timestamps_like_the_matching_rate_scale():
    """--rate R with a timestamped trace replays its own bursts at a mean of R req/s: the same
    arrivals as --rate-scale R / native (it used to be ignored while summary.csv said R)."""
    native = build_workload(WorkloadSpec(name="azure-conv", num_requests=300))
    w = build_workload(WorkloadSpec(name="azure-conv", num_requests=300, rate=10.0))
    assert _mean_rate(w) == pytest.approx(10.0)
    same = build_workload(WorkloadSpec(name="azure-conv", num_requests=300,
                                       rate_scale=10.0 / _mean_rate(native)))
    assert np.allclose([r.arrival_s for r in w.requests], [r.arrival_s for r in same.requests])
    assert w.meta["arrival"] == "trace"
    with pytest.raises(WorkloadError, match="--rate 4 and --rate-scale 2"):
        build_workload(WorkloadSpec(name="azure-conv", num_requests=30, rate=4.0,
                                    rate_scale=2.0))


def test_the_summary_reports_the_rate_simulated():
    from experiments.answers.runner import _rate
    from experiments.options.run_options import RunOptions

    for extra, want in (({"rate": 7.5}, 7.5), ({}, None)):
        opts = RunOptions.from_mapping({"workload": "azure-conv", "num_requests": 200, **extra})
        w = build_workload(opts.workload_spec())
        assert _rate(opts, w) == pytest.approx(want or _mean_rate(w))
