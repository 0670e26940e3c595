"""SLO attainment of one run, and which target binds: the columns `kvsim capacity` searches on.

"What rate can one GPU sustain" is asked with a latency target in mind: a run whose queue
drains (not overloaded) can still give a 20 s TTFT p99. DistServe (Zhong et al., OSDI'24,
arXiv 2401.09670, section 2) defines **goodput** as the highest request rate at which at least a
stated share of requests (the SLO attainment goal, e.g. 90 %) meets both the TTFT and the TPOT
target. kvsim takes the share from `--slo-percentile` (default 99: `--slo-ttft-p99 2` is "99 %
of the requests start within 2 s"), and counts every request of the run in the denominator: a
request that was rejected or had not finished when the run ended met no target (an unfinished
request has no result row, so the caller passes the run's request count, `total`).

A one-token output has no TPOT; it meets the TPOT target.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

SLO_COLUMNS = ("slo_ttft_attainment", "slo_tpot_attainment", "slo_attainment", "slo_met",
               "slo_binding")


def slo_columns(requests: pd.DataFrame, ttft: float | None, tpot: float | None,
                percentile: float, total: int | None = None) -> dict[str, Any]:
    """The SLO columns of a run's summary row (NaN / None when no target is given): the
    share of requests meeting the TTFT target, the TPOT target and both; whether the share
    meeting both reaches `percentile` %; and which target binds (the one met by the smaller
    share, when the run misses its SLO). `total`: the run's requests, rows or not (default:
    the rows)."""
    if ttft is None and tpot is None:
        return {"slo_ttft_attainment": math.nan, "slo_tpot_attainment": math.nan,
                "slo_attainment": math.nan, "slo_met": None, "slo_binding": None}
    n = len(requests)
    done = (requests["status"] == "completed").to_numpy() if n else np.zeros(0, bool)
    ok_ttft = done.copy()
    ok_tpot = done.copy()
    if ttft is not None and n:
        ok_ttft &= requests["ttft_s"].to_numpy(dtype=float) <= ttft
    if tpot is not None and n:
        t = requests["tpot_s"].to_numpy(dtype=float)
        ok_tpot &= ~(t > tpot)  # NaN (one output token): met

    count = max(n, total or 0)

    def share(ok: np.ndarray) -> float:
        return float(ok.sum()) / count if count else 0.0

    a_ttft = share(ok_ttft) if ttft is not None else math.nan
    a_tpot = share(ok_tpot) if tpot is not None else math.nan
    both = share(ok_ttft & ok_tpot)
    met = both >= percentile / 100.0
    binding = None
    if not met:
        named: dict[str, float] = {}
        if ttft is not None:
            named[f"TTFT <= {ttft:g} s"] = a_ttft
        if tpot is not None:
            named[f"TPOT <= {tpot:g} s"] = a_tpot
        binding = min(named, key=lambda k: named[k])
    return {"slo_ttft_attainment": a_ttft, "slo_tpot_attainment": a_tpot,
            "slo_attainment": both, "slo_met": bool(met), "slo_binding": binding}


__all__ = ["SLO_COLUMNS", "slo_columns"]
