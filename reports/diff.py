"""`kvsim diff RUN_A RUN_B`: two saved results directories side by side.

The question is "what changed between these two runs or sweeps?" (another pool size, the
vllm policy instead of paged, a new kvsim version). Rows are paired by the axes the runs were
swept over (config.json's `axes`: the policies of a compare, the page sizes of a plan or
sweep), never by derived columns such as the resolved pool size, which may legitimately
differ between A and B; two single runs pair with each other. For every pair the metrics of
reports.deltas are shown A, B and B - A; the long table is saved as diff.csv, and figures
overlay B (dashed) on A (solid): metric vs page size for page-size sweeps, grouped bars
otherwise, and the TTFT CDFs when both directories kept their requests.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from reports.deltas import DELTA_METRICS, delta_records, delta_table
from reports.io import check_writable, read_csv_or_empty, save_figure_atomic, write_csv_atomic
from reports.schema import CONFIG_FILE, REQUESTS_FILE, SUMMARY_FILE

FIGURE_METRICS = ("normalized_latency_s", "ttft_p99_s", "throughput_tok_s", "prefix_hit_rate",
                  "token_states_pct", "internal_frag_pct")
# columns that identify a run when config.json does not say which axes were swept
FALLBACK_KEYS = ("policy", "page_size", "placement", "eviction", "admission", "schedule",
                 "rate", "rate_scale", "seed", "workload")


@dataclass(frozen=True)
class Side:
    """One results directory: its name, summary rows, config document and requests."""

    label: str
    path: Path
    summary: pd.DataFrame
    config: dict[str, Any]
    requests: pd.DataFrame | None


def load_side(path: Path, label: str, arg: str) -> Side:
    """A results directory, or a one-line error naming the argument."""
    if not path.is_dir():
        raise ValueError(f"{arg} {str(path)!r} is not a directory (give the --out directory of "
                         "kvsim run / sweep / compare / plan)")
    summary = read_csv_or_empty(path / SUMMARY_FILE)
    if summary.empty:
        raise ValueError(f"{arg} {str(path)!r} has no summary.csv with rows")
    cfg_path = path / CONFIG_FILE
    config = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    req = path / REQUESTS_FILE
    return Side(label, path, summary, config, pd.read_parquet(req) if req.exists() else None)


def pair_keys(a: Side, b: Side) -> list[str]:
    """The columns pairing A's rows with B's: the swept axes of either (config.json), else
    the identifying columns that vary inside either directory."""
    axes = [*(a.config.get("axes") or {}), *(b.config.get("axes") or {})]
    if axes:
        keys = [k for k in dict.fromkeys(axes)
                if k in a.summary.columns and k in b.summary.columns]
    else:
        keys = [k for k in FALLBACK_KEYS if k in a.summary.columns and k in b.summary.columns]
    return [k for k in keys if a.summary[k].astype(str).nunique() > 1
            or b.summary[k].astype(str).nunique() > 1]


def option_changes(a: Side, b: Side) -> list[str]:
    """The options set differently in A and B (from config.json), as 'name: A -> B'."""
    oa, ob = a.config.get("options") or {}, b.config.get("options") or {}
    return [f"{k}: {oa.get(k)!r} -> {ob.get(k)!r}" for k in sorted(set(oa) | set(ob))
            if oa.get(k) != ob.get(k) and k != "out"]


def paired(a: Side, b: Side, keys: list[str]) -> pd.DataFrame:
    """One row per pair: the keys, then every A column suffixed _a and B column _b."""
    if not keys:
        return pd.concat([a.summary.iloc[[0]].add_suffix("_a").reset_index(drop=True),
                          b.summary.iloc[[0]].add_suffix("_b").reset_index(drop=True)], axis=1)
    left = a.summary.assign(**{f"_k_{k}": a.summary[k].astype(str) for k in keys})
    right = b.summary.assign(**{f"_k_{k}": b.summary[k].astype(str) for k in keys})
    on = [f"_k_{k}" for k in keys]
    left = left.drop_duplicates(on).add_suffix("_a").rename(columns={f"{c}_a": c for c in on})
    right = right.drop_duplicates(on).add_suffix("_b").rename(columns={f"{c}_b": c for c in on})
    merged = left.merge(right, on=on, how="inner")
    if merged.empty:
        seen = "; ".join(f"{k}: {sorted(set(a.summary[k].astype(str)))} vs "
                         f"{sorted(set(b.summary[k].astype(str)))}" for k in keys)
        raise ValueError(f"RUN_A and RUN_B share no run to compare ({seen})")
    merged = merged.drop(columns=on)
    return pd.concat([merged[[f"{k}_a" for k in keys]].set_axis(keys, axis=1), merged], axis=1)


def pair_label(row: pd.Series, keys: list[str]) -> str:
    parts = []
    for k in keys:
        v = row[k]
        v = f"{v:g}" if isinstance(v, float) and math.isfinite(v) else v
        parts.append(str(v) if k == "policy" else f"{k}={v}")
    return ", ".join(parts) or "run"


def side_rows(pairs: pd.DataFrame, suffix: str) -> list[dict[str, Any]]:
    """The pairs' rows of one side, with the suffix dropped."""
    cols = [c for c in pairs.columns if c.endswith(suffix)]
    return [{c[: -len(suffix)]: r[c] for c in cols} for _, r in pairs.iterrows()]


def diff_records(pairs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """diff.csv: per pair and metric, A, B, B - A, in % of A, and better/worse."""
    out = []
    for (_, pr), ra, rb in zip(pairs.iterrows(), side_rows(pairs, "_a"), side_rows(pairs, "_b"),
                               strict=True):
        for rec in delta_records([ra, rb], ["A", "B"], 0):
            if rec["label"] != "B":
                continue
            out.append({**{k: pr[k] for k in keys}, "metric": rec["metric"],
                        "a": rec["baseline"], "b": rec["value"], "delta": rec["delta"],
                        "delta_pct": rec["delta_pct"], "verdict": rec["verdict"]})
    return pd.DataFrame(out)


def _vs_page_size(pairs: pd.DataFrame, keys: list[str], a: Side, b: Side, metric: str):
    fig, ax = plt.subplots(figsize=(6.4, 4), layout="constrained")
    others = [k for k in keys if k != "page_size"]
    groups = pairs.groupby(others, sort=True) if others else [("", pairs)]
    for i, (name, g) in enumerate(groups):
        g = g.sort_values("page_size", key=lambda s: s.astype(float))
        x = g["page_size"].astype(float).to_numpy()
        color = f"C{i % 10}"
        tag = ", ".join(map(str, name)) if isinstance(name, tuple) else str(name)
        tag = f"{tag} " if tag else ""
        ax.plot(x, g[f"{metric}_a"].astype(float), "-o", color=color, label=f"{tag}{a.label}")
        ax.plot(x, g[f"{metric}_b"].astype(float), "--s", color=color, label=f"{tag}{b.label}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("page size (tokens)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: {a.label} (solid) vs {b.label} (dashed)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def _bars(pairs: pd.DataFrame, keys: list[str], a: Side, b: Side):
    metrics = [m for m in FIGURE_METRICS if f"{m}_a" in pairs.columns]
    fig, axes = plt.subplots(2, 3, figsize=(11, 6), layout="constrained")
    labels = [pair_label(r, keys) for _, r in pairs.iterrows()]
    x = np.arange(len(labels))
    for ax, m in zip(axes.flat, metrics, strict=False):
        ax.bar(x - 0.2, pairs[f"{m}_a"].astype(float), 0.4, label=a.label)
        ax.bar(x + 0.2, pairs[f"{m}_b"].astype(float), 0.4, label=b.label, hatch="//")
        ax.set_title(m, fontsize=9)
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.remove()
    # one legend for the figure, above the panels: inside a panel it covered a bar
    fig.legend(*axes.flat[0].get_legend_handles_labels(), loc="outside upper right",
               ncols=2, fontsize=8)
    fig.suptitle(f"{a.label} vs {b.label}")
    return fig


def _cdfs(pairs: pd.DataFrame, keys: list[str], a: Side, b: Side):
    fig, ax = plt.subplots(figsize=(6.4, 4), layout="constrained")
    for i, (_, pr) in enumerate(pairs.iterrows()):
        for side, style in ((a, "-"), (b, "--")):
            req = side.requests
            h = str(pr[f"config_hash_{'a' if side is a else 'b'}"])
            if req is None or "config_hash" not in req.columns:
                continue
            done = req[(req["config_hash"].astype(str) == h) & (req["status"] == "completed")]
            v = np.sort(done["ttft_s"].dropna().to_numpy(dtype=float))
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), style, color=f"C{i % 10}",
                        label=f"{pair_label(pr, keys)} {side.label}")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT CDF: {a.label} (solid) vs {b.label} (dashed)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def diff_figures(pairs: pd.DataFrame, keys: list[str], a: Side, b: Side,
                 out: Path) -> list[Path]:
    """The overlaid figures, saved atomically as PNG into `out`."""
    written: list[Path] = []

    def save(fig, name: str) -> None:
        written.append(save_figure_atomic(out / name, fig, dpi=110))
        plt.close(fig)

    if "page_size" in keys and pairs["page_size"].astype(str).nunique() > 1:
        for m in FIGURE_METRICS:
            if f"{m}_a" in pairs.columns:
                save(_vs_page_size(pairs, keys, a, b, m), f"diff_{m}_vs_page_size.png")
    else:
        save(_bars(pairs, keys, a, b), "diff_metrics.png")
    if a.requests is not None and b.requests is not None and len(pairs) <= 10:
        save(_cdfs(pairs, keys, a, b), "diff_latency_cdf.png")
    return written


def write_diff(a: Side, b: Side, out: Path) -> tuple[pd.DataFrame, list[str], list[Path]]:
    """Pair the rows, write diff.csv and the figures into `out`; (pairs, keys, figures)."""
    keys = pair_keys(a, b)
    pairs = paired(a, b, keys)
    write_csv_atomic(out / "diff.csv", diff_records(pairs, keys))
    return pairs, keys, diff_figures(pairs, keys, a, b, out)


def diff_view(run_a: Path, run_b: Path, out: Path, label_a: str | None = None,
              label_b: str | None = None) -> tuple[list[Any], list[dict[str, Any]]]:
    """`kvsim diff`: write diff.csv and the figures into `out`; returns what to print, in order
    (lines and one delta table per pair), and the paired rows (for the overload warning)."""
    la = label_a or run_a.resolve().name
    lb = label_b or run_b.resolve().name
    if la == lb:
        la, lb = f"A:{la}", f"B:{lb}"
    check_writable(out, "--out")  # one line, not an OSError halfway through the figures
    a = load_side(run_a, la, "RUN_A")
    b = load_side(run_b, lb, "RUN_B")
    pairs, keys, figs = write_diff(a, b, out)
    changes = option_changes(a, b)
    items: list[Any] = [f"{la} -> {lb}: " + ("; ".join(changes) if changes else "same options")]
    for (_, pr), ra, rb in zip(pairs.iterrows(), side_rows(pairs, "_a"),
                               side_rows(pairs, "_b"), strict=True):
        items.append(delta_table([ra, rb], [la, lb], 0, title=pair_label(pr, keys)))
    unpaired = len(a.summary) + len(b.summary) - 2 * len(pairs)
    if unpaired > 0:
        items.append(f"{unpaired} row(s) without a partner left out")
    items.append(f"diff: {out}/diff.csv; figures: {', '.join(p.name for p in figs)}")
    return items, [*side_rows(pairs, "_a"), *side_rows(pairs, "_b")]


__all__ = ["DELTA_METRICS", "Side", "diff_figures", "diff_records", "diff_view", "load_side",
           "option_changes", "pair_keys", "pair_label", "paired", "side_rows", "write_diff"]
