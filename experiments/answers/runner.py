"""Running experiments: one simulation from `RunOptions` as a summary row, and a sweep.

`run_cell(cell_dict) -> row` is a plain top-level function of plain data, so any executor
(local processes or Dask, experiments/execution/executors.py) can ship it to a worker; the sweep
hands it to the executor. A sweep is resumable: a cell runs only when no row with its config hash is
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
from experiments.execution.progress import RequestBar
from experiments.execution.shared import SharedWorkloads
from experiments.options.run_options import RunOptions
from reports.schema import METRICS, SUMMARY_FILE
from simulator.config import FLAT_FIELDS
from workloads.spec import unused_options

if TYPE_CHECKING:
    import pandas as pd

    from experiments.execution.executors import Executor
    from simulator.run import SimResult
    from simulator.run_summary import RunSummary
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


def summary_row(opts: RunOptions, summary: RunSummary, workload: Workload
                ) -> dict[str, Any]:
    """config_hash, every resolved option, rate_req_s, then the summary's columns
    (simulator/run_summary.py): reports/schema.py's METRICS first, then the others in the
    record's order (the engine's echo of its own configuration is left out)."""
    row: dict[str, Any] = {"config_hash": opts.config_hash()}
    row.update(opts.resolved())
    for k in unused_options(row):  # a column only for the arrivals or generator that read it
        del row[k]
    trace = opts.workload.trace
    row["workload"] = workload.name if trace is None else trace
    row["rate_req_s"] = _rate(opts, workload)
    # malformed trace rows --skip-bad-rows left out (0 without a trace): the commands say so
    row["trace_bad_rows"] = int(workload.meta.get("bad_rows") or 0)
    row["capacity_slots"] = summary.capacity_slots
    if opts.tier.enabled:  # the line a host-tier sweep is drawn against (docs/tiers.md)
        from workloads.reuse import ideal_reuse

        row["ideal_reuse"] = ideal_reuse(workload, opts.policy.page_size)
    columns = summary.columns()
    for k in METRICS:
        row[k] = columns.get(k, math.nan)
    for k, v in columns.items():
        if k not in row and k not in _SIM_KEYS:
            row[k] = v
    return row


def simulate_options(opts: RunOptions, *, progress: bool | RequestBar = False,
                     event_sink: Callable[..., None] | None = None,
                     requests_file: str | Path | None = None,
                     workload: Workload | None = None,
                     ) -> tuple[dict[str, Any], SimResult]:
    """Build the workload and the engine config from `opts` and simulate; (row, result).
    `progress`: True for a bar of this run, or a RequestBar shared by several runs.
    `requests_file`: stream the per-request rows there as the run goes (Parquet row groups,
    published atomically when the run ends; the run's tags as in requests.parquet), so a
    day-long run keeps only the summary's columns in memory. `workload`: the workload `opts`
    builds, already built (a sweep shares one between its cells,
    experiments/execution/shared.py)."""
    from experiments.answers.slo import slo_columns
    from simulator.run import simulate
    from workloads import build_workload
    from workloads.registry import check_options_used

    cfg = opts.sim_config()
    spec = opts.workload_spec()
    if workload is None:
        workload = build_workload(spec)
    check_options_used(spec, workload)
    if opts.engine.max_concurrency and workload.sessions and not len(workload.requests):
        # the benchmark clients' bound gates open-loop requests; sessions are not gated
        raise ValueError(f"--max-concurrency {opts.engine.max_concurrency} gates open-loop "
                         f"requests; --workload {workload.name} is closed-loop sessions only "
                         "(each holds one turn in flight); drop it (it would be a silent "
                         "no-op)")
    tick = progress.start_run(workload.num_requests) if isinstance(progress, RequestBar) \
        else progress
    if opts.fleet.replicas > 1:  # replicas behind a router (simulator/fleet/)
        from simulator.fleet import simulate_fleet

        result = simulate_fleet(workload, cfg, opts.fleet.setup(), progress=tick,
                                event_sink=event_sink)
    elif requests_file is None:
        result = simulate(workload, cfg, progress=tick, event_sink=event_sink)
    else:
        result = _simulate_streamed(opts, workload, cfg, Path(requests_file), tick,
                                    event_sink)
    row = summary_row(opts, result.summary, workload)
    fleet = result.extra.get("fleet")
    if fleet is not None:
        row.update(fleet.columns)
    out = opts.output
    row.update(slo_columns(result.columns, out.slo_ttft, out.slo_tpot, out.slo_percentile,
                           int(result.summary.requests_total)))
    return row, result


def _simulate_streamed(opts: RunOptions, workload: Workload, cfg: Any, path: Path,
                       tick: Any, event_sink: Callable[..., None] | None) -> SimResult:
    """simulate() with its rows streamed to `path` (nothing there if the run fails)."""
    from reports.io import ParquetStream
    from simulator.request_table import COLUMN_KINDS
    from simulator.run import simulate

    tags = {"config_hash": opts.config_hash(), "policy": opts.policy.policy,
            "page_size": int(opts.policy.page_size)}
    with ParquetStream(path, COLUMN_KINDS, tags) as stream:
        result = simulate(workload, cfg, progress=tick, request_sink=_trimming(stream.write),
                          event_sink=event_sink)
        stream.commit()
    result.load = lambda: _read_requests(path, tuple(tags))
    result.extra["requests_file"] = str(path)
    return result


def _trimming(write: Callable[[Any], None]) -> Callable[[Any], None]:
    """`write`, then the C heap's free memory handed back to the system (glibc's
    `malloc_trim`; nothing elsewhere). A long run frees a request's arrays as it finishes, and
    glibc keeps the freed heap pages mapped, so without the trim they count in the run's peak
    memory. Once per chunk of rows, so its cost is spread over thousands of requests. Changes
    no result."""
    trim = _malloc_trim()

    def sink(chunk: Any) -> None:
        write(chunk)
        if trim is not None:
            trim(0)

    return sink


def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None


def _read_requests(path: Path, tags: tuple[str, ...]) -> pd.DataFrame:
    import pandas as pd

    return pd.read_parquet(path).drop(columns=list(tags))


def run_cell(cell: Mapping[str, Any], progress: RequestBar | None = None) -> dict[str, Any]:
    """One sweep cell (a dict of option values, and perhaps the file of the workload the
    sweep built for it: experiments/execution/shared.py) -> its summary row (`progress`: a bar in
    this process, for a sweep that runs here)."""
    from experiments.execution.shared import SHARED_KEY, workload_for

    values = dict(cell)
    shared = values.pop(SHARED_KEY, None)
    opts = RunOptions.from_mapping(values)
    row, _ = simulate_options(opts, progress=progress or False,
                              workload=workload_for(opts.workload_spec(), shared))
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
    from experiments.execution.executors import LocalExecutor

    return LocalExecutor(run_cell, CELL_PRELOAD)


def sweep_jobs(jobs: int, cells: list[RunOptions], shared: SharedWorkloads | None = None,
               to_files: bool = True) -> int:
    """The processes a sweep of `cells` runs on: `jobs`, or with AUTO (0: no --jobs given)
    as many as the cores present unless the sweep is small (executors.auto_jobs). Builds the
    workloads the cells share first (`shared`, or a throwaway set), which also counts the
    requests to simulate (a cell whose workload is its own counts as the mean of the rest);
    with more than one process and `to_files`, writes them for the local workers."""
    from experiments.execution.executors import AUTO, auto_jobs

    own = shared or SharedWorkloads()
    try:
        counts = own.prepare(cells)
        if jobs == AUTO:
            known = [n for n in counts if n is not None]
            total = None if not known else round(sum(known) / len(known) * len(counts))
            jobs = auto_jobs(len(cells), total)
        if jobs > 1 and to_files:
            own.write_files()
        return jobs
    finally:
        if shared is None:
            own.close()


def run_sweep(cells: list[RunOptions], out: str | Path, *, jobs: int = 1,
              progress: bool = True,
              on_row: Callable[[dict[str, Any]], None] | None = None,
              announce: Callable[[int, int], None] | None = None,
              executor: Executor | None = None,
              shared: SharedWorkloads | None = None) -> pd.DataFrame:
    """Run the cells not yet in out/summary.csv on `executor` (default: local processes)
    with `jobs` processes (AUTO, 0: `sweep_jobs` decides); append each row as its cell
    finishes. A cell an executor ran twice (a lost worker's task re-run) is written once:
    rows are de-duplicated by config hash. A workload several cells use is built once
    (experiments/execution/shared.py; a caller's `shared`, which it then closes itself) and handed
    to local workers as one file."""

    from experiments.execution.executors import LocalExecutor

    summary = Path(out) / SUMMARY_FILE
    todo, skipped = pending_cells(cells, summary)
    if announce is not None:
        announce(len(todo), skipped)
    own = shared or SharedWorkloads()
    local = executor is None or isinstance(executor, LocalExecutor)
    try:
        jobs = sweep_jobs(jobs, todo, own, to_files=local)
        return _run_todo(todo, summary, jobs, progress, on_row, executor, own)
    finally:
        if shared is None:
            own.close()


def _run_todo(todo: list[RunOptions], summary: Path, jobs: int, progress: bool,
              on_row: Callable[[dict[str, Any]], None] | None, executor: Executor | None,
              shared: SharedWorkloads) -> pd.DataFrame:
    from tqdm import tqdm

    from reports.io import append_rows_atomic, read_csv_or_empty

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
        (executor or local_executor()).run_cells([shared.tag(c) for c in todo], jobs, record)
    finally:
        bar.close()
    return read_csv_or_empty(summary)


__all__ = ["CELL_PRELOAD", "config_document", "local_executor", "pending_cells", "run_cell",
           "run_sweep", "simulate_options", "summary_row", "sweep_jobs"]
