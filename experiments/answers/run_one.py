"""`kvsim run`: one simulation, its schedule as a Perfetto trace (`--events`) and its results
directory (`--out`); the command prints the tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.options.run_options import RunOptions


@dataclass(frozen=True)
class RunOutcome:
    """The run's summary row and result, and what was written (None: not asked for)."""

    row: dict[str, Any]
    result: Any = field(repr=False)
    events: Path | None = None
    figures: int | None = None  # figures drawn into --out


def check_events_path(events: Path | None) -> None:
    if events is not None and (not str(events).strip() or events.is_dir()):
        raise ValueError(f"--events {str(events)!r}: give a file name (not a directory)")


def simulate_one(opts: RunOptions, *, events: Path | None = None,
                 progress: bool = False) -> RunOutcome:
    """Simulate `opts` (every path checked before), the events trace written when asked."""
    from experiments.answers.runner import simulate_options
    from reports.events import EventCollector
    from reports.io import check_writable
    from reports.schema import REQUESTS_FILE

    check_events_path(events)
    if opts.output.out:
        check_writable(opts.output.out)
    sink = EventCollector() if events is not None else None
    out = opts.output.out  # rows streamed there as requests finish (a day in bounded memory)
    row, result = simulate_options(opts, progress=progress, event_sink=sink,
                                   requests_file=Path(out) / REQUESTS_FILE if out else None)
    if sink is not None:
        sink.write(events, result.timeline, result.requests)
    return RunOutcome(row, result, events)


def write_one(opts: RunOptions, run: RunOutcome) -> int:
    """The run into --out (summary.csv, requests.parquet, timeline.parquet, config.json) and
    its figures; how many figures."""
    from experiments.answers.runner import config_document
    from reports.fleet_view import write_fleet_results
    from reports.plots import plot_dir
    from reports.results import write_run

    out = opts.output.out
    if not out:
        raise ValueError("write_one: no --out to write the run into")
    write_run(out, [run.row], [run.result], config_document("run", opts))
    write_fleet_results(out, [run.row], [run.result])  # a fleet's replicas (none: no file)
    return len(plot_dir(Path(out)))


__all__ = ["RunOutcome", "check_events_path", "simulate_one", "write_one"]
