"""`trace_stats`: the numbers `kvsim trace stats` prints for any workload."""

from __future__ import annotations

import numpy as np

from workloads.request import Workload
from workloads.reuse import ideal_reuse_hits


def _summary(x: np.ndarray) -> dict[str, float]:
    if len(x) == 0:
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99", "min", "max")}
    return {
        "mean": float(np.mean(x)),
        "p50": float(np.percentile(x, 50)),
        "p90": float(np.percentile(x, 90)),
        "p99": float(np.percentile(x, 99)),
        "min": float(np.min(x)),
        "max": float(np.max(x)),
    }


def trace_stats(workload: Workload, page_size: int = 1) -> dict:
    """rows, duration_s (last - first nominal arrival), rate (rows / duration; None when the
    duration is 0), input / output length summaries (numpy's linear percentiles, as in the
    shared traces README), sessions, and the ideal reuse at `page_size`. Closed-loop turns use
    the nominal order of `Workload.nominal_requests`, so duration and rate are lower bounds."""
    reqs = workload.nominal_requests()
    arrivals = np.array([r.arrival_s for r in reqs], dtype=np.float64)
    inp = np.array([r.prompt_len for r in reqs], dtype=np.int64)
    out = np.array([r.output_len for r in reqs], dtype=np.int64)
    duration = float(arrivals.max() - arrivals.min()) if len(arrivals) else 0.0
    reuse = ideal_reuse_hits(workload, page_size)
    return {
        "name": workload.name,
        "rows": len(reqs),
        "sessions": len(workload.sessions),
        "duration_s": duration,
        "rate": len(reqs) / duration if duration > 0 else None,
        "input": _summary(inp),
        "output": _summary(out),
        "input_tokens": int(inp.sum()),
        "output_tokens": int(out.sum()),
        "page_size": page_size,
        "ideal_reuse": reuse.ratio,
        "ideal_hit_tokens": int(reuse.hits.sum()),
        "bad_rows": workload.meta.get("bad_rows", 0),
        "failed_rows": workload.meta.get("failed_rows", 0),
    }
