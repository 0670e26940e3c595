"""Is a run overloaded? Three signs, each with a documented threshold (docs/planning.md).

A page-size study or a latency figure taken from a run the GPU cannot keep up with measures the
queue, not the KV cache: every number grows with the length of the trace. So every run says
whether it is overloaded and why, from what the simulation already recorded:

* **backlog**: requests still waiting at the end of the measurement window, more than
  `backlog_share` of the requests (and at least `backlog_min` of them);
* **queue growth**: the least-squares slope of the queue (arrived, not yet admitted) over the
  window, more than
  `growth_share` of the arrival rate, and adding up to at least `growth_min` requests over the
  window (a few requests of noise on a short window is not a trend);
* **TTFT**: the median time to first token of the requests arriving in the later half of the
  window at least `ttft_factor` x the unloaded prefill time of the median prompt (the same
  latency model, an empty engine, no prefix hit), at least `ttft_margin_s` above it (a 10x of a
  millisecond is no user-visible delay), and at least `ttft_growth` x the median of the earlier
  half: under overload the wait grows with every arrival, while a burst of simultaneous
  arrivals (the Mooncake trace stamps requests in 3-second buckets) waits as long at any rate.

Any one sign makes the run overloaded; `overload_reason` lists the signs that fired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.latency import LatencyModel


@dataclass(frozen=True)
class OverloadThresholds:
    """When a run counts as overloaded; the defaults are the documented ones."""

    backlog_share: float = 0.05
    backlog_min: int = 10
    growth_share: float = 0.05
    growth_min: float = 10.0
    ttft_factor: float = 10.0
    ttft_margin_s: float = 1.0
    ttft_growth: float = 2.0


THRESHOLDS = OverloadThresholds()
OVERLOAD_COLUMNS = ("overloaded", "overload_reason", "queue_growth_req_s",
                    "unloaded_prefill_s", "ttft_over_unloaded")


def unloaded_prefill_s(latency: LatencyModel, prompt_len: int, chunk: int,
                       page_size: int) -> float:
    """Seconds to prefill one `prompt_len` prompt alone in the engine, chunk by chunk (the
    engine's chunked prefill), nothing cached: the TTFT a request gets on an idle GPU."""
    if prompt_len <= 0:
        return 0.0
    step = chunk if chunk > 0 else prompt_len
    total = 0.0
    for before in range(0, prompt_len, step):
        total += latency.iteration_time([(min(step, prompt_len - before), before)], (),
                                        page_size)
    return total


def queue_growth(requests: pd.DataFrame, start: float, end: float, points: int = 256) -> float:
    """Least-squares slope (requests per second) over the window of the number of requests
    that have arrived but not yet been admitted once, on `points` evenly spaced times.

    Counted from the per-request arrival and first-admission times rather than the sampled
    timeline: those are identical whether decode runs step by step or in multi-step
    stretches (simulator/stretch.py), so the column is too. A request put back in the queue
    by preemption is not counted again: it was served once, and the slope is about arrivals
    outrunning admissions."""
    if len(requests) == 0 or not math.isfinite(end) or end <= start:
        return 0.0
    t = np.linspace(start, end, points)
    arrivals = np.sort(requests["arrival_s"].to_numpy(dtype=float))
    admits = requests["admit_s"].to_numpy(dtype=float)
    admits = np.sort(admits[np.isfinite(admits)])
    waiting = (np.searchsorted(arrivals, t, side="right")
               - np.searchsorted(admits, t, side="right")).astype(float)
    return float(np.polyfit(t, waiting, 1)[0])


def ttft_halves(requests: pd.DataFrame, start: float, end: float) -> tuple[float, float]:
    """Median TTFT of the completed requests arriving in the earlier and the later half of
    the window (NaN for a half without one)."""
    if len(requests) == 0 or not math.isfinite(end) or end <= start:
        return math.nan, math.nan
    done = requests[requests["status"] == "completed"]
    mid = (start + end) / 2
    early = done.loc[(done["arrival_s"] >= start) & (done["arrival_s"] < mid), "ttft_s"]
    late = done.loc[(done["arrival_s"] >= mid) & (done["arrival_s"] <= end), "ttft_s"]
    return (float(early.median()) if len(early) else math.nan,
            float(late.median()) if len(late) else math.nan)


def overload_verdict(*, arrivals: np.ndarray, prompt_lens: np.ndarray, requests: pd.DataFrame,
                     start: float, end: float, backlog: int,
                     latency: LatencyModel, chunk: int, page_size: int,
                     th: OverloadThresholds = THRESHOLDS) -> dict[str, Any]:
    """The overload columns of a run's summary (OVERLOAD_COLUMNS). `arrivals` and
    `prompt_lens` describe every request of the workload (nominal arrival times); `requests`
    is the run's per-request rows (empty when they went to a sink: no TTFT sign then)."""
    reasons: list[str] = []
    total = len(arrivals)
    if backlog > max(th.backlog_min, th.backlog_share * total):
        reasons.append(f"backlog: {backlog:,} of {total:,} requests still queued at the "
                       "window end")
    span = end - start if math.isfinite(end) else 0.0
    arrived = int(((arrivals >= start) & (arrivals <= end)).sum()) if span > 0 else 0
    arrival_rate = arrived / span if span > 0 else 0.0
    growth = queue_growth(requests, start, end)
    if (arrival_rate > 0 and growth > th.growth_share * arrival_rate
            and growth * span >= th.growth_min):
        reasons.append(f"queue growth: {growth:.3g} req/s ({growth / arrival_rate:.0%} of "
                       f"arrivals)")
    prompt = int(np.median(prompt_lens)) if total else 0
    unloaded = unloaded_prefill_s(latency, prompt, chunk, page_size)
    early, ttft = ttft_halves(requests, start, end)
    ratio = ttft / unloaded if unloaded > 0 and math.isfinite(ttft) else math.nan
    grew = not math.isfinite(early) or ttft >= th.ttft_growth * early
    if (math.isfinite(ratio) and ratio >= th.ttft_factor
            and ttft - unloaded >= th.ttft_margin_s and grew):
        reasons.append(f"TTFT p50 {ttft:.3g} s (later arrivals; {early:.3g} s earlier) = "
                       f"{ratio:,.0f}x the unloaded prefill {unloaded:.3g} s")
    return {"overloaded": bool(reasons), "overload_reason": "; ".join(reasons),
            "queue_growth_req_s": growth, "unloaded_prefill_s": unloaded,
            "ttft_over_unloaded": ratio}


__all__ = ["OVERLOAD_COLUMNS", "THRESHOLDS", "OverloadThresholds", "overload_verdict",
           "queue_growth", "ttft_halves", "unloaded_prefill_s"]
