"""One simulation or one sweep cell from `RunOptions`, as a summary row; saving results.

`run_cell(cell_dict) -> row` is a plain top-level function of plain data so any executor
(local processes or Dask, reports/executors.py) can ship it to a worker. A sweep is
resumable: a cell runs only when no row with its config hash is in the output summary.csv
yet, and each finished cell rewrites summary.csv atomically.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import pandas as pd

import kvcore
from reports.executors import Executor, LocalExecutor
from reports.io import (
    append_rows_atomic,
    atomic_write_text,
    read_csv_or_empty,
    write_csv_atomic,
    write_parquet_atomic,
)
from simulator.config import SimConfig
from simulator.options import RunOptions

SUMMARY_FILE = "summary.csv"
REQUESTS_FILE = "requests.parquet"
TIMELINE_FILE = "timeline.parquet"
CONFIG_FILE = "config.json"

# the metric columns, in the order summary.csv shows them (then any others simulate adds)
METRICS: tuple[str, ...] = (
    "requests_completed", "requests_rejected", "token_states_pct", "cached_pct",
    "reserved_pct", "internal_frag_pct", "internal_overreserve_pct", "internal_rounding_pct",
    "external_frag_pct", "free_pct", "frag_index", "failed_allocs", "peak_token_states_pct",
    "prefix_hit_rate", "missed_reuse_pct", "queue_backlog", "avg_batch_size", "preemptions",
    "throughput_tok_s", "normalized_latency_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
    "tpot_p99_s", "page_table_bytes", "block_table_entries", "sim_wall_s",
)  # fmt: skip
PARTS_PCT: tuple[str, ...] = ("token_states_pct", "cached_pct", "reserved_pct",
                              "internal_frag_pct", "external_frag_pct", "free_pct")
_SIM_KEYS = {f.name for f in fields(SimConfig)}


def _rate(opts: RunOptions, workload) -> float:
    if opts.rate is not None:
        return float(opts.rate)
    meta_rate = workload.meta.get("rate") if hasattr(workload, "meta") else None
    if meta_rate:
        return float(meta_rate)
    reqs = workload.nominal_requests()
    if len(reqs) < 2:
        return math.nan
    times = [r.arrival_s for r in reqs]
    span = max(times) - min(times)
    return len(reqs) / span if span > 0 else math.nan


def summary_row(opts: RunOptions, summary: Mapping[str, Any], workload) -> dict[str, Any]:
    """config_hash, every resolved option, rate_req_s, then the metrics."""
    row: dict[str, Any] = {"config_hash": opts.config_hash()}
    row.update(opts.resolved())
    row["workload"] = workload.name if opts.trace is None else opts.trace
    row["rate_req_s"] = _rate(opts, workload)
    row["capacity_slots"] = summary.get("capacity_slots")
    for k in METRICS:
        row[k] = summary.get(k, math.nan)
    for k, v in summary.items():
        if k not in row and k not in _SIM_KEYS:
            row[k] = v
    return row


def simulate_options(opts: RunOptions, *, progress: bool = False,
                     event_sink: Callable[..., None] | None = None):
    """Build the workload and the engine config from `opts` and simulate; (row, result)."""
    from simulator.run import simulate
    from workloads import build_workload

    opts.validate()
    cfg = opts.to_sim_config()
    workload = build_workload(opts.to_workload_spec())
    result = simulate(workload, cfg, progress=progress, event_sink=event_sink)
    return summary_row(opts, result.summary, workload), result


def run_cell(cell: Mapping[str, Any]) -> dict[str, Any]:
    """One sweep cell (a dict of option values) -> its summary row."""
    row, _ = simulate_options(RunOptions.from_mapping(cell))
    return row


def config_document(command: str, opts: RunOptions, **extra: Any) -> dict[str, Any]:
    """config.json: the options (feed back with --config config.json) and what they resolve to."""
    return {"command": command, "kvsim_version": kvcore.__version__,
            "options": opts.to_dict(), "resolved": opts.resolved(),
            "config_hash": opts.config_hash(), **extra}


def write_config(out: str | Path, doc: Mapping[str, Any]) -> Path:
    return atomic_write_text(Path(out) / CONFIG_FILE,
                             json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")


def write_run(out: str | Path, rows: list[dict[str, Any]], results: list[Any],
              command: str, opts: RunOptions, **extra: Any) -> None:
    """summary.csv (one row per run), requests.parquet / timeline.parquet (tagged with the
    run's config_hash and policy) and config.json, each written atomically."""
    out = Path(out)
    req_parts, tl_parts = [], []
    for row, res in zip(rows, results, strict=True):
        tag = {"config_hash": row["config_hash"], "policy": row["policy"],
               "page_size": row["page_size"]}
        req_parts.append(res.requests.assign(**tag))
        tl_parts.append(res.timeline.assign(**tag))
    write_parquet_atomic(out / REQUESTS_FILE, _safe_concat(req_parts))
    write_parquet_atomic(out / TIMELINE_FILE, _safe_concat(tl_parts))
    write_csv_atomic(out / SUMMARY_FILE, pd.DataFrame(rows))
    write_config(out, config_document(command, opts, **extra))


def _safe_concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    for col in df.columns:  # object columns of mixed None / str / int break parquet
        if df[col].dtype == object:
            df[col] = df[col].map(lambda v: None if v is None else str(v))
    return df


def pending_cells(cells: Iterable[RunOptions], summary_csv: str | Path
                  ) -> tuple[list[RunOptions], int]:
    """Cells without a row in `summary_csv` (duplicates in the grid run once); and the number
    skipped because a row with their hash is already there."""
    done = set(read_csv_or_empty(summary_csv).get("config_hash", pd.Series(dtype=str))
               .astype(str))
    todo, seen, skipped = [], set(), 0
    for c in cells:
        h = c.config_hash()
        if h in done:
            skipped += 1
        elif h not in seen:
            seen.add(h)
            todo.append(c)
    return todo, skipped


def run_sweep(cells: list[RunOptions], out: str | Path, *, jobs: int = 1,
              progress: bool = True,
              on_row: Callable[[dict[str, Any]], None] | None = None,
              announce: Callable[[int, int], None] | None = None,
              executor: Executor | None = None) -> pd.DataFrame:
    """Run the cells not yet in out/summary.csv on `executor` (default: local processes);
    append each row as its cell finishes. A cell an executor ran twice (a lost worker's task
    re-run) is written once: rows are de-duplicated by config hash."""
    summary = Path(out) / SUMMARY_FILE
    todo, skipped = pending_cells(cells, summary)
    from tqdm import tqdm

    if announce is not None:
        announce(len(todo), skipped)
    bar = tqdm(total=len(todo), unit="cell", desc="sweep", disable=not progress)

    written: set[str] = set()

    def record(row: dict[str, Any]) -> None:
        if str(row["config_hash"]) in written:
            return
        written.add(str(row["config_hash"]))
        append_rows_atomic(summary, [row])
        bar.update(1)
        if on_row is not None:
            on_row(row)

    try:
        (executor or LocalExecutor()).run_cells([c.to_dict() for c in todo], jobs, record)
    finally:
        bar.close()
    return read_csv_or_empty(summary)
