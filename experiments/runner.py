"""Running experiments: one simulation from `RunOptions` as a summary row, and a sweep.

`run_cell(cell_dict) -> row` is a plain top-level function of plain data, so any executor
(local processes or Dask, experiments/executors.py) can ship it to a worker; the sweep hands
it to the executor. A sweep is resumable: a cell runs only when no row with its config hash is
in the output summary.csv yet, and each finished cell rewrites summary.csv atomically.

The heavy imports (the simulator, pandas) happen inside the functions: the sweep command
imports this module before it starts its worker processes, and they should start at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kvcore
from experiments.options import RunOptions
from experiments.progress import RequestBar
from reports.schema import METRICS, SUMMARY_FILE
from simulator.config import FLAT_FIELDS

if TYPE_CHECKING:
    import pandas as pd

    from experiments.executors import Executor
    from simulator.run import SimResult
    from workloads.request import Workload

# what a worker process should import before its first cell (the fork server's preload)
CELL_PRELOAD = ("simulator.run", "workloads.registry", "reports.io")
_SIM_KEYS = FLAT_FIELDS  # the engine's echo of its config


def _rate(opts: RunOptions, workload: Workload) -> float:
    """The arrival rate simulated: a replayed trace's count over its span (what `--rate`
    rescaled it to, or what its own timestamps give), else the rate the arrivals were drawn
    at."""
    if opts.workload.rate is not None and workload.meta.get("arrival") != "trace":
        return float(opts.workload.rate)
    meta_rate = workload.meta.get("rate") if hasattr(workload, "meta") else None
    if meta_rate and workload.meta.get("arrival") != "trace":
        return float(meta_rate)
    reqs = workload.nominal_requests()
    if len(reqs) < 2:
        return math.nan
    times = [r.arrival_s for r in reqs]
    span = max(times) - min(times)
    return len(reqs) / span if span > 0 else math.nan


def summary_row(opts: RunOptions, summary: Mapping[str, Any], workload: Workload
                ) -> dict[str, Any]:
    """config_hash, every resolved option, rate_req_s, then the metrics (and the engine's
    other counters; the engine's echo of its own configuration is left out)."""
    row: dict[str, Any] = {"config_hash": opts.config_hash()}
    row.update(opts.resolved())
    trace = opts.workload.trace
    row["workload"] = workload.name if trace is None else trace
    row["rate_req_s"] = _rate(opts, workload)
    row["capacity_slots"] = summary.get("capacity_slots")
    if opts.tier.enabled:  # the line a host-tier sweep is drawn against (docs/tiers.md)
        from workloads.reuse import ideal_reuse

        row["ideal_reuse"] = ideal_reuse(workload, opts.policy.page_size)
    for k in METRICS:
        row[k] = summary.get(k, math.nan)
    for k, v in summary.items():
        if k not in row and k not in _SIM_KEYS:
            row[k] = v
    return row


def simulate_options(opts: RunOptions, *, progress: bool | RequestBar = False,
                     event_sink: Callable[..., None] | None = None
                     ) -> tuple[dict[str, Any], SimResult]:
    """Build the workload and the engine config from `opts` and simulate; (row, result).
    `progress`: True for a bar of this run, or a RequestBar shared by several runs."""
    from experiments.slo import slo_columns
    from simulator.run import simulate
    from workloads import build_workload
    from workloads.registry import check_options_used

    cfg = opts.sim_config()
    spec = opts.workload_spec()
    workload = build_workload(spec)
    check_options_used(spec, workload)
    tick = progress.start_run(workload.num_requests) if isinstance(progress, RequestBar) \
        else progress
    result = simulate(workload, cfg, progress=tick, event_sink=event_sink)
    row = summary_row(opts, result.summary, workload)
    out = opts.output
    row.update(slo_columns(result.requests, out.slo_ttft, out.slo_tpot, out.slo_percentile))
    return row, result


def run_cell(cell: Mapping[str, Any], progress: RequestBar | None = None) -> dict[str, Any]:
    """One sweep cell (a dict of option values) -> its summary row (`progress`: a bar in this
    process, for a sweep that runs here)."""
    row, _ = simulate_options(RunOptions.from_mapping(cell), progress=progress or False)
    return row


def config_document(command: str, opts: RunOptions, **extra: Any) -> dict[str, Any]:
    """config.json: the options (feed back with --config config.json) and what they resolve
    to."""
    return {"command": command, "kvsim_version": kvcore.__version__,
            "options": opts.to_dict(), "resolved": opts.resolved(),
            "config_hash": opts.config_hash(), **extra}


def pending_cells(cells: Iterable[RunOptions], summary_csv: str | Path
                  ) -> tuple[list[RunOptions], int]:
    """Cells without a row in `summary_csv` (duplicates in the grid run once); and the number
    skipped because a row with their hash is already there."""
    import pandas as pd

    from reports.io import read_csv_or_empty

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


def local_executor() -> Executor:
    """The default executor: this process and local workers, running `run_cell`."""
    from experiments.executors import LocalExecutor

    return LocalExecutor(run_cell, CELL_PRELOAD)


def run_sweep(cells: list[RunOptions], out: str | Path, *, jobs: int = 1,
              progress: bool = True,
              on_row: Callable[[dict[str, Any]], None] | None = None,
              announce: Callable[[int, int], None] | None = None,
              executor: Executor | None = None) -> pd.DataFrame:
    """Run the cells not yet in out/summary.csv on `executor` (default: local processes);
    append each row as its cell finishes. A cell an executor ran twice (a lost worker's task
    re-run) is written once: rows are de-duplicated by config hash."""
    from tqdm import tqdm

    from reports.io import append_rows_atomic, read_csv_or_empty

    summary = Path(out) / SUMMARY_FILE
    todo, skipped = pending_cells(cells, summary)
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
        (executor or local_executor()).run_cells([c.to_dict() for c in todo], jobs, record)
    finally:
        bar.close()
    return read_csv_or_empty(summary)


__all__ = ["CELL_PRELOAD", "config_document", "local_executor", "pending_cells", "run_cell",
           "run_sweep", "simulate_options", "summary_row"]
