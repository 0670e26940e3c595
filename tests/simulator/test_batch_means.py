"""Batch means (simulator/batch_means.py): the run's own noise that a one-seed page-size
recommendation uses. Cheap: numpy only, plus one small simulation (~1 s)."""

import math

import numpy as np
import pytest

from simulator.batch_means import BATCHES, batch_means_se, batch_ratio_se


def test_the_standard_error_is_the_spread_of_the_batch_means():
    """Ten batches of 5 requests whose values equal their batch index: batch means 0..9, so the
    SE is std(0..9, ddof=1) / sqrt(10), by hand 3.0277 / 3.1623 = 0.9574."""
    values = np.repeat(np.arange(BATCHES, dtype=float), 5)
    arrival = np.arange(len(values), dtype=float)
    assert batch_means_se(arrival, values) == pytest.approx(
        np.std(np.arange(10.0), ddof=1) / math.sqrt(10))
    assert batch_means_se(arrival, values) == pytest.approx(0.95743, abs=1e-5)


def test_batches_follow_arrival_order_not_row_order():
    """The same values in shuffled rows: batches are cut by arrival time, so the answer is the
    same; a constant run has no noise."""
    rng = np.random.default_rng(0)
    values = np.repeat(np.arange(BATCHES, dtype=float), 4)
    arrival = np.arange(len(values), dtype=float)
    perm = rng.permutation(len(values))
    assert batch_means_se(arrival[perm], values[perm]) == pytest.approx(
        batch_means_se(arrival, values))
    assert batch_means_se(arrival, np.ones(40)) == 0.0


def test_correlated_requests_give_a_wider_band_than_independent_ones():
    """A slow burst (every request of the first half waits 1 s more) makes neighbours alike:
    the plain sd/sqrt(n) over requests would understate the noise; batch means does not."""
    n = 200
    values = np.where(np.arange(n) < n // 2, 2.0, 1.0) + np.tile([0.01, -0.01], n // 2)
    arrival = np.arange(n, dtype=float)
    naive = values.std(ddof=1) / math.sqrt(n)
    assert batch_means_se(arrival, values) > 3 * naive


def test_too_few_requests_or_an_empty_batch_give_no_estimate():
    assert math.isnan(batch_means_se(np.arange(19.0), np.ones(19)))
    arrival = np.arange(40.0)
    hits, prompts = np.ones(40), np.ones(40)
    assert batch_ratio_se(arrival, hits, prompts) == 0.0
    prompts[:4] = 0  # the first batch has no prompt tokens
    assert math.isnan(batch_ratio_se(arrival, hits, prompts))


def test_a_hit_rate_se_is_the_spread_of_each_batch_s_own_ratio():
    """Batch k hits k of every 10 prompt tokens: ratios 0.0..0.9, SE = std / sqrt(10)."""
    arrival = np.arange(20.0)
    prompts = np.full(20, 10.0)
    hits = np.repeat(np.arange(10.0), 2)
    assert batch_ratio_se(arrival, hits, prompts) == pytest.approx(
        np.std(np.arange(10.0) / 10, ddof=1) / math.sqrt(10))


def test_every_run_reports_its_noise():
    """A real small run: both columns present and finite (40 requests complete), and positive
    for a workload whose lengths vary."""
    from tests.simulator.helpers import kshot, run

    s = run(kshot(n=40)).summary
    assert s["normalized_latency_se_s"] > 0 and math.isfinite(s["normalized_latency_se_s"])
    assert s["prefix_hit_rate_se"] >= 0 and math.isfinite(s["prefix_hit_rate_se"])
