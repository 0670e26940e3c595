"""The page-size recommendation: read from a sweep's summary rows, never simulated here.

`kvsim plan --workload W` simulates the page sizes (experiments.planning); this module picks
one from the rows: small pages pay per-page work, large pages pay rounding and missed reuse, so
the rule takes the largest page size within a tolerance of the best latency and the best
prefix hit rate. `reports.plan_view.render_recommendation` shows it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PageSizeRecommendation:
    """The largest page size within `tolerance` of the best latency and the best hit rate."""

    page_size: int
    tolerance: float
    best_latency_s: float
    best_latency_page_size: int
    best_hit_rate: float
    best_hit_page_size: int
    within_tolerance: bool  # False: nothing met both, the best-latency page size was taken
    rule: str
    rows: list[dict[str, float]]  # page_size, normalized_latency_s, prefix_hit_rate, flags

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_tolerance(tolerance: float) -> None:
    """--tolerance: a fraction >= 0 (checked before a study is simulated, and here)."""
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"--tolerance must be a number >= 0, got {tolerance!r}")


def recommend_page_size(df: Any, tolerance: float = 0.02) -> PageSizeRecommendation:
    """Pick from sweep rows (a pandas DataFrame with page_size, normalized_latency_s,
    prefix_hit_rate; several rows per page size, e.g. seeds, are averaged): the largest page
    size whose latency <= best x (1 + tol) and hit rate >= best x (1 - tol)."""
    need = ("page_size", "normalized_latency_s", "prefix_hit_rate")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"sweep rows lack column(s) {', '.join(missing)}")
    if len(df) == 0:
        raise ValueError("sweep rows are empty")
    check_tolerance(tolerance)
    tol = float(tolerance)
    g = df.groupby("page_size", sort=True)[list(need[1:])].mean()
    ps = g.index.to_numpy(dtype=np.int64)
    lat = g["normalized_latency_s"].to_numpy(dtype=float)
    hit = g["prefix_hit_rate"].to_numpy(dtype=float)
    i_lat = int(np.nanargmin(lat))
    i_hit = int(np.nanargmax(hit))
    lat_ok = lat <= lat[i_lat] * (1 + tol)
    hit_ok = hit >= hit[i_hit] * (1 - tol)
    ok = lat_ok & hit_ok
    chosen = int(ps[ok].max()) if ok.any() else int(ps[i_lat])
    rows = [{"page_size": int(p), "normalized_latency_s": float(a), "prefix_hit_rate": float(h),
             "latency_within": bool(lo), "hit_within": bool(ho)}
            for p, a, h, lo, ho in zip(ps, lat, hit, lat_ok, hit_ok, strict=True)]
    rule = (f"largest page size with normalized latency <= {lat[i_lat]:.4g} s x (1 + {tol:g}) "
            f"and prefix hit rate >= {hit[i_hit]:.4g} x (1 - {tol:g})")
    return PageSizeRecommendation(
        page_size=chosen, tolerance=tol, best_latency_s=float(lat[i_lat]),
        best_latency_page_size=int(ps[i_lat]), best_hit_rate=float(hit[i_hit]),
        best_hit_page_size=int(ps[i_hit]), within_tolerance=bool(ok.any()), rule=rule, rows=rows)


__all__ = ["PageSizeRecommendation", "check_tolerance", "recommend_page_size"]
