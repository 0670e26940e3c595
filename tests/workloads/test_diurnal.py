"""The diurnal arrival process (workloads/arrivals.py): its rate follows its curve.

Cost: about 1 s (40,000 arrivals drawn a few times).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from workloads import build_workload
from workloads.arrivals import DAY_S, diurnal_amplitude, diurnal_arrivals, diurnal_rate
from workloads.errors import WorkloadError
from workloads.registry import check_options_used
from workloads.spec import WorkloadSpec


def _integral(rate: float, ratio: float, lo: float, hi: float) -> float:
    """The rate's integral over [lo, hi] in closed form: r (x - a D / 2 pi sin(2 pi x / D))."""
    a = diurnal_amplitude(ratio)

    def f(x: float) -> float:
        return rate * (x - a * DAY_S / (2 * math.pi) * math.sin(2 * math.pi * x / DAY_S))

    return f(hi) - f(lo)


@pytest.mark.parametrize("ratio", [1.0, 3.0, 8.0])
def test_counts_per_hour_follow_the_curve(ratio):
    """Given n arrivals in the day, each hour's count is binomial(n, p_h) with p_h the hour's
    share of the day's integral of the rate: every hour within 5 standard deviations."""
    rate = 0.5
    t = diurnal_arrivals(rate, ratio, np.random.default_rng(7), duration_s=DAY_S)
    n = len(t)
    assert abs(n - rate * DAY_S) < 5 * math.sqrt(rate * DAY_S)  # Poisson total
    assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] < DAY_S
    counts = np.histogram(t, bins=24, range=(0, DAY_S))[0]
    for h in range(24):
        share = _integral(rate, ratio, h * 3600, (h + 1) * 3600) / (rate * DAY_S)
        sd = math.sqrt(n * share * (1 - share))
        assert abs(counts[h] - n * share) <= 5 * sd, (h, counts[h], n * share)
    # the curve itself: mean `rate`, trough at midnight, peak at noon, peak / trough = ratio
    assert diurnal_rate(DAY_S / 2, rate, ratio) / diurnal_rate(0.0, rate, ratio) == \
        pytest.approx(ratio)
    grid = np.linspace(0, DAY_S, 100_001)
    assert np.trapezoid(diurnal_rate(grid, rate, ratio), grid) == pytest.approx(rate * DAY_S)


def test_bounds_and_errors():
    rng = np.random.default_rng(1)
    t = diurnal_arrivals(2.0, 3.0, rng, num_requests=5000)
    assert len(t) == 5000 and np.all(np.diff(t) >= 0)
    both = diurnal_arrivals(2.0, 3.0, np.random.default_rng(1), num_requests=5000,
                            duration_s=600.0)
    assert len(both) < 5000 and both[-1] < 600.0
    with pytest.raises(WorkloadError, match="peak_to_trough must be a number >= 1"):
        diurnal_arrivals(2.0, 0.5, rng, num_requests=10)


def test_as_a_workload_option():
    spec = WorkloadSpec(name="sharegpt", arrival="diurnal", rate=0.05, duration_s=DAY_S,
                        peak_to_trough=4.0)
    w = build_workload(spec)
    assert w.meta["arrival"] == "diurnal" and w.meta["peak_to_trough"] == 4.0
    check_options_used(spec, w)
    assert abs(w.num_requests - 0.05 * DAY_S) < 5 * math.sqrt(0.05 * DAY_S)
    with pytest.raises(WorkloadError, match="--peak-to-trough: not used"):
        poisson = WorkloadSpec(name="sharegpt", peak_to_trough=4.0)
        check_options_used(poisson, build_workload(poisson))
    with pytest.raises(WorkloadError):
        WorkloadSpec(name="sharegpt", arrival="diurnal", peak_to_trough=0.9)


def test_summary_column_and_hash_only_for_diurnal_runs():
    """Other arrival processes keep their summary columns and config hash: the option is
    left out of both."""
    from experiments.answers.runner import simulate_options, summary_row
    from experiments.options.run_options import RunOptions

    base = {"workload": "sharegpt", "num_requests": 5, "latency": "constant"}
    plain = RunOptions.from_mapping(base)
    w = build_workload(plain.workload_spec())
    summary = simulate_options(plain)[1].summary  # a real record: the row reads its fields
    assert "peak_to_trough" not in summary_row(plain, summary, w)
    d3 = RunOptions.from_mapping({**base, "arrival": "diurnal"})
    d4 = RunOptions.from_mapping({**base, "arrival": "diurnal", "peak_to_trough": 4.0})
    assert summary_row(d4, summary, w)["peak_to_trough"] == 4.0
    assert len({plain.config_hash(), d3.config_hash(), d4.config_hash()}) == 3
