"""PNG figures from saved results (summary.csv, requests.parquet, timeline.parquet).

Every function takes DataFrames and returns the figure; `plot_dir` draws whatever the saved
data supports and writes the PNGs atomically. Nothing here re-simulates.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from reports.io import read_csv_or_empty, save_figure_atomic
from reports.schema import PARTS_PCT as PART_COLUMNS
from reports.schema import REQUESTS_FILE, SUMMARY_FILE, TIMELINE_FILE

PART_LABELS = ("token states", "cached (prefix)", "reserved", "internal frag.",
               "external frag.", "free")
PART_COLORS = ("#2b6cb0", "#68d391", "#f6ad55", "#e53e3e", "#9f7aea", "#e2e8f0")
TIMELINE_PARTS = ("token_states", "cached", "reserved", "internal", "external", "free")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", ":")
# columns a series label may vary over (besides the x axis)
SERIES_KEYS = ("policy", "placement", "workload", "rate_req_s", "kv_tokens", "admission",
               "model", "gpu")
VS_PAGE_SIZE = {
    "internal_frag_pct": "internal fragmentation (% of KV)",
    "token_states_pct": "token-state share (% of KV)",
    "prefix_hit_rate": "prefix hit rate",
    "normalized_latency_s": "normalized latency (s / output token)",
    "throughput_tok_s": "throughput (tokens / s)",
}


def _varying(df: pd.DataFrame, keys, exclude: str) -> list[str]:
    return [k for k in keys if k in df.columns and k != exclude
            and df[k].astype(str).nunique() > 1]


def _label(row: pd.Series, keys: list[str]) -> str:
    if not keys:
        return str(row.get("policy", "run"))
    parts = []
    for k in keys:
        v = row[k]
        if isinstance(v, float) and math.isfinite(v):
            v = f"{v:g}"
        parts.append(str(v) if k == "policy" else f"{k}={v}")
    return ", ".join(parts)


def breakdown_figure(summary: pd.DataFrame, title: str = "KV memory breakdown") -> Figure:
    """Stacked bars of the six-way breakdown (percent of KV capacity), one bar per run;
    several seeds of one configuration are averaged."""
    keys = _varying(summary, ("policy", "page_size", *SERIES_KEYS[1:]), exclude="")
    keys = list(dict.fromkeys(["policy", *keys])) if "policy" in summary.columns else keys
    g = summary.groupby(keys, sort=False)[list(PART_COLUMNS)].mean().reset_index()
    labels = [_label(r, keys) if len(keys) > 1 else str(r[keys[0]]) for _, r in g.iterrows()]
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


def vs_page_size_figure(summary: pd.DataFrame, metric: str) -> Figure:
    """`metric` against page size (log2 axis), one line per policy (and per other varying
    option); seeds averaged."""
    keys = _varying(summary, SERIES_KEYS, exclude="page_size") or (
        ["policy"] if "policy" in summary.columns else [])
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    groups = summary.groupby(keys, sort=False) if keys else [((), summary)]
    for i, (_key, g) in enumerate(groups):
        s = g.groupby("page_size")[metric].mean().sort_index()
        row = g.iloc[0]
        ax.plot(s.index, s.values, marker=MARKERS[i % len(MARKERS)],
                linestyle=LINESTYLES[i // len(MARKERS) % len(LINESTYLES)] if i else "-",
                label=_label(row, keys), alpha=0.85)
    ax.set_xscale("log", base=2)
    ticks = sorted(summary["page_size"].unique())
    ax.set_xticks(ticks, [str(int(t)) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("page size (tokens)")
    ax.set_ylabel(VS_PAGE_SIZE.get(metric, metric))
    ax.set_title(f"{VS_PAGE_SIZE.get(metric, metric)} vs page size")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
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
                           slo_tpot: float | None = None) -> Figure:
    """Normalized latency against request rate, one line per policy; the highest rate that
    meets the TTFT / TPOT targets (p99) is marked on each line."""
    keys = _varying(summary, ("policy", "page_size", "placement", "workload", "kv_tokens"),
                    exclude="rate_req_s") or ["policy"]
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    for _, g in summary.groupby(keys, sort=False):
        s = g.groupby("rate_req_s")["normalized_latency_s"].mean().sort_index()
        line, = ax.plot(s.index, s.values, marker="o", label=_label(g.iloc[0], keys))
        best = max_rate_meeting(g, slo_ttft, slo_tpot)
        if best is not None:
            ax.axvline(best, color=line.get_color(), linestyle="--", alpha=0.6)
            ax.plot([best], [s.loc[best]], marker="*", markersize=14, color=line.get_color())
    target = ", ".join(t for t in (f"TTFT p99 <= {slo_ttft:g} s" if slo_ttft else "",
                                   f"TPOT p99 <= {slo_tpot:g} s" if slo_tpot else "") if t)
    ax.set_xlabel("request rate (req / s)")
    ax.set_ylabel("normalized latency (s / output token)")
    ax.set_title("latency vs rate" + (f" (star: max rate with {target})" if target else ""),
                 fontsize=9 if target else None)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
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


def cdf_figure(requests: pd.DataFrame, label_of: dict[str, str]) -> Figure:
    """TTFT and TPOT CDFs of completed requests, one line per run."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), layout="constrained")
    done = requests[requests["status"] == "completed"]
    groups = done.groupby("config_hash", sort=False) if "config_hash" in done.columns else [
        ("run", done)]
    for h, g in groups:
        for ax, col in zip(axes, ("ttft_s", "tpot_s"), strict=True):
            v = np.sort(g[col].dropna().to_numpy(dtype=float))
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label_of.get(h, str(h)))
    for ax, name in zip(axes, ("TTFT (s)", "TPOT (s)"), strict=True):
        ax.set_xlabel(name)
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name.split()[0]} CDF")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def host_tier_figure(summary: pd.DataFrame) -> Figure:
    """Hit rate (total and its device / host / storage parts) and TTFT p50 against the host
    tier's size (x the device pool), one panel each, with the trace's ideal reuse as a line:
    how much host memory a hit rate needs, and what the loads cost in time to first token."""
    s = summary.groupby("hicache_ratio").mean(numeric_only=True).sort_index()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    x = s.index.to_numpy()
    for col, label, marker in (("prefix_hit_rate", "total", "o"),
                               ("device_hit_rate", "device", "s"),
                               ("host_hit_rate", "host", "^"),
                               ("storage_hit_rate", "storage", "D")):
        if col in s.columns and (col == "prefix_hit_rate" or s[col].any()):
            ax.plot(x, s[col].to_numpy(), marker=marker, label=label, alpha=0.85)
    if "ideal_reuse" in s.columns and s["ideal_reuse"].notna().any():
        ax.axhline(float(s["ideal_reuse"].max()), color="k", linestyle="--", linewidth=1,
                   label="ideal reuse (trace)")
    ax.set_xlabel("host tier (x device pool)")
    ax.set_ylabel("prefix hit rate")
    ax.set_title("hit rate vs host-tier size")
    ax.legend(fontsize=8)
    bx.plot(x, s["ttft_p50_s"].to_numpy(), marker="o", label="TTFT p50")
    if "ttft_p99_s" in s.columns:
        bx.plot(x, s["ttft_p99_s"].to_numpy(), marker="s", linestyle="--", label="TTFT p99")
    bx.set_xlabel("host tier (x device pool)")
    bx.set_ylabel("seconds")
    bx.set_title("TTFT vs host-tier size")
    bx.legend(fontsize=8)
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
                 slo_ttft: float | None = None, slo_tpot: float | None = None) -> list[Path]:
    """Every figure the data supports, into `out`; returns the paths written."""
    out = Path(out)
    written: list[Path] = []
    if summary.empty:
        return written
    _save(breakdown_figure(summary), out / "breakdown.png", written)
    if "page_size" in summary.columns and summary["page_size"].nunique() > 1:
        for metric in VS_PAGE_SIZE:
            if metric in summary.columns:
                _save(vs_page_size_figure(summary, metric), out / f"{metric}_vs_page_size.png",
                      written)
    if "hicache_ratio" in summary.columns and summary["hicache_ratio"].nunique() > 1:
        _save(host_tier_figure(summary), out / "hit_rate_ttft_vs_host_tier.png", written)
    if "rate_req_s" in summary.columns and summary["rate_req_s"].nunique() > 1:
        _save(latency_vs_rate_figure(summary, slo_ttft, slo_tpot),
              out / "latency_vs_rate.png", written)
    keys = _varying(summary, ("policy", "page_size", *SERIES_KEYS[1:]), exclude="") or [
        "policy"]
    label_of = {str(r["config_hash"]): _label(r, keys) for _, r in summary.iterrows()
                if "config_hash" in summary.columns}
    if requests is not None and len(requests):
        _save(cdf_figure(requests, label_of), out / "latency_cdf.png", written)
    if timeline is not None and len(timeline):
        if "config_hash" in timeline.columns:
            first = str(timeline["config_hash"].iloc[0])
            tl = timeline[timeline["config_hash"].astype(str) == first]
            title = f"KV memory over time ({label_of.get(first, first)})"
        else:
            tl, title = timeline, "KV memory over time"
        _save(timeline_figure(tl, title), out / "memory_timeline.png", written)
    return written


def plot_dir(results: str | Path, out: str | Path | None = None, **kw) -> list[Path]:
    """Figures from a results directory (summary.csv, and the parquet files when present)."""
    d = Path(results)
    summary = read_csv_or_empty(d / SUMMARY_FILE)
    if summary.empty:
        raise ValueError(f"DIR {str(d)!r} has no summary.csv with rows (expected the --out "
                         "directory of kvsim run / sweep / compare)")
    req = d / REQUESTS_FILE
    tl = d / TIMELINE_FILE
    return plot_results(summary, out or d / "figures",
                        requests=pd.read_parquet(req) if req.exists() else None,
                        timeline=pd.read_parquet(tl) if tl.exists() else None, **kw)
