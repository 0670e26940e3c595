"""The standard error of a run's mean figures, by the method of batch means.

A page-size recommendation compares runs whose figures differ by a few percent; with one seed
per page size it needs to know how much of a difference one run's own randomness explains.
Requests of one run are not independent (a burst makes its neighbours wait too), so the plain
`sd / sqrt(n)` over requests understates the noise near capacity. The method of batch means
(Law & Kelton, *Simulation Modeling and Analysis*, 5th ed., section 9.5.3) cuts the completed
requests, in arrival order, into `BATCHES` contiguous batches, takes each batch's figure, and
reads the standard error from the spread of those batch figures: batches long compared with the
correlation between neighbouring requests are close to independent. Ten batches is the usual
choice (and the overload verdict's window count, simulator/overload.py).
"""

from __future__ import annotations

import math

import numpy as np

BATCHES = 10
MIN_PER_BATCH = 2  # fewer completed requests than BATCHES x this: no estimate (NaN)


def _batches(order: np.ndarray) -> list[np.ndarray]:
    return np.array_split(order, BATCHES)


def batch_means_se(arrival_s: np.ndarray, values: np.ndarray) -> float:
    """The standard error of the mean of `values` (per request), by batch means in arrival
    order; NaN with too few requests."""
    ok = np.isfinite(values)
    arrival_s, values = arrival_s[ok], values[ok]
    if len(values) < BATCHES * MIN_PER_BATCH:
        return math.nan
    order = np.argsort(arrival_s, kind="stable")
    means = np.array([values[b].mean() for b in _batches(order)])
    return float(means.std(ddof=1) / math.sqrt(BATCHES))


def batch_ratio_se(arrival_s: np.ndarray, num: np.ndarray, den: np.ndarray) -> float:
    """The standard error of a ratio of sums (hit tokens over prompt tokens), by batch means of
    each batch's own ratio; NaN with too few requests or a batch without prompt tokens."""
    if len(num) < BATCHES * MIN_PER_BATCH:
        return math.nan
    order = np.argsort(arrival_s, kind="stable")
    ratios = []
    for b in _batches(order):
        d = float(den[b].sum())
        if d <= 0:
            return math.nan
        ratios.append(float(num[b].sum()) / d)
    return float(np.std(ratios, ddof=1) / math.sqrt(BATCHES))


__all__ = ["BATCHES", "batch_means_se", "batch_ratio_se"]
