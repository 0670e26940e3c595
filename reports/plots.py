"""PNG figures from saved results (summary.csv, requests.parquet, timeline.parquet).

Every function takes DataFrames and returns the figure; `plot_dir` draws whatever the saved
data supports and writes the PNGs atomically, with the interactive page (reports.interactive)
beside them. Nothing here re-simulates. Lines are grouped and rows ordered by reports.series
(the swept axes, never a resolved column such as the pool size); a metric that is zero in
every run gets no figure (`left_out` says which and why, for the report). Overloaded runs are
drawn hollow and kept from setting an axis (reports.offscale); hit-rate axes start at 0 with the
trace's ideal as a reference line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from reports.interactive import fmt_number, write_interactive
from reports.io import check_writable, read_csv_or_empty, save_figure_atomic
from reports.offscale import draw_line, fit_servable
from reports.schema import CONFIG_FILE, REQUESTS_FILE, SUMMARY_FILE, TIMELINE_FILE
from reports.schema import PARTS_PCT as PART_COLUMNS
from reports.series import label, ordered, overloaded_mask, series_keys, with_axis_values

Axes_ = Mapping[str, Sequence[Any]] | None
PART_LABELS = ("token states", "cached (prefix)", "reserved", "internal frag.",
               "external frag.", "free")
PART_COLORS = ("#2b6cb0", "#68d391", "#f6ad55", "#e53e3e", "#9f7aea", "#e2e8f0")
TIMELINE_PARTS = ("token_states", "cached", "reserved", "internal", "external", "free")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", ":")
VS_PAGE_SIZE = {
    "internal_frag_pct": "internal fragmentation (% of KV)",
    "token_states_pct": "token-state share (% of KV)",
    "prefix_hit_rate": "prefix hit rate",
    "normalized_latency_s": "normalized latency (s / output token)",
    "throughput_tok_s": "throughput (tokens / s)",
}
# values spanning at least this ratio (two decades) are drawn on a log axis: a TTFT of 6,000 s
# next to one of 0.05 s leaves every servable run flat on a linear axis
LOG_SPAN = 100.0


def spans_decades(values: Any) -> bool:
    """True when the positive finite values span at least LOG_SPAN (and none is <= 0, which
    a log axis cannot show)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return bool(v.size and (v > 0).all() and v.max() / v.min() >= LOG_SPAN)


def _log_if_wide(ax: Axes, values: Any, axis: str = "y") -> None:
    if spans_decades(values):
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")


def left_out(summary: pd.DataFrame) -> dict[str, str]:
    """Figures (file name -> why) not drawn because their metric is zero (or missing) in every
    run: an empty figure says nothing a sentence cannot."""
    out: dict[str, str] = {}
    if "page_size" not in summary.columns or summary["page_size"].nunique() < 2:
        return out
    for metric, name in VS_PAGE_SIZE.items():
        if metric not in summary.columns:
            continue
        v = pd.to_numeric(summary[metric], errors="coerce").fillna(0.0)
        if not (v != 0).any():
            out[f"{metric}_vs_page_size.png"] = f"{name} is 0 in every run"
    return out


def bar_keys(summary: pd.DataFrame, axes: Axes_ = None) -> list[str]:
    """What tells one bar (or one run in a legend) from another: the series keys plus the
    page size when it varies."""
    keys = series_keys(summary, None, axes)
    if "page_size" in summary.columns and summary["page_size"].nunique() > 1 \
            and "page_size" not in keys:
        keys.insert(1 if keys[:1] == ["policy"] else 0, "page_size")
    return keys or (["policy"] if "policy" in summary.columns else [])


def breakdown_figure(summary: pd.DataFrame, title: str = "KV memory breakdown",
                     axes: Axes_ = None) -> Figure:
    """Stacked bars of the six-way breakdown (percent of KV capacity), one bar per run, by
    policy then page size; several seeds of one configuration are averaged."""
    summary = ordered(with_axis_values(summary, axes), axes)
    keys = bar_keys(summary, axes)
    g = summary.groupby(keys, sort=False)[list(PART_COLUMNS)].mean().reset_index()
    labels = [label(r, keys) if len(keys) > 1 else str(r[keys[0]]) for _, r in g.iterrows()]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(g) + 2.5), 4.5), layout="constrained")
    bottom = np.zeros(len(g))
    x = np.arange(len(g))
    for col, lab, color in zip(PART_COLUMNS, PART_LABELS, PART_COLORS, strict=True):
        vals = g[col].fillna(0.0).to_numpy(dtype=float)
        ax.bar(x, vals, bottom=bottom, label=lab, color=color, edgecolor="white", linewidth=0.5)
        bottom += vals
    ax.set_xticks(x, labels, rotation=30 if len(g) > 2 else 0, ha="right" if len(g) > 2
                  else "center", fontsize=8)
    ax.set_ylabel("% of KV capacity (time-weighted)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


def _over_by(g: pd.DataFrame, x: str) -> pd.Series:
    """Per x value: is any run there overloaded (a seed average that includes a backlog is
    drawn hollow too)."""
    return overloaded_mask(g).groupby(g[x]).any()


def _ideal(summary: pd.DataFrame) -> float | None:
    """The trace's ideal hit rate (infinite cache; `ideal_hit_rate`, else the older
    `ideal_reuse` column), None when the summary has neither."""
    for col in ("ideal_hit_rate", "ideal_reuse"):
        if col in summary.columns:
            v = pd.to_numeric(summary[col], errors="coerce").dropna()
            if len(v):
                return float(v.max())
    return None


def vs_page_size_figure(summary: pd.DataFrame, metric: str, axes: Axes_ = None,
                        notes: list[str] | None = None) -> Figure:
    """`metric` against page size (log2 axis), one line per policy (and per other swept
    axis); seeds averaged. Overloaded points are hollow and the y range (log when the values
    span decades) comes from the servable ones; a hit rate starts at 0 with the trace's ideal
    as a dashed line. Off-scale points are appended to `notes`."""
    summary = ordered(with_axis_values(summary, axes), axes)
    keys = series_keys(summary, "page_size", axes)
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    groups = summary.groupby(keys, sort=False) if keys else [((), summary)]
    drawn = []
    for i, (_key, g) in enumerate(groups):
        s = g.groupby("page_size")[metric].mean().sort_index()
        over = _over_by(g, "page_size").reindex(s.index, fill_value=False)
        drawn.append(draw_line(ax, s.index, s.values, over.to_numpy(),
                               marker=MARKERS[i % len(MARKERS)],
                               linestyle=LINESTYLES[i // len(MARKERS) % len(LINESTYLES)]
                               if i else "-", name=label(g.iloc[0], keys), alpha=0.85))
    hit = metric == "prefix_hit_rate"
    ideal = _ideal(summary) if hit else None
    if ideal is not None:
        ax.axhline(ideal, color="k", linestyle="--", linewidth=1, label="ideal (trace)")
    ax.set_xscale("log", base=2)
    ticks = sorted(summary["page_size"].unique())
    ax.set_xticks(ticks, [str(int(t)) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("page size (tokens)")
    ax.set_ylabel(VS_PAGE_SIZE.get(metric, metric))
    ax.set_title(f"{VS_PAGE_SIZE.get(metric, metric)} vs page size")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    off = fit_servable(ax, drawn, from_zero=hit, ref=ideal, top=1.02 if hit else None,
                       x_fmt=lambda v: f"page {int(v)}")
    if notes is not None:
        notes.extend(off)
    return fig


def max_rate_meeting(g: pd.DataFrame, slo_ttft: float | None,
                     slo_tpot: float | None) -> float | None:
    """Highest rate whose p99 TTFT and p99 TPOT meet the targets (None: none, or no target)."""
    if slo_ttft is None and slo_tpot is None:
        return None
    s = g.groupby("rate_req_s")[["ttft_p99_s", "tpot_p99_s"]].mean().sort_index()
    ok = pd.Series(True, index=s.index)
    if slo_ttft is not None:
        ok &= s["ttft_p99_s"] <= slo_ttft
    if slo_tpot is not None:
        ok &= s["tpot_p99_s"] <= slo_tpot
    return float(s.index[ok.to_numpy()].max()) if ok.any() else None


def latency_vs_rate_figure(summary: pd.DataFrame, slo_ttft: float | None = None,
                           slo_tpot: float | None = None, axes: Axes_ = None,
                           notes: list[str] | None = None) -> Figure:
    """Normalized latency against request rate, one line per policy (and other swept axis);
    the highest rate that meets the TTFT / TPOT targets (p99) is marked on each line.
    Overloaded rates are hollow and do not set the y range (off-scale ones go to `notes`)."""
    summary = ordered(with_axis_values(summary, axes), axes)
    keys = series_keys(summary, "rate_req_s", axes) or ["policy"]
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    drawn = []
    for _, g in summary.groupby(keys, sort=False):
        s = g.groupby("rate_req_s")["normalized_latency_s"].mean().sort_index()
        over = _over_by(g, "rate_req_s").reindex(s.index, fill_value=False)
        d = draw_line(ax, s.index, s.values, over.to_numpy(), name=label(g.iloc[0], keys))
        drawn.append(d)
        best = max_rate_meeting(g, slo_ttft, slo_tpot)
        if best is not None:
            ax.axvline(best, color=d.color, linestyle="--", alpha=0.6)
            ax.plot([best], [s.loc[best]], marker="*", markersize=14, color=d.color)
    target = ", ".join(t for t in (f"TTFT p99 <= {slo_ttft:g} s" if slo_ttft else "",
                                   f"TPOT p99 <= {slo_tpot:g} s" if slo_tpot else "") if t)
    ax.set_xlabel("request rate (req / s)")
    ax.set_ylabel("normalized latency (s / output token)")
    ax.set_title("latency vs rate" + (f" (star: max rate with {target})" if target else ""),
                 fontsize=9 if target else None)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    off = fit_servable(ax, drawn, x_fmt=lambda v: f"{fmt_number(float(v))} req/s")
    if notes is not None:
        notes.extend(off)
    return fig


def timeline_figure(timeline: pd.DataFrame, title: str = "KV memory over time") -> Figure:
    """Stacked area of the breakdown (slots) over simulated time."""
    fig, ax = plt.subplots(figsize=(7, 3.8), layout="constrained")
    t = timeline["time_s"].to_numpy(dtype=float)
    ys = [timeline[p].to_numpy(dtype=float) for p in TIMELINE_PARTS]
    ax.stackplot(t, ys, labels=PART_LABELS, colors=PART_COLORS, step="post")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV slots")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


CDF_POINTS = 4096  # points of one drawn CDF line at most (a figure is ~1,000 pixels wide)


def cdf_points(v: np.ndarray, limit: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of sorted `v` as (x, fraction <= x) points: every value when there are
    at most `limit`, else `limit` of them at evenly spaced ranks, first and last included
    (each an exact point of the same step function). A day-long run's million latencies
    drawn whole took about 160 MB of matplotlib's memory for one figure."""
    n = len(v)
    ranks = np.arange(n) if n <= limit else np.unique(np.linspace(0, n - 1, limit).round()
                                                       .astype(np.int64))
    return v[ranks], (ranks + 1) / n


def cdf_figure(requests: pd.DataFrame, label_of: dict[str, str],
               overloaded: frozenset[str] = frozenset(), notes: list[str] | None = None
               ) -> Figure:
    """TTFT and TPOT CDFs of completed requests, one line per run. Runs whose config hash is in
    `overloaded` are drawn dashed and marked, and their latencies (the backlog they built) do
    not set the x range nor the log scale while a servable run exists; what falls beyond the
    servable range is named in `notes` (reports/offscale.py does the same for the other
    figures)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), layout="constrained")
    done = requests[requests["status"] == "completed"]
    keyed = "config_hash" in done.columns
    groups = done.groupby("config_hash", sort=False) if keyed else [("run", done)]
    over_rows = (done["config_hash"].astype(str).isin(overloaded) if keyed and overloaded
                 else pd.Series(False, index=done.index))
    servable = done[~over_rows]
    for h, g in groups:
        over = str(h) in overloaded
        name = label_of.get(str(h), str(h)) + (" (overloaded)" if over else "")
        style = {"linestyle": "--", "alpha": 0.7} if over else {}
        for ax, col in zip(axes, ("ttft_s", "tpot_s"), strict=True):
            v = np.sort(g[col].dropna().to_numpy(dtype=float))
            if len(v):
                ax.plot(*cdf_points(v), label=name, **style)
    for ax, name, col in zip(axes, ("TTFT (s)", "TPOT (s)"), ("ttft_s", "tpot_s"), strict=True):
        ref = servable[col].dropna()
        if len(ref) and over_rows.any():
            _log_if_wide(ax, ref, axis="x")
            hi = float(ref.max())
            beyond = done.loc[over_rows, col].dropna()
            if len(beyond) and float(beyond.max()) > hi > 0:
                ax.set_xlim(right=hi * (1.5 if ax.get_xscale() == "log" else 1.05))
                if notes is not None:
                    notes.append(f"{name.split()[0]} CDF: overloaded runs reach "
                                 f"{fmt_number(float(beyond.max()))} s, beyond the servable "
                                 f"runs' {fmt_number(hi)} s (off-scale)")
        else:
            _log_if_wide(ax, done[col], axis="x")
        ax.set_xlabel(name)
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name.split()[0]} CDF")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return fig


# a host-tier figure's hit-rate parts: column, name, marker, line style (color: the series)
TIER_PARTS = (("prefix_hit_rate", "total", "o", "-"), ("device_hit_rate", "device", "s", "--"),
              ("host_hit_rate", "host", "^", ":"), ("storage_hit_rate", "storage", "D", "-."))


def host_tier_keys(summary: pd.DataFrame, axes: Axes_ = None) -> list[str]:
    """What tells the host-tier figure's lines apart: the series keys (policy and the other
    swept axes), and the write policy when the rows differ in it (runs of several write
    policies read together): every axis the user compares gets its own line."""
    keys = series_keys(summary, "hicache_ratio", axes)
    if ("hicache_write_policy" in summary.columns and "hicache_write_policy" not in keys
            and summary["hicache_write_policy"].astype(str).nunique() > 1):
        keys.append("hicache_write_policy")
    return keys


def host_tier_figure(summary: pd.DataFrame, notes: list[str] | None = None,
                     axes: Axes_ = None) -> Figure:
    """Hit rate (total and its device / host / storage parts) and TTFT against the host
    tier's size (x the device pool), one panel each, one color per policy (and per other
    swept axis, and per write policy when the rows differ in it: never averaged over them;
    seeds are), with the trace's ideal reuse as a line: how much host memory a hit rate
    needs, and what the loads cost in time to first token. The hit-rate axis starts at 0;
    overloaded sizes are hollow and do not set the TTFT range (off-scale ones go to
    `notes`)."""
    summary = ordered(with_axis_values(summary, axes), axes)
    keys = host_tier_keys(summary, axes)
    groups = summary.groupby(keys, sort=False) if keys else [((), summary)]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    drawn, lat = [], []
    xs: list[float] = []
    for i, (_key, g) in enumerate(groups):
        s = g.groupby("hicache_ratio").mean(numeric_only=True).sort_index()
        over = _over_by(g, "hicache_ratio").reindex(s.index, fill_value=False).to_numpy()
        x = s.index.to_numpy(dtype=float)
        xs.extend(x.tolist())
        prefix = f"{label(g.iloc[0], keys)}: " if keys else ""
        color = f"C{i % 10}"
        for col, part, marker, style in TIER_PARTS:
            if col in s.columns and (col == "prefix_hit_rate" or s[col].any()):
                drawn.append(draw_line(ax, x, s[col].to_numpy(), over, marker=marker,
                                       linestyle=style, name=f"{prefix}{part}", color=color,
                                       alpha=0.85))
        lat.append(draw_line(bx, x, s["ttft_p50_s"].to_numpy(), over, color=color,
                             name=f"{prefix}TTFT p50"))
        if "ttft_p99_s" in s.columns:
            lat.append(draw_line(bx, x, s["ttft_p99_s"].to_numpy(), over, marker="s",
                                 linestyle="--", color=color, name=f"{prefix}TTFT p99"))
    ideal = _ideal(summary)
    if ideal is not None:
        ax.axhline(ideal, color="k", linestyle="--", linewidth=1, label="ideal reuse (trace)")
    ax.set_xlabel("host tier (x device pool)")
    ax.set_ylabel("prefix hit rate")
    ax.set_title("hit rate vs host-tier size")
    ax.legend(fontsize=7)
    fit_servable(ax, drawn, from_zero=True, ref=ideal, top=1.02)
    bx.set_xlabel("host tier (x device pool)")
    bx.set_ylabel("seconds")
    bx.set_title("TTFT vs host-tier size")
    bx.legend(fontsize=7)
    off = fit_servable(bx, lat, x_fmt=lambda v: f"host x{v:g}")
    if notes is not None:
        notes.extend(off)
    x = np.unique(np.asarray(xs, dtype=float))
    for a in (ax, bx):
        if len(x) > 2 and x.max() >= 8 * max(x[x > 0].min(), 1e-9):  # sizes spread by powers
            a.set_xscale("symlog", base=2, linthresh=max(float(x[x > 0].min()), 1e-3))
            a.set_xticks(x, [f"{v:g}" for v in x])
            a.set_xlim(float(x.min()) - 0.1, float(x.max()) * 1.2)
        a.grid(True, alpha=0.3)
    return fig


def _save(fig: Figure, path: Path, written: list[Path]) -> None:
    save_figure_atomic(path, fig, dpi=110)
    plt.close(fig)
    written.append(path)


def plot_results(summary: pd.DataFrame, out: str | Path, *,
                 requests: pd.DataFrame | None = None, timeline: pd.DataFrame | None = None,
                 slo_ttft: float | None = None, slo_tpot: float | None = None,
                 axes: Axes_ = None, off_scale: dict[str, list[str]] | None = None
                 ) -> list[Path]:
    """Every figure the data supports, into `out`, and the interactive page beside them
    (`axes`: the sweep's axes, which decide the lines); returns the paths written.
    `off_scale`, when given, receives figure name -> the overloaded points drawn at an axis
    edge (for the report's summary)."""
    off_scale = {} if off_scale is None else off_scale
    out = Path(out)
    written: list[Path] = []
    if summary.empty:
        return written
    check_writable(out, "the figure directory")
    _save(breakdown_figure(summary, axes=axes), out / "breakdown.png", written)
    skipped = left_out(summary)
    if "page_size" in summary.columns and summary["page_size"].nunique() > 1:
        for metric in VS_PAGE_SIZE:
            name = f"{metric}_vs_page_size.png"
            if metric in summary.columns and name not in skipped:
                notes = off_scale.setdefault(name, [])
                _save(vs_page_size_figure(summary, metric, axes, notes), out / name, written)
    if "hicache_ratio" in summary.columns and summary["hicache_ratio"].nunique() > 1:
        name = "hit_rate_ttft_vs_host_tier.png"
        _save(host_tier_figure(summary, off_scale.setdefault(name, []), axes), out / name,
              written)
    if "rate_req_s" in summary.columns and summary["rate_req_s"].nunique() > 1:
        _save(latency_vs_rate_figure(summary, slo_ttft, slo_tpot, axes,
                                     off_scale.setdefault("latency_vs_rate.png", [])),
              out / "latency_vs_rate.png", written)
    named = with_axis_values(summary, axes)
    keys = bar_keys(named, axes) or ["policy"]
    label_of = {str(r["config_hash"]): label(r, keys) for _, r in named.iterrows()
                if "config_hash" in named.columns}
    if requests is not None and len(requests):
        over = (frozenset(summary.loc[overloaded_mask(summary), "config_hash"].astype(str))
                if "config_hash" in summary.columns else frozenset())
        _save(cdf_figure(requests, label_of, over, off_scale.setdefault("latency_cdf.png", [])),
              out / "latency_cdf.png", written)
    if timeline is not None and len(timeline):
        if "config_hash" in timeline.columns:
            first = str(timeline["config_hash"].iloc[0])
            tl = timeline[timeline["config_hash"].astype(str) == first]
            title = f"KV memory over time ({label_of.get(first, first)})"
        else:
            tl, title = timeline, "KV memory over time"
        _save(timeline_figure(tl, title), out / "memory_timeline.png", written)
    written.append(write_interactive(out / "interactive.html", summary, axes))
    for name in [n for n, v in off_scale.items() if not v]:
        del off_scale[name]
    return written


def saved_axes(results: str | Path) -> dict[str, list[Any]] | None:
    """The sweep axes recorded in DIR/config.json (None: no file, or no axes)."""
    p = Path(results) / CONFIG_FILE
    if not p.exists():
        return None
    try:
        axes = json.loads(p.read_text()).get("axes")
    except (ValueError, AttributeError):
        return None
    return axes if isinstance(axes, dict) and axes else None


# the columns of requests.parquet a figure reads (cdf_figure): a day-long run's file has a
# million rows, and its other columns would only take memory
FIGURE_REQUEST_COLUMNS = ("config_hash", "status", "ttft_s", "tpot_s")


def _read_request_columns(path: Path) -> pd.DataFrame:
    import pyarrow.parquet as pq

    names = set(pq.read_schema(path).names)
    return pd.read_parquet(path, columns=[c for c in FIGURE_REQUEST_COLUMNS if c in names])


def plot_dir(results: str | Path, out: str | Path | None = None, **kw: Any) -> list[Path]:
    """Figures from a results directory (summary.csv, the parquet files when present, the
    axes from config.json)."""
    d = Path(results)
    summary = read_csv_or_empty(d / SUMMARY_FILE)
    if summary.empty:
        raise ValueError(f"DIR {str(d)!r} has no summary.csv with rows (expected the --out "
                         "directory of kvsim run / sweep / compare)")
    req = d / REQUESTS_FILE
    tl = d / TIMELINE_FILE
    kw.setdefault("axes", saved_axes(d))
    return plot_results(summary, out or d / "figures",
                        requests=_read_request_columns(req) if req.exists() else None,
                        timeline=pd.read_parquet(tl) if tl.exists() else None, **kw)
