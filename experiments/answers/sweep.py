"""`kvsim sweep`: the grid of the options and their axes' lists, run into a results directory.

Every cell is built and checked (a model that does not fit, a page size the attention backend
cannot run, ...) before the first one runs; the sweep is resumable (experiments/answers/runner.py
`run_sweep`: cells whose config hash is already in DIR/summary.csv are skipped).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.options.grid import cells, page_sizes_for, sweep_axes
from experiments.options.run_options import RunOptions

if TYPE_CHECKING:
    import pandas as pd


def run_grid(opts: RunOptions, lists: Mapping[str, str | None], *, jobs: int | None,
             executor: str,
             scheduler_address: str | None, progress: bool,
             say: Callable[[str], None]) -> tuple[Path, pd.DataFrame]:
    """Run the cross product of `lists` (axis -> comma list, None: the option's value) over
    `opts` into --out (default kvsim-sweep); `say` hears the page-size notes and the count of
    cells to run. Returns the directory and its summary rows."""
    from experiments.answers.runner import CELL_PRELOAD, config_document, run_cell, run_sweep
    from experiments.execution.executors import check_jobs, make_executor
    from reports.io import check_writable
    from reports.results import write_config

    out = Path(opts.output.out or "kvsim-sweep")
    jobs = check_jobs(jobs)  # no --jobs: AUTO, decided by run_sweep once the workload is built
    check_writable(out)
    runner = make_executor(executor, run_cell, scheduler_address, preload=CELL_PRELOAD)
    if jobs > 1:
        runner.warm_up(jobs)  # local workers start importing now, while this process sets up
    page_sizes, notes = page_sizes_for(opts, lists.get("page_size"))
    for note in notes:
        say(note)
    axes = sweep_axes({**lists, "page_size": page_sizes})
    grid = cells(opts, axes)
    for c in grid:  # every user mistake (a model that does not fit...) before the first cell
        c.sim_config()
    write_config(out, config_document("sweep", opts, axes=axes))
    df = run_sweep(grid, out, jobs=jobs, progress=progress, executor=runner,
                   announce=lambda todo, done: say(
                       f"{len(grid)} cell(s): {todo} to run, {done} already in "
                       f"{out}/summary.csv"))
    return out, df


__all__ = ["run_grid"]
