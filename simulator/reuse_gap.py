"""Achieved vs ideal prefix reuse, the gap split into causes that add up exactly.

A hit rate of 4 % means little next to "missed reuse 0.00" unless the user also sees the ideal
(22 %) and where the other 18 points went. Over the requests the engine admitted (the hit
rate's own denominator, their prompt tokens), with the ideal defined once in workloads/reuse.py:

    ideal (token level, nominal order)
      - page alignment   = ideal at page 1 - ideal at the run's page size (only full pages share)
      - not yet arrived  = ideal at the page size - the same infinite cache under the run's own
                           timing (the request that would supply the prefix had not arrived or
                           not been computed yet when this one was admitted; negative when the
                           engine's order let a request reuse a prefix nominally later)
      - capacity         = that timed ideal - achieved (evicted before reuse, or not kept at
                           all by a policy without a cache)
      = achieved (prefix_hit_rate)

A hybrid run (a policy with pools per layer kind) splits two more causes out of capacity,
measured at each admission by the policy's own match rules (AdmitResult): full-attention KV
that was still cached but refused because

      - sliding window   = the KV of the match's last window was gone (freed as it left a
                           running request's window, or evicted from the SWA pool)
      - state boundary   = no state was kept where the match could end (SGLang keeps a
                           Mamba state only at the end of each cached sequence; vLLM's
                           `align` mode only at the block boundary a step ends on, `none`
                           nowhere: prefix caching off, so every timed hit is this cause)

and capacity is what is left: KV evicted before reuse, a state evicted from its pool. These
columns (`reuse_gap_window` for a layout with sliding-window or chunked layers,
`reuse_gap_state` for one with Mamba / linear-attention layers) exist for those hybrid runs
only, so a full-attention run's summary keeps its columns. A policy may hold content the
timed pass has not inserted yet (a chunk cached mid-prefill), so capacity, like "not yet
arrived", can dip below zero by a few tokens.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from simulator.request_table import RequestColumns, column, nan_sum
from workloads.request import Workload
from workloads.reuse import (
    ideal_reuse_hits,
    request_runs,
    solo_requests,
    timed_reuse_hits_columns,
)

if TYPE_CHECKING:
    import pandas as pd

REUSE_COLUMNS = ("ideal_hit_rate", "reuse_gap_alignment", "reuse_gap_not_arrived",
                 "reuse_gap_capacity")
#: a hybrid run's causes besides (split out of capacity)
HYBRID_REUSE_COLUMNS = ("reuse_gap_window", "reuse_gap_state")


SHARED_RUNS = 100_000  # requests whose runs are kept for both passes (about 250 B each)


def _times(rows: RequestColumns | pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """(request ids, times) of the rows where `col` is set: columns, not a dict per request."""
    t = column(rows, col).astype(float, copy=False)
    ok = ~np.isnan(t)
    return column(rows, "request_id")[ok].astype(np.int64), t[ok]


def _at(ids: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """values[ids == w] for each w in `wanted` (every one of them among `ids`)."""
    order = np.argsort(ids, kind="stable")
    return values[order[np.searchsorted(ids[order], wanted)]]


def reuse_gap(workload: Workload, requests: RequestColumns | pd.DataFrame,
              page_size: int, rule_lost: dict[str, int] | None = None,
              caches_no_prefix: bool = False) -> dict[str, float]:
    """The REUSE_COLUMNS as fractions of the admitted requests' prompt tokens (NaN when no
    request was admitted). Both passes build each request's runs as they reach it and keep
    a compact tree (workloads/reuse.py), so a day-long run's pass stays small. A hybrid run
    passes `rule_lost` (HYBRID_REUSE_COLUMNS its layout has -> tokens its window / state
    rules refused over the same requests) and `caches_no_prefix` (its state rule turned the
    cache off): those columns too."""
    rule_lost = dict(rule_lost or {})
    nan = dict.fromkeys(REUSE_COLUMNS + tuple(rule_lost), math.nan)
    if len(requests) == 0:
        return nan
    # the admitted rows' columns one at a time (a day-long run's frame is not copied whole)
    admitted = ~np.isnan(column(requests, "admit_s").astype(float, copy=False))
    total = nan_sum(column(requests, "prompt_len")[admitted])
    if total <= 0:
        return nan
    ids = column(requests, "request_id")[admitted].astype(int)
    # both passes read every request's runs: built once for a run of up to SHARED_RUNS
    # requests (a few MB), else each pass builds them as it goes (a day in bounded memory)
    # (not those of the solo requests, which neither pass builds: workloads/reuse.py)
    runs = (request_runs(workload, solo_requests(workload.nominal_order()))
            if workload.num_requests <= SHARED_RUNS else None)
    tok = ideal_reuse_hits(workload, 1, runs)
    hits1 = _at(tok.request_ids, tok.hits, ids)
    ideal1 = float(hits1.sum())
    ideal_ps = float((hits1 - hits1 % page_size).sum())  # the same match, floored to pages
    del tok
    matched, timed = timed_reuse_hits_columns(
        workload, page_size, _times(requests, "admit_s"), _times(requests, "first_token_s"),
        _times(requests, "finish_s"), runs)
    timed_sum = float(int(timed[np.isin(matched, ids)].sum()))
    achieved = nan_sum(column(requests, "cached_tokens")[admitted])
    out = {"ideal_hit_rate": ideal1 / total,
           "reuse_gap_alignment": (ideal1 - ideal_ps) / total,
           "reuse_gap_not_arrived": (ideal_ps - timed_sum) / total,
           "reuse_gap_capacity": (timed_sum - achieved) / total}
    if caches_no_prefix and "reuse_gap_state" in rule_lost:  # kept nothing, by the rule
        rule_lost = {c: 0 for c in rule_lost} | {"reuse_gap_state": timed_sum - achieved}
    for col, lost in rule_lost.items():
        out[col] = lost / total
    out["reuse_gap_capacity"] = (timed_sum - achieved - sum(rule_lost.values())) / total
    return out


__all__ = ["HYBRID_REUSE_COLUMNS", "REUSE_COLUMNS", "reuse_gap"]
