"""The page-size recommendation: read from a sweep's summary rows, never simulated here.

`kvsim plan --workload W` simulates the page sizes (experiments.planning); this module picks
one from the rows. Small pages pay per-page work, large pages pay rounding and missed reuse, so
a candidate must meet three rules:

* **servable**: its run is not overloaded (simulator/overload.py); an overloaded run measures
  the queue, not the page size, so its latency and hit rate say nothing about pages;
* **latency**: normalized latency within the margin of the best servable candidate's;
* **hit rate**: prefix hit rate within the margin of the best servable candidate's.

A margin is the largest of three, so that page sizes within noise are *equivalent*:

* relative: `tolerance` x the best (2 %);
* absolute: `hit_abs` (0.005: half a point of prompt tokens) for the hit rate, and
  `latency_abs_s` (0) for latency: 2 % of a 0.6 % hit rate is 0.00012, below what one
  request more or less changes, so a near-zero quantity needs an absolute floor;
* measured noise, two ways, the larger applies:
  - across seeds: with several rows per page size (`plan --seeds 0,1,2`), twice the standard error
    of a difference of two page sizes' means (2 x pooled SD x sqrt(2 / n));
  - within each run, so one seed has a band too: every run reports the standard error of its
    mean latency and hit rate by batch means (simulator/batch_means.py; the columns
    `normalized_latency_se_s`, `prefix_hit_rate_se`), and a candidate is compared with the
    best within twice the standard error of their difference, 2 x sqrt(se_c^2 + se_best^2)
    (each page size's SE divided by sqrt(rows) when it has several). This band is per
    candidate, so the margins are reported per row.

From the equivalent set (every rule met) the tie-break is stated: the **largest** page size, the
smallest page table and the fewest per-page costs (kvcore/planner.py's page-table bytes). When
no page size meets every rule it recommends **none**, with the rules each candidate fails: a
page size that breaks a rule by more than noise is never recommended anyway.
`reports.plan_view` renders it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

RULES = ("servable", "latency", "hit rate")
# summary columns averaged per page size when present (the reuse split, the overload detail)
_EXTRA = ("ideal_hit_rate", "reuse_gap_alignment", "reuse_gap_not_arrived",
          "reuse_gap_capacity", "reuse_gap_window", "reuse_gap_state", "rate_req_s")


@dataclass(frozen=True)
class PageSizeRecommendation:
    """The largest page size meeting every rule (None: none does; `reason` says why)."""

    page_size: int | None
    tolerance: float
    overloaded: bool  # some candidate's run is overloaded
    all_overloaded: bool  # every candidate's run is: nothing can be recommended
    best_latency_s: float
    best_latency_page_size: int | None
    best_hit_rate: float
    best_hit_page_size: int | None
    rule: str
    reason: str  # why this page size, or why none
    rows: list[dict[str, Any]]  # per page size: figures, `fails` (rule names), reasons
    latency_margin_s: float = 0.0  # max(relative, absolute, seed noise); rows: with run noise
    hit_margin: float = 0.0
    noise_latency_s: float = 0.0  # the measured noise bands (0 with one row per page size)
    noise_hit: float = 0.0

    @property
    def within_tolerance(self) -> bool:
        return self.page_size is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["recommended_page_size"] = self.page_size
        return d


def check_tolerance(tolerance: float) -> None:
    """--tolerance: a fraction >= 0 (checked before a study is simulated, and here)."""
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"--tolerance must be a number >= 0, got {tolerance!r}")


def _bool_col(df: Any, name: str) -> np.ndarray:
    if name not in df.columns:
        return np.zeros(len(df), dtype=bool)
    return df[name].map(lambda v: str(v).strip().lower() == "true").to_numpy(dtype=bool)


HIT_ABS = 0.005
LATENCY_ABS_S = 0.0


def noise_band(df: Any, column: str) -> float:
    """Twice the standard error of the difference of two page sizes' means, from the spread of
    the repeated rows (seeds) within each page size (pooled SD); 0 without repeats."""
    g = df.groupby("page_size")[column]
    n = g.count()
    var = g.var(ddof=1)
    keep = (n > 1) & var.notna()
    if not keep.any():
        return 0.0
    dof = (n[keep] - 1).sum()
    pooled = math.sqrt(float(((n[keep] - 1) * var[keep]).sum() / dof))
    return 2.0 * pooled * math.sqrt(2.0 / float(n[keep].mean()))


_SE_COLUMNS = {"normalized_latency_s": "normalized_latency_se_s",
               "prefix_hit_rate": "prefix_hit_rate_se"}


def run_noise(df: Any, column: str) -> np.ndarray:
    """Per page size (sorted), the standard error of its mean `column` from the runs' own
    batch-means SE column (mean SE / sqrt(rows)); 0 where the rows lack it or it is NaN."""
    se_col = _SE_COLUMNS[column]
    g = df.groupby("page_size", sort=True)
    if se_col not in df.columns:
        return np.zeros(g.ngroups)
    se = g[se_col].mean() / np.sqrt(g[se_col].count().clip(lower=1))
    return np.nan_to_num(se.to_numpy(dtype=float), nan=0.0)


def recommend_page_size(df: Any, tolerance: float = 0.02, *, hit_abs: float = HIT_ABS,
                        latency_abs_s: float = LATENCY_ABS_S) -> PageSizeRecommendation:
    """Pick from sweep rows (a pandas DataFrame with page_size, normalized_latency_s,
    prefix_hit_rate, and `overloaded` when the rows have it; several rows per page size, e.g.
    seeds, are averaged, and a page size is overloaded when any of its rows is)."""
    need = ("page_size", "normalized_latency_s", "prefix_hit_rate")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"sweep rows lack column(s) {', '.join(missing)}")
    if len(df) == 0:
        raise ValueError("sweep rows are empty")
    check_tolerance(tolerance)
    tol = float(tolerance)
    df = df.copy()  # consolidated: a column added to a wide frame must not warn
    df["_over"] = _bool_col(df, "overloaded")
    cols = [*need[1:], *(c for c in _EXTRA if c in df.columns)]
    g = df.groupby("page_size", sort=True)
    means = g[cols].mean()
    over = g["_over"].any().to_numpy(dtype=bool)
    why = g["overload_reason"].first() if "overload_reason" in df.columns else None
    servable = df[~df["_over"]]
    noise_lat = noise_band(servable, "normalized_latency_s") if len(servable) else 0.0
    noise_hit = noise_band(servable, "prefix_hit_rate") if len(servable) else 0.0
    ps = means.index.to_numpy(dtype=np.int64)
    lat = means["normalized_latency_s"].to_numpy(dtype=float)
    hit = means["prefix_hit_rate"].to_numpy(dtype=float)
    ok_run = ~over & np.isfinite(lat)
    se_lat, se_hit = run_noise(df, "normalized_latency_s"), run_noise(df, "prefix_hit_rate")
    if ok_run.any():
        i_lat = int(np.flatnonzero(ok_run)[np.argmin(lat[ok_run])])
        i_hit = int(np.flatnonzero(ok_run)[np.argmax(hit[ok_run])])
        best_lat, best_hit = float(lat[i_lat]), float(hit[i_hit])
        lat_margin = max(best_lat * tol, latency_abs_s, noise_lat)
        hit_margin = max(best_hit * tol, hit_abs, noise_hit)
        # per candidate: twice the SE of its difference from the best, from the runs' own noise
        lat_margins = np.maximum(lat_margin, 2.0 * np.sqrt(se_lat**2 + se_lat[i_lat] ** 2))
        hit_margins = np.maximum(hit_margin, 2.0 * np.sqrt(se_hit**2 + se_hit[i_hit] ** 2))
        lat_ok = ok_run & (lat <= best_lat + lat_margins)
        hit_ok = ok_run & (hit >= best_hit - hit_margins)
    else:
        i_lat = i_hit = -1
        best_lat = best_hit = math.nan
        lat_margin = hit_margin = math.nan
        lat_margins = hit_margins = np.full(len(ps), math.nan)
        lat_ok = hit_ok = np.zeros(len(ps), dtype=bool)
    ok = ok_run & lat_ok & hit_ok
    rows = []
    for i, p in enumerate(ps):
        fails, because = [], []
        if over[i] or not math.isfinite(lat[i]):
            fails.append("servable")
            because.append("overloaded: " + (str(why.iloc[i]) if why is not None
                                             and isinstance(why.iloc[i], str) else
                                             "no request completed"))
        else:
            if not lat_ok[i]:
                fails.append("latency")
                because.append(f"latency {lat[i]:.4g} s > {best_lat:.4g} + {lat_margins[i]:.3g}")
            if not hit_ok[i]:
                fails.append("hit rate")
                because.append(f"hit rate {hit[i]:.3g} < {best_hit:.3g} - {hit_margins[i]:.3g}")
        row: dict[str, Any] = {"page_size": int(p), "normalized_latency_s": float(lat[i]),
                               "prefix_hit_rate": float(hit[i]), "overloaded": bool(over[i]),
                               "latency_within": bool(lat_ok[i]), "hit_within": bool(hit_ok[i]),
                               "latency_margin_s": float(lat_margins[i]),
                               "hit_margin": float(hit_margins[i]),
                               "latency_se_s": float(se_lat[i]), "hit_rate_se": float(se_hit[i]),
                               "fails": fails, "why": "; ".join(because)}
        row.update({c: float(means[c].iloc[i]) for c in _EXTRA if c in means.columns})
        rows.append(row)
    rule = (f"largest page size (smallest page table) of the equivalent set: runs not "
            f"overloaded, normalized latency <= the best + max({tol:g} x best, "
            f"{latency_abs_s:g} s, seed noise {noise_lat:.3g} s, run noise) and prefix hit "
            f"rate >= the best - max({tol:g} x best, {hit_abs:g}, seed noise {noise_hit:.3g}, "
            "run noise); run noise: 2 x the standard error of the difference from the best, "
            "from each run's batch means")
    chosen = int(ps[ok].max()) if ok.any() else None
    if chosen is not None:
        n_eq = int(ok.sum())
        reason = (f"page size {chosen} is the largest of {n_eq} equivalent page size"
                  f"{'s' if n_eq > 1 else ''} ({', '.join(str(int(p)) for p in ps[ok])}: "
                  "within tolerance and noise of the best; tie-break: the smallest page "
                  "table) (best latency "
                  f"{best_lat:.4g} s at {int(ps[i_lat])}, best hit rate {best_hit:.3g} at "
                  f"{int(ps[i_hit])})")
    elif not ok_run.any():
        reason = ("no recommendation: every page size's run is overloaded, so latency and hit "
                  "rate measure the queue, not the page size; lower the load (kvsim capacity "
                  "finds the sustainable rate, or plan --at-sustainable-rate uses it)")
    else:
        reason = "no page size meets every rule: " + "; ".join(
            f"{r['page_size']} fails {', '.join(r['fails'])}" for r in rows if r["fails"])
    return PageSizeRecommendation(
        page_size=chosen, tolerance=tol, overloaded=bool(over.any()),
        all_overloaded=not bool(ok_run.any()), best_latency_s=best_lat,
        best_latency_page_size=int(ps[i_lat]) if i_lat >= 0 else None, best_hit_rate=best_hit,
        best_hit_page_size=int(ps[i_hit]) if i_hit >= 0 else None, rule=rule, reason=reason,
        rows=rows, latency_margin_s=lat_margin, hit_margin=hit_margin,
        noise_latency_s=noise_lat, noise_hit=noise_hit)


__all__ = ["HIT_ABS", "LATENCY_ABS_S", "RULES", "PageSizeRecommendation", "check_tolerance",
           "noise_band", "recommend_page_size", "run_noise"]
