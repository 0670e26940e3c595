"""A fleet's results shown: its files (replicas.csv, replica_timeline.parquet), the terminal
table of its replicas and its lines, its figures and its report section.

* `replicas.csv`: one row per replica of every fleet run (simulator/fleet/summary.py
  `REPLICA_COLUMNS`), tagged with the run's config hash, router and replica count;
* `replica_timeline.parquet`: each replica's timeline (the single run's columns and
  `replica`), tagged the same way;
* figures: `replica_load.png` (each replica's requests and KV held over time),
  `router_hit_ttft.png` (prefix hit rate and TTFT p90 per router) and `router_vs_rate.png`
  (throughput and TTFT p90 against the request rate, one line per router).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from rich.table import Table

from reports.interactive import fmt_number
from reports.io import save_figure_atomic, write_csv_atomic, write_parquet_atomic
from reports.offscale import draw_line
from reports.series import overloaded_mask

__all__ = ["CAPTIONS", "REPLICAS_FILE", "REPLICA_TIMELINE_FILE", "fleet_figures",
           "fleet_lines", "replica_table", "report_section", "write_fleet_results"]

REPLICAS_FILE = "replicas.csv"
REPLICA_TIMELINE_FILE = "replica_timeline.parquet"
CAPTIONS = {
    "replica_load.png": "Each replica's requests (running and waiting) and KV held by "
                        "requests over simulated time.",
    "router_hit_ttft.png": "Prefix hit rate and TTFT p90 per router.",
    "router_vs_rate.png": "Throughput and TTFT p90 against the request rate, per router.",
}
#: a replica taking more than this share above an even split is a hot spot worth a line
HOT_SHARE = 1.5


def _tag(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"config_hash": row["config_hash"], "router": row.get("router"),
            "replicas": row.get("replicas")}


def write_fleet_results(out: str | Path, rows: Sequence[Mapping[str, Any]],
                        results: Sequence[Any]) -> list[Path]:
    """replicas.csv and replica_timeline.parquet of the fleet runs among `results`
    (nothing for single runs)."""
    reps, tls = [], []
    for row, res in zip(rows, results, strict=True):
        fleet = res.extra.get("fleet")
        if fleet is None:
            continue
        tag = _tag(row)
        reps += [{**tag, **r} for r in fleet.replica_rows]
        columns = list(res.timeline.columns)
        for i, tl in enumerate(fleet.replica_timelines):
            if tl:
                tls.append(pd.DataFrame(tl, columns=columns).assign(replica=i, **tag))
    if not reps:
        return []
    out = Path(out)
    paths = [write_csv_atomic(out / REPLICAS_FILE, pd.DataFrame(reps))]
    if tls:
        paths.append(write_parquet_atomic(out / REPLICA_TIMELINE_FILE,
                                          pd.concat(tls, ignore_index=True)))
    return paths


def replica_table(row: Mapping[str, Any], replicas: Sequence[Mapping[str, Any]]) -> Table:
    """The terminal table of a fleet run: one line per replica (every column of a replica's
    row is in replicas.csv)."""
    t = Table(title=f"Replicas ({row.get('router')}, {len(replicas)} replicas)")
    cols = [("replica", "#"), ("requests_routed", "routed"),
            ("prefix_hit_rate", "hit rate"), ("ttft_p90_s", "TTFT p90"),
            ("tpot_p90_s", "TPOT p90"), ("token_states_pct", "KV %"),
            ("queue_backlog", "queued"), ("preemptions", "preempt."),
            ("overloaded", "overl.")]
    for _, head in cols:
        t.add_column(head, justify="right")
    for r in replicas:
        t.add_row(*[fmt_number(r.get(c)) for c, _ in cols])
    return t


def fleet_lines(row: Mapping[str, Any]) -> list[str]:
    """The fleet's figures in a few lines, and a warning when one replica is a hot spot."""
    n = int(row.get("replicas") or 1)
    lines = [f"fleet: {n} replicas, router {row.get('router')}: load imbalance "
             f"{fmt_number(row.get('load_imbalance'))} (max / mean requests), KV imbalance "
             f"{fmt_number(row.get('kv_imbalance'))}; TTFT p90 "
             f"{fmt_number(row.get('ttft_p90_s'))} s"]
    match, load = row.get("router_match_pct"), row.get("router_load_pct")
    if isinstance(match, (int, float)) and not math.isnan(match):
        lines.append(f"router: {match:.1f} % sent to its best prefix match, {load:.1f} % by "
                     f"load; {fmt_number(row.get('router_us_per_request'))} us per decision")
    fill = row.get("fill_pct")
    if isinstance(fill, (int, float)) and not math.isnan(fill):
        lines.append(f"working set {fmt_number(row.get('working_set_tokens'))} tokens = "
                     f"{fill:.1f} % of the cluster's KV (fill)")
    shared = row.get("shared_tier_hit_rate")
    if isinstance(shared, (int, float)) and not math.isnan(shared):
        lines.append(f"shared tier: {shared:.1%} of prompt tokens read from it; read "
                     f"{fmt_number(row.get('shared_tier_read_bytes', 0) / 2**30)} GiB, "
                     f"written {fmt_number(row.get('shared_tier_write_bytes', 0) / 2**30)} "
                     f"GiB; {fmt_number(row.get('shared_tier_used_pct'))} % full")
    share = row.get("hot_replica_share")
    if isinstance(share, (int, float)) and not math.isnan(share) and n > 1 and (
            share * n > HOT_SHARE or row.get("hot_replica_overloaded")):
        over = " and is overloaded" if row.get("hot_replica_overloaded") else ""
        lines.append(f"warning: replica {row.get('hot_replica')} takes {share:.0%} of the "
                     f"requests ({share * n:.1f}x an even share){over}: affinity hot-spots it")
    return lines


def _figure_rows(summary: pd.DataFrame) -> pd.DataFrame:
    if "router" not in summary.columns:
        return summary.iloc[0:0]
    return summary[summary["router"].notna()]


def _series(df: pd.DataFrame) -> list[str]:
    keys = ["router"]
    for k in ("replicas", "policy", "page_size"):
        if k in df.columns and df[k].nunique() > 1:
            keys.append(k)
    return keys


def _name(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    return " ".join(f"{row[k]}" if k == "router" else f"{k}={row[k]}" for k in keys)


def fleet_figures(results: str | Path, out: str | Path,
                  summary: pd.DataFrame) -> list[Path]:
    """The fleet figures the results directory supports."""
    d, out = Path(results), Path(out)
    written: list[Path] = []
    tl_path = d / REPLICA_TIMELINE_FILE
    if tl_path.exists():
        tl = pd.read_parquet(tl_path)
        first = tl["config_hash"].iloc[0]
        written.append(_save(_replica_load(tl[tl["config_hash"] == first]),
                             out / "replica_load.png"))
    rows = _figure_rows(summary)
    if len(rows):
        written.append(_save(_hit_ttft(rows), out / "router_hit_ttft.png"))
        if "rate_req_s" in rows.columns and rows["rate_req_s"].nunique() > 1:
            written.append(_save(_vs_rate(rows), out / "router_vs_rate.png"))
    return written


def _save(fig, path: Path) -> Path:
    save_figure_atomic(path, fig, dpi=110)
    plt.close(fig)
    return path


def _replica_load(tl: pd.DataFrame):
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True,
                                      layout="constrained")
    parts = ["token_states", "cached", "reserved", "internal", "external", "free"]
    for i, g in tl.groupby("replica"):
        t = g["time_s"].to_numpy(dtype=float)
        cap = g[parts].sum(axis=1).to_numpy(dtype=float)
        held = (g["token_states"] + g["reserved"] + g["internal"]).to_numpy(dtype=float)
        top.step(t, (g["running"] + g["waiting"]).to_numpy(), where="post", lw=0.9,
                 label=f"replica {i}")
        bottom.step(t, 100.0 * held / cap, where="post", lw=0.9)
    top.set_ylabel("requests (running + waiting)")
    bottom.set_ylabel("KV held by requests (% of pool)")
    bottom.set_xlabel("simulated time (s)")
    top.set_title("load and KV use per replica")
    if tl["replica"].nunique() <= 12:
        top.legend(fontsize=7, ncol=2)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    return fig


def _hit_ttft(rows: pd.DataFrame):
    keys = _series(rows)
    g = rows.groupby(keys, sort=False)[["prefix_hit_rate", "ttft_p90_s"]].mean()
    names = [_name(dict(zip(keys, k if isinstance(k, tuple) else (k,), strict=True)), keys)
             for k in g.index]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, max(2.5, 0.35 * len(g) + 1)),
                                      layout="constrained")
    y = range(len(g))
    left.barh(y, g["prefix_hit_rate"].to_numpy(), color="#4c72b0")
    right.barh(y, g["ttft_p90_s"].to_numpy(), color="#dd8452")
    left.set_yticks(list(y), names, fontsize=8)
    right.set_yticks(list(y), [""] * len(g))
    left.set_xlim(0, max(1.05 * float(g["prefix_hit_rate"].max()), 0.05))
    left.set_xlabel("prefix hit rate")
    right.set_xlabel("TTFT p90 (s)")
    if (g["ttft_p90_s"] > 0).all() and g["ttft_p90_s"].max() / g["ttft_p90_s"].min() > 100:
        right.set_xscale("log")
    left.invert_yaxis()
    right.invert_yaxis()
    fig.suptitle("per router" + (" (mean over its runs)" if len(rows) > len(g) else ""))
    return fig


def _vs_rate(rows: pd.DataFrame):
    keys = _series(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for k, g in rows.groupby(keys, sort=False):
        g = g.sort_values("rate_req_s")
        over = overloaded_mask(g).to_numpy()
        name = _name(dict(zip(keys, k if isinstance(k, tuple) else (k,), strict=True)), keys)
        draw_line(left, g["rate_req_s"], g["throughput_tok_s"], over, name=name)
        draw_line(right, g["rate_req_s"], g["ttft_p90_s"], over, name=name)
    left.set_ylabel("throughput (tokens / s)")
    right.set_ylabel("TTFT p90 (s)")
    if (rows["ttft_p90_s"] > 0).all() and rows["ttft_p90_s"].max() / \
            rows["ttft_p90_s"].min() > 100:
        right.set_yscale("log")
    for ax in (left, right):
        ax.set_xlabel("request rate (req / s)")
        ax.grid(True, alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle("throughput and TTFT vs rate per router (hollow: overloaded)")
    return fig


REPORT_COLUMNS = (("router", "router"), ("replicas", "replicas"),
                  ("prefix_hit_rate", "hit rate"), ("ttft_p90_s", "TTFT p90 (s)"),
                  ("throughput_tok_s", "tok/s"), ("load_imbalance", "load max/mean"),
                  ("router_match_pct", "to best match %"), ("router_load_pct", "by load %"),
                  ("fill_pct", "fill %"), ("hot_replica_share", "hot replica share"))


def report_section(results: str | Path, summary: pd.DataFrame
                   ) -> tuple[list[str], list[list[str]], list[str]]:
    """The report's fleet table (one row per fleet run), and the hot-spot warnings."""
    rows = _figure_rows(summary)
    if not len(rows):
        return [], [], []
    cols = [head for c, head in REPORT_COLUMNS if c in rows.columns]
    table = [[fmt_number(r[c]) for c, _ in REPORT_COLUMNS if c in rows.columns]
             for _, r in rows.iterrows()]
    warnings = [line for _, r in rows.iterrows() for line in fleet_lines(r.to_dict())
                if line.startswith("warning")]
    return cols, table, warnings
