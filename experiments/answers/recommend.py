"""The page-size recommendation: read from a sweep's summary rows, never simulated here.

`kvsim plan --workload W` simulates the page sizes (experiments.answers.planning); this module
picks one from the rows, and writes the one sentence `plan` prints and the report opens with
(`PageSizeRecommendation.reason`; `kvsim report` passes `page_size_sentence` to reports), so
both say the same thing in the same words. Small pages
pay per-page work, large pages pay rounding and missed reuse, so a candidate must meet three
rules:

* **servable**: its run is not overloaded (simulator/overload.py); an overloaded run measures
  the queue, not the page size, so its latency and hit rate say nothing about pages;
* **latency**: normalized latency within its band of the best servable candidate's;
* **hit rate**: prefix hit rate within its band of the best servable candidate's.

A candidate's band is the largest of three, so that page sizes within noise are *equivalent*:

* relative: `tolerance` x the best (2 %);
* absolute: `hit_abs` (0.005: half a point of prompt tokens) for the hit rate, and
  `latency_abs_s` (0) for latency: 2 % of a 0.6 % hit rate is 0.00012, below what one
  request more or less changes, so a near-zero quantity needs an absolute floor;
* noise: twice the standard error of the candidate's *paired* difference from the best. The
  runs of one seed serve the same requests at the same times at every page size (common
  random numbers), so their figures move together and the noise of a difference is the
  spread of its batch-by-batch differences, not the two runs' errors added as if independent
  (which, near capacity, made a band wide enough to call a 41 % slower page size
  equivalent). Every run keeps its 10 batch figures (simulator/batch_means.py; the columns
  `normalized_latency_batches_s`, `prefix_hit_rate_batches`), and the standard error is
  sd(differences) / sqrt(count) over every batch of every seed the two page sizes share.
  Rows without batch figures (written before they existed) fall back to the per-seed
  differences when there are two seeds or more; with one seed and no batch figures the band
  is **unknown**: the rule is then the tolerance alone, and the sentence says so.

From the equivalent set (every rule met) the tie-break is stated: the **largest** page size, the
smallest page table and the fewest per-page costs (kvcore/model/planner.py's page-table bytes).
When no page size meets every rule it recommends **none**, with the rules each candidate fails:
a page size that breaks a rule by more than its band is never recommended anyway.
`reports.plan_view` renders it as a table; `recommendation_notes` and `reuse_line` say it in
lines.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from reports.reuse_view import reuse_sentence
from simulator.batch_means import BATCHES, parse_batches

RULES = ("servable", "latency", "hit rate")
# summary columns averaged per page size when present (the reuse split, the overload detail)
_EXTRA = ("ideal_hit_rate", "reuse_gap_alignment", "reuse_gap_not_arrived",
          "reuse_gap_capacity", "reuse_gap_window", "reuse_gap_state", "rate_req_s")
# a metric -> its runs' batch figures (simulator/run.py noise_columns) and own standard error
BATCH_COLUMNS = {"normalized_latency_s": "normalized_latency_batches_s",
                 "prefix_hit_rate": "prefix_hit_rate_batches"}
SE_COLUMNS = {"normalized_latency_s": "normalized_latency_se_s",
              "prefix_hit_rate": "prefix_hit_rate_se"}
HIT_ABS = 0.005
TOLERANCE = 0.02  # `kvsim plan --tolerance`'s default
LATENCY_ABS_S = 0.0
Z = 2.0  # the band is Z standard errors of the difference (about 95 %)


@dataclass(frozen=True)
class Band:
    """The noise band of a candidate's difference from the best: `half_width` = Z x its
    standard error (NaN: unknown), what it rests on (`basis`: "batch means", "seeds" or
    "unknown") and how many paired differences (`pairs`) over how many seeds."""

    half_width: float
    basis: str
    pairs: int
    seeds: int


UNKNOWN = Band(math.nan, "unknown", 0, 0)


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
    reason: str  # why this page size, or why none: the sentence plan and the report print
    rows: list[dict[str, Any]]  # per page size: figures, bands, `fails` (rule names), `why`
    latency_margin_s: float = 0.0  # the floor of every band: max(tolerance x best, absolute)
    hit_margin: float = 0.0
    noise_latency_s: float = 0.0  # the widest noise band of a candidate (0: none known)
    noise_hit: float = 0.0
    noise_basis: str = "unknown"  # what the noise bands rest on, in words
    seeds: int = 1  # runs per page size

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


Runs = dict[Any, tuple[float, np.ndarray]]  # seed -> (the run's figure, its batch figures)


def _runs(df: Any, column: str) -> dict[int, Runs]:
    """Per page size, its runs of `column` by seed (by row order without a seed column)."""
    batch_col = BATCH_COLUMNS[column]
    keys = (df["seed"] if "seed" in df.columns else df.groupby("page_size").cumcount())
    out: dict[int, Runs] = {}
    for (ps, key), (value, cell) in zip(
            zip(df["page_size"].astype(int), keys, strict=True),
            zip(df[column].astype(float),
                df[batch_col] if batch_col in df.columns else [None] * len(df), strict=True),
            strict=True):
        out.setdefault(int(ps), {})[key] = (float(value), parse_batches(cell))
    return out


def _differences(a: np.ndarray, b: np.ndarray, ratio: bool) -> np.ndarray:
    """Paired differences of a candidate's figures `a` from the best's `b`: log ratios for a
    positive quantity compared relatively, else plain differences."""
    if ratio:
        return np.log(a / b)
    return a - b


def paired_band(cand: Runs, best: Runs, best_value: float, *, ratio: bool = False) -> Band:
    """Z x the standard error of the candidate's difference from the best, paired run by run
    (same seed): over their batch figures when every shared run has them (same count), else
    over the seeds' own figures when they share two or more, else unknown. With `ratio`
    (latency) the differences are log ratios, so one burst that doubles both runs' latency
    weighs as much as a quiet stretch: the band is best x (exp(Z x SE) - 1), a relative band
    as the tolerance is; without, the band is Z x SE of the plain differences."""
    shared = [k for k in cand if k in best]
    if not shared:
        return UNKNOWN
    a = [cand[k][1] for k in shared]
    b = [best[k][1] for k in shared]
    batches = all(len(x) == BATCHES and len(y) == BATCHES for x, y in zip(a, b, strict=True))
    if batches:
        x, y, basis = np.concatenate(a), np.concatenate(b), "batch means"
    elif len(shared) >= 2:
        x = np.array([cand[k][0] for k in shared])
        y = np.array([best[k][0] for k in shared])
        basis = "seeds"
    else:
        return Band(math.nan, "unknown", 0, len(shared))
    ratio = ratio and bool((x > 0).all() and (y > 0).all()) and best_value > 0
    d = _differences(x, y, ratio)
    if not np.isfinite(d).all():
        return Band(math.nan, "unknown", 0, len(shared))
    z_se = Z * float(d.std(ddof=1)) / math.sqrt(len(d))
    half = best_value * math.expm1(z_se) if ratio else z_se
    return Band(half, basis, len(d), len(shared))


def _basis(bands: list[Band], seeds: int) -> str:
    """What the noise bands rest on, in words (the sentence's basis)."""
    kinds = {b.basis for b in bands}
    runs = f"{seeds} seed{'s' if seeds != 1 else ''}"
    if not bands or kinds == {"unknown"}:
        return (f"the noise band is unknown ({runs}, no batch figures in the rows): "
                "equivalence within the tolerance only; plan --seeds 0,1,2 measures it")
    words = []
    if "batch means" in kinds:
        words.append(f"paired batch means ({BATCHES} batches x {runs})")
    if "seeds" in kinds:
        words.append(f"the paired runs of {runs}")
    if "unknown" in kinds:
        words.append("unknown for page sizes without batch figures")
    return (f"noise: {Z:g} x the standard error of each page size's difference from the "
            "best (latency as a log ratio, hit rate as a difference), by " + "; ".join(words))


def _gap(value: float, best: float) -> str:
    """A difference from the best, relative when the best is not 0."""
    if best != 0 and math.isfinite(best):
        return f"{(value - best) / abs(best):+.1%}"
    return f"{value - best:+.3g}"


def _band_pct(margin: float, best: float) -> str:
    return f"{margin / abs(best):.1%}" if best != 0 and math.isfinite(best) else f"{margin:.3g}"


def recommend_page_size(df: Any, tolerance: float = TOLERANCE, *, hit_abs: float = HIT_ABS,
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
    seeds = int(g.size().max())
    ps = means.index.to_numpy(dtype=np.int64)
    lat = means["normalized_latency_s"].to_numpy(dtype=float)
    hit = means["prefix_hit_rate"].to_numpy(dtype=float)
    se = {c: (g[SE_COLUMNS[c]].mean().to_numpy(dtype=float) if SE_COLUMNS[c] in df.columns
              else np.full(len(ps), math.nan)) for c in need[1:]}
    ok_run = ~over & np.isfinite(lat)
    n = len(ps)
    lat_band = [UNKNOWN] * n
    hit_band = [UNKNOWN] * n
    if ok_run.any():
        i_lat = int(np.flatnonzero(ok_run)[np.argmin(lat[ok_run])])
        i_hit = int(np.flatnonzero(ok_run)[np.argmax(hit[ok_run])])
        best_lat, best_hit = float(lat[i_lat]), float(hit[i_hit])
        lat_floor = max(best_lat * tol, latency_abs_s)
        hit_floor = max(best_hit * tol, hit_abs)
        lat_runs = _runs(df, "normalized_latency_s")
        hit_runs = _runs(df, "prefix_hit_rate")
        for i in np.flatnonzero(ok_run):
            lat_band[i] = paired_band(lat_runs[int(ps[i])], lat_runs[int(ps[i_lat])],
                                      best_lat, ratio=True)
            hit_band[i] = paired_band(hit_runs[int(ps[i])], hit_runs[int(ps[i_hit])],
                                      best_hit)
        lat_margins = np.array([max(lat_floor, np.nan_to_num(b.half_width)) for b in lat_band])
        hit_margins = np.array([max(hit_floor, np.nan_to_num(b.half_width)) for b in hit_band])
        lat_ok = ok_run & (lat <= best_lat + lat_margins)
        hit_ok = ok_run & (hit >= best_hit - hit_margins)
    else:
        i_lat = i_hit = -1
        best_lat = best_hit = math.nan
        lat_floor = hit_floor = math.nan
        lat_margins = hit_margins = np.full(n, math.nan)
        lat_ok = hit_ok = np.zeros(n, dtype=bool)
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
                because.append(f"latency {lat[i]:.4g} s/token is {_gap(lat[i], best_lat)} "
                               f"from the best {best_lat:.4g} (page {int(ps[i_lat])}), "
                               f"beyond its band +{lat_margins[i]:.3g} "
                               f"({_band_pct(lat_margins[i], best_lat)})")
            if not hit_ok[i]:
                fails.append("hit rate")
                because.append(f"hit rate {hit[i]:.3g} is {_gap(hit[i], best_hit)} from the "
                               f"best {best_hit:.3g} (page {int(ps[i_hit])}), beyond its band "
                               f"-{hit_margins[i]:.3g}")
        lb, hb = lat_band[i], hit_band[i]
        row: dict[str, Any] = {"page_size": int(p), "normalized_latency_s": float(lat[i]),
                               "prefix_hit_rate": float(hit[i]), "overloaded": bool(over[i]),
                               "latency_within": bool(lat_ok[i]), "hit_within": bool(hit_ok[i]),
                               "latency_margin_s": float(lat_margins[i]),
                               "hit_margin": float(hit_margins[i]),
                               "latency_band_s": lb.half_width, "hit_band": hb.half_width,
                               "band_basis": lb.basis,
                               "latency_se_s": float(se["normalized_latency_s"][i]),
                               "hit_rate_se": float(se["prefix_hit_rate"][i]),
                               "latency_vs_best": (_gap(lat[i], best_lat)
                                                   if ok_run[i] else "-"),
                               "fails": fails, "why": "; ".join(because)}
        row.update({c: float(means[c].iloc[i]) for c in _EXTRA if c in means.columns})
        rows.append(row)
    known = [b for b, o in zip(lat_band + hit_band, [*ok_run, *ok_run], strict=True) if o]
    basis = _basis(known, seeds)
    rule = (f"servable (not overloaded); latency <= the best + max({tol:.0%} of the best, "
            f"{latency_abs_s:g} s, noise) and hit rate >= the best - max({tol:.0%} of the best,"
            f" {hit_abs:g}, noise); {basis}; of those, the largest page size (the smallest "
            "page table)")
    chosen = int(ps[ok].max()) if ok.any() else None
    if chosen is not None:
        eq = [i for i in range(n) if ok[i]]
        bands = ", ".join(f"{int(ps[i])} {_gap(lat[i], best_lat)} (band "
                          f"{_band_pct(lat_margins[i], best_lat)})" for i in eq)
        which = (f"is the largest of {len(eq)} equivalent page sizes" if len(eq) > 1 else
                 "is the only page size within the bands of the best")
        hit_bands = ", ".join(f"{int(ps[i])} {hit[i] - best_hit:+.3g} (band "
                              f"{hit_margins[i]:.3g})" for i in eq)
        reason = (f"page size {chosen} {which}: latency within its band of the best "
                  f"({best_lat:.4g} s/token at page {int(ps[i_lat])}): {bands}; hit rate "
                  f"within its band of the best ({best_hit:.3g} at page {int(ps[i_hit])}): "
                  f"{hit_bands}; band = max({tol:.0%} of the best, {latency_abs_s:g} s / "
                  f"{hit_abs:g} hit rate, noise); {basis}; tie-break: the smallest page table")
    elif not ok_run.any():
        reason = ("no recommendation: every page size's run is overloaded, so latency and hit "
                  "rate measure the queue, not the page size; lower the load (kvsim capacity "
                  "finds the sustainable rate, or plan --at-sustainable-rate uses it)")
    else:
        reason = "no page size meets every rule: " + "; ".join(
            f"{r['page_size']} fails {', '.join(r['fails'])}" for r in rows if r["fails"]) \
            + f" ({basis})"
    finite = [b.half_width for b in lat_band if math.isfinite(b.half_width)]
    finite_hit = [b.half_width for b in hit_band if math.isfinite(b.half_width)]
    return PageSizeRecommendation(
        page_size=chosen, tolerance=tol, overloaded=bool(over.any()),
        all_overloaded=not bool(ok_run.any()), best_latency_s=best_lat,
        best_latency_page_size=int(ps[i_lat]) if i_lat >= 0 else None, best_hit_rate=best_hit,
        best_hit_page_size=int(ps[i_hit]) if i_hit >= 0 else None, rule=rule, reason=reason,
        rows=rows, latency_margin_s=lat_floor, hit_margin=hit_floor,
        noise_latency_s=max(finite, default=0.0), noise_hit=max(finite_hit, default=0.0),
        noise_basis=basis, seeds=seeds)


def page_size_sentence(rows: Any) -> str:
    """The recommendation's sentence for `rows` at the default tolerance: the rule a report
    applies to each policy's servable rows (reports.report_summary)."""
    return recommend_page_size(rows, TOLERANCE).reason


def recommendation_notes(rec: PageSizeRecommendation) -> list[str]:
    """One line per failing candidate (which rule, by how much), for the text output."""
    return [f"page size {r['page_size']}: {r['why']}" for r in rec.rows if r["fails"]]


def reuse_line(rec: PageSizeRecommendation) -> str | None:
    """Achieved vs ideal reuse in words (reports.reuse_view), for the recommended page size
    (else the largest)."""
    if not rec.rows:
        return None
    row = next((r for r in rec.rows if r["page_size"] == rec.page_size), rec.rows[-1])
    return reuse_sentence(row, f"page size {row['page_size']}")


__all__ = ["BATCH_COLUMNS", "HIT_ABS", "LATENCY_ABS_S", "RULES", "SE_COLUMNS", "TOLERANCE", "Band",
           "PageSizeRecommendation", "check_tolerance", "page_size_sentence", "paired_band",
           "recommend_page_size", "recommendation_notes", "reuse_line"]
