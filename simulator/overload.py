"""Is a run overloaded? A steady-state verdict: does the queue the engine cannot drain grow?

A page-size study or a latency figure taken from a run the GPU cannot keep up with measures the
queue, not the KV cache: every number grows with the length of the trace. A *burst* is
different: real traces (the Azure and Mooncake ones bundled in workloads/data/) pile up tens of
requests within a second, the queue jumps, and an engine with spare capacity drains it again.
Reading the queue at one instant (say the last arrival) calls such a burst overload, and then
the verdict (and `kvsim capacity`, which bisects on it) moves with where a slice of the trace
happens to end. So the verdict looks at how the queue and the waiting time *evolve* over the
measurement window (which starts after `--warmup-s`):

The window is cut into `windows` equal time windows. Two signals, each a robust trend over
those windows (the Theil-Sen slope: the median of the pairwise slopes, so two windows of
burst out of ten do not make a trend):

* **backlog floor**: the *smallest* queue (requests arrived, not yet admitted once) within
  each window. An engine that keeps up drains its queue between bursts, so the floor stays
  near zero however high the bursts reach; under overload the queue never drains and the
  floor rises at (arrival rate - service rate). Fires when the floor's slope is more than
  `growth_share` of the arrival rate and adds up to at least `growth_min` requests over the
  window.
* **queueing delay**: the median wait from arrival to first admission of the requests
  arriving in each window. Under overload every later arrival waits longer (the wait grows
  at (arrival rate - service rate) / service rate seconds per second); after a drained burst
  it returns to its level. Fires when its slope exceeds `delay_growth` (s of wait per s of
  trace) and adds up to at least `delay_margin_s` over the window (a wait growing by
  milliseconds is no user-visible overload).

Both are computed from the per-request arrival and first-admission times, which are the
same whether decode runs step by step or in multi-step stretches (simulator/fastforward/), so
the verdict is too (tests/simulator/test_engine_fuzz.py). A request the engine rejects
(it can never fit) leaves the queue at once. A request not admitted by the window end waits
at least until then: its wait is counted as that lower bound (censored), which can only
understate a growing delay, never invent one.

Every request that arrived counts, finished or not: a run that stops with a queue
(`--no-drain`, or a closed loop cut off) has requests still queued or running, which get no
result row. Read from the completed rows alone, the queue would lose every request that
never got through, and a backlog growing to hundreds of requests could read as draining.
`Unfinished` carries their arrival and first-admission times, taken from the engine when the
run ends (simulator/run.py), and the verdict merges them with the rows.

`overload_reason` names the signal(s) that decided it. Without per-request rows (a run whose
rows went to a sink) the verdict falls back to the queue left at the window end
(`backlog_share` of the requests, at least `backlog_min`), and says so. `ttft_over_unloaded`
(later-half TTFT / the unloaded prefill of the median prompt) stays a supporting column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.latency import LatencyModel
from simulator.request_table import RequestColumns, column, nan_median

if TYPE_CHECKING:
    import pandas as pd

    Rows = RequestColumns | pd.DataFrame  # the run's per-request columns, or a frame of them


@dataclass(frozen=True)
class OverloadThresholds:
    """When a run counts as overloaded; the defaults are the documented ones (docs/planning.md)."""

    windows: int = 10
    growth_share: float = 0.05
    growth_min: float = 10.0
    delay_growth: float = 0.05
    delay_margin_s: float = 1.0
    backlog_share: float = 0.05  # the fallback without per-request rows
    backlog_min: int = 10


THRESHOLDS = OverloadThresholds()
OVERLOAD_COLUMNS = ("overloaded", "overload_reason", "queue_growth_req_s", "queue_delay_growth",
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


def theil_sen(x: np.ndarray, y: np.ndarray) -> float:
    """The median of the slopes between every pair of points with distinct x (0 for fewer
    than two): a line fit that a minority of outlying points (bursts) cannot tilt."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    keep = dx != 0
    if not keep.any():
        return 0.0
    return float(np.median((y[j] - y[i])[keep] / dx[keep]))


@dataclass(frozen=True)
class Unfinished:
    """The requests a run ended with, which have no result row: still queued (first
    admission NaN) or admitted and not finished (a preempted one keeps its first admission)."""

    arrival_s: np.ndarray
    admit_s: np.ndarray

    @property
    def count(self) -> int:
        return len(self.arrival_s)

    @property
    def queued(self) -> int:
        """How many were never admitted."""
        return int(np.isnan(self.admit_s).sum())


NONE_UNFINISHED = Unfinished(np.zeros(0), np.zeros(0))


def _queued(requests: Rows, unfinished: Unfinished = NONE_UNFINISHED
            ) -> tuple[np.ndarray, np.ndarray]:
    """Arrival and first-admission times of the requests that queued (rejected ones leave
    at once, so they are left out): the rows in table order, then the unfinished ones."""
    if len(requests):
        arr = column(requests, "arrival_s").astype(float, copy=False)
        adm = column(requests, "admit_s").astype(float, copy=False)
        if "status" in requests:
            keep = column(requests, "status") != "rejected"
            arr, adm = arr[keep], adm[keep]
    else:
        arr = adm = np.zeros(0)
    if unfinished.count:
        arr = np.concatenate([arr, unfinished.arrival_s.astype(float)])
        adm = np.concatenate([adm, unfinished.admit_s.astype(float)])
    return arr, adm


def _queue_events(requests: Rows, unfinished: Unfinished = NONE_UNFINISHED
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted arrival and first-admission times of the requests that queued."""
    arrivals, admits = _queued(requests, unfinished)
    return np.sort(arrivals), np.sort(admits[np.isfinite(admits)])


def backlog_floor(requests: Rows, edges: np.ndarray,
                  unfinished: Unfinished = NONE_UNFINISHED) -> np.ndarray:
    """The smallest queue within each window [edges[k], edges[k+1]]: the queue is a step
    function changing at arrivals (+1) and admissions (-1), so its minimum over a window is at
    the window's start or just after an admission inside it."""
    arrivals, admits = _queue_events(requests, unfinished)

    def queue(t: np.ndarray) -> np.ndarray:
        return (np.searchsorted(arrivals, t, side="right")
                - np.searchsorted(admits, t, side="right")).astype(float)

    floors = np.empty(len(edges) - 1)
    for k in range(len(edges) - 1):
        lo, hi = edges[k], edges[k + 1]
        inside = admits[(admits > lo) & (admits <= hi)]
        floors[k] = queue(np.concatenate(([lo], inside))).min()
    return floors


def delay_by_window(requests: Rows, edges: np.ndarray,
                    unfinished: Unfinished = NONE_UNFINISHED) -> np.ndarray:
    """The median wait from arrival to first admission of the requests arriving in each
    window (NaN for a window without arrivals); one not admitted by the window end counts as
    waiting until then (a lower bound)."""
    arr, adm = _queued(requests, unfinished)
    end = edges[-1]
    wait = np.where(np.isfinite(adm), adm, np.maximum(end, arr)) - arr
    k = np.searchsorted(edges, arr, side="right") - 1
    k[arr == end] = len(edges) - 2  # the last window is closed
    out = np.full(len(edges) - 1, np.nan)
    for w in range(len(edges) - 1):
        sel = wait[k == w]
        if len(sel):
            out[w] = float(np.median(sel))
    return out


def queue_growth(requests: Rows, start: float, end: float,
                 windows: int = THRESHOLDS.windows,
                 unfinished: Unfinished = NONE_UNFINISHED) -> float:
    """Theil-Sen slope (requests per second) of the backlog floor over the window (0 for an
    empty or unbounded window)."""
    if len(requests) + unfinished.count == 0 or not math.isfinite(end) or end <= start:
        return 0.0
    edges = np.linspace(start, end, windows + 1)
    return theil_sen((edges[:-1] + edges[1:]) / 2, backlog_floor(requests, edges, unfinished))


def delay_growth(requests: Rows, start: float, end: float,
                 windows: int = THRESHOLDS.windows,
                 unfinished: Unfinished = NONE_UNFINISHED) -> float:
    """Theil-Sen slope (seconds of wait per second of trace) of the median queueing delay
    over the window."""
    if len(requests) + unfinished.count == 0 or not math.isfinite(end) or end <= start:
        return 0.0
    edges = np.linspace(start, end, windows + 1)
    return theil_sen((edges[:-1] + edges[1:]) / 2,
                     delay_by_window(requests, edges, unfinished))


def ttft_halves(requests: Rows, start: float, end: float) -> tuple[float, float]:
    """Median TTFT of the completed requests arriving in the earlier and the later half of
    the window (NaN for a half without one)."""
    if len(requests) == 0 or not math.isfinite(end) or end <= start:
        return math.nan, math.nan
    done = column(requests, "status") == "completed"
    arrival = column(requests, "arrival_s")[done]
    ttft = column(requests, "ttft_s")[done]
    mid = (start + end) / 2
    early = ttft[(arrival >= start) & (arrival < mid)]
    late = ttft[(arrival >= mid) & (arrival <= end)]
    return nan_median(early), nan_median(late)


def overload_verdict(*, arrivals: np.ndarray, prompt_lens: np.ndarray, requests: Rows,
                     start: float, end: float, backlog: int,
                     latency: LatencyModel, chunk: int, page_size: int,
                     th: OverloadThresholds = THRESHOLDS,
                     unfinished: Unfinished = NONE_UNFINISHED) -> dict[str, Any]:
    """The overload columns of a run's summary (OVERLOAD_COLUMNS). `arrivals` and
    `prompt_lens` describe every request of the workload (nominal arrival times); `requests`
    is the run's per-request rows (empty when they went to a sink: the backlog fallback) and
    `unfinished` the requests it ended with, queued or running, which have no row."""
    reasons: list[str] = []
    total = len(arrivals)
    span = end - start if math.isfinite(end) and end > start else 0.0
    arrived = int(((arrivals >= start) & (arrivals <= end)).sum()) if span > 0 else 0
    arrival_rate = arrived / span if span > 0 else 0.0
    growth = queue_growth(requests, start, end, th.windows, unfinished)
    waits = delay_growth(requests, start, end, th.windows, unfinished)
    if len(requests) + unfinished.count == 0:
        if backlog > max(th.backlog_min, th.backlog_share * total):
            reasons.append(f"backlog: {backlog:,} of {total:,} requests still queued at the "
                           "window end (no per-request rows to judge the trend)")
    else:
        if (arrival_rate > 0 and growth > th.growth_share * arrival_rate
                and growth * span >= th.growth_min):
            reasons.append(f"backlog floor: the queue never drains, its low point grows "
                           f"{growth:.3g} req/s ({growth / arrival_rate:.0%} of arrivals, "
                           f"+{growth * span:,.0f} requests over the window)")
        if waits > th.delay_growth and waits * span >= th.delay_margin_s:
            reasons.append(f"queueing delay: the wait grows {waits:.3g} s per s of trace "
                           f"(+{waits * span:,.3g} s over the window)")
    prompt = int(np.median(prompt_lens)) if total else 0
    unloaded = unloaded_prefill_s(latency, prompt, chunk, page_size)
    _, ttft = ttft_halves(requests, start, end)
    ratio = ttft / unloaded if unloaded > 0 and math.isfinite(ttft) else math.nan
    return {"overloaded": bool(reasons), "overload_reason": "; ".join(reasons),
            "queue_growth_req_s": growth, "queue_delay_growth": waits,
            "unloaded_prefill_s": unloaded, "ttft_over_unloaded": ratio}


__all__ = ["NONE_UNFINISHED", "OVERLOAD_COLUMNS", "THRESHOLDS", "OverloadThresholds",
           "Unfinished", "backlog_floor", "delay_by_window", "delay_growth", "overload_verdict",
           "queue_growth", "theil_sen", "ttft_halves", "unloaded_prefill_s"]
