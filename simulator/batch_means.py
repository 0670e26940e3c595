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

Runs of one seed at different page sizes serve the same requests at the same arrival times
(common random numbers), so their figures move together: a burst that slows page 16 slows
page 256 too. The noise of a *difference* between two such runs is therefore not the two
runs' standard errors added as if independent (which swallows real differences near
capacity); it is the spread of the batch-by-batch differences. Each run therefore also keeps
its batch figures (`batch_means`, `batch_ratios`, written as text by `batch_text`), cut the
same way in every run: completed requests in arrival order, ties by request id, so two runs
that complete the same requests have the same batches. experiments/answers/recommend.py pairs them.
"""

from __future__ import annotations

import math

import numpy as np

BATCHES = 10
MIN_PER_BATCH = 2  # fewer completed requests than BATCHES x this: no estimate (NaN)


def _batches(arrival_s: np.ndarray, ids: np.ndarray | None) -> list[np.ndarray]:
    """Row indices of the BATCHES batches: by arrival, ties by request id (else row order)."""
    order = (np.argsort(arrival_s, kind="stable") if ids is None
             else np.lexsort((ids, arrival_s)))
    return np.array_split(order, BATCHES)


def batch_means(arrival_s: np.ndarray, values: np.ndarray,
                ids: np.ndarray | None = None) -> np.ndarray:
    """Each batch's mean of `values` (per request; NaN values left out), in arrival order;
    empty with too few requests."""
    ok = np.isfinite(values)
    arrival_s, values = arrival_s[ok], values[ok]
    ids = None if ids is None else ids[ok]
    if len(values) < BATCHES * MIN_PER_BATCH:
        return np.zeros(0)
    return np.array([values[b].mean() for b in _batches(arrival_s, ids)])


def batch_ratios(arrival_s: np.ndarray, num: np.ndarray, den: np.ndarray,
                 ids: np.ndarray | None = None) -> np.ndarray:
    """Each batch's ratio of sums (hit tokens over prompt tokens), in arrival order; empty
    with too few requests or a batch without prompt tokens."""
    if len(num) < BATCHES * MIN_PER_BATCH:
        return np.zeros(0)
    ratios = []
    for b in _batches(arrival_s, ids):
        d = float(den[b].sum())
        if d <= 0:
            return np.zeros(0)
        ratios.append(float(num[b].sum()) / d)
    return np.array(ratios)


def batch_se(batches: np.ndarray) -> float:
    """The standard error of the mean from batch figures: their spread / sqrt(batches) (NaN
    for none)."""
    return float(batches.std(ddof=1) / math.sqrt(len(batches))) if len(batches) else math.nan


def batch_means_se(arrival_s: np.ndarray, values: np.ndarray,
                   ids: np.ndarray | None = None) -> float:
    """The standard error of the mean of `values` (per request), by batch means in arrival
    order; NaN with too few requests."""
    return batch_se(batch_means(arrival_s, values, ids))


def batch_ratio_se(arrival_s: np.ndarray, num: np.ndarray, den: np.ndarray,
                   ids: np.ndarray | None = None) -> float:
    """The standard error of a ratio of sums (hit tokens over prompt tokens), by batch means of
    each batch's own ratio; NaN with too few requests or a batch without prompt tokens."""
    return batch_se(batch_ratios(arrival_s, num, den, ids))


def batch_text(batches: np.ndarray) -> str:
    """Batch figures as one summary cell: `;`-separated, 10 significant digits ('' for none)."""
    return ";".join(f"{v:.10g}" for v in batches)


def parse_batches(cell: object) -> np.ndarray:
    """A `batch_text` cell read back (a CSV may give NaN or a number for an empty or single
    cell): the batch figures, empty when there are none."""
    if isinstance(cell, str):
        parts = [p for p in cell.split(";") if p.strip()]
        try:
            return np.array([float(p) for p in parts])
        except ValueError:
            return np.zeros(0)
    return np.zeros(0)


__all__ = ["BATCHES", "batch_means", "batch_means_se", "batch_ratio_se", "batch_ratios",
           "batch_se", "batch_text", "parse_batches"]
