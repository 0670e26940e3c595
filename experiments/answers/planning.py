"""The `kvsim plan` experiment: the static memory plan of a run's options and, for a workload,
a page-size study (the same options simulated at each page size, as a resumable sweep).

The recommendation itself is read from the study's rows by experiments.answers.recommend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.options.grid import cells
from experiments.options.run_options import RunOptions
from kvcore.model.planner import PlanResult, plan

if TYPE_CHECKING:
    import pandas as pd


def static_plan(opts: RunOptions, context_len: int | None = None,
                with_workload: bool = False) -> PlanResult:
    """The planner's figures for the options' memory, page size and batch limit;
    `context_len` (default: the maximum context) sizes the page-table figure. With
    `with_workload` (plan --trace / --workload) the per-page-size rounding and page-table
    entries are taken over the workload's own final lengths (prompt + output of every request)
    rather than the single maximum context, which rounds to 0.0 at every page size. A hybrid's
    engine figures follow `--enable-prefix-caching` and `--mamba-cache-mode` as a `vllm` run
    of the same options does (kvcore.model.vllm_rules)."""
    lengths = None
    if with_workload:
        from workloads import build_workload

        reqs = build_workload(opts.workload_spec()).nominal_requests()
        lengths = [r.prompt_len + r.output_len for r in reqs] or None
    return plan(opts.memory, page_size=opts.policy.page_size,
                max_running_requests=opts.engine.max_running_requests, context_len=context_len,
                lengths=lengths, prefix_caching=opts.policy.enable_prefix_caching,
                mamba_cache_mode=opts.policy.mamba_cache_mode)


def page_size_grid(opts: RunOptions, sizes: Sequence[int],
                   seeds: Sequence[int] | None = None) -> list[RunOptions]:
    """The options at each page size (and at each of `seeds`, else at --seed: two or more
    measure the recommendation's noise band, experiments/answers/recommend.py), every one
    validated."""
    axes: dict[str, list[int]] = {"page_size": list(sizes)}
    if seeds is not None:
        axes["seed"] = list(seeds)
    return cells(opts, axes)


def page_size_study(opts: RunOptions, sizes: Sequence[int], *, jobs: int = 0,
                    progress: bool = True, seeds: Sequence[int] | None = None
                    ) -> tuple[Path, pd.DataFrame]:
    """Simulate the options at each page size into --out (default kvsim-plan); returns the
    directory and the study's rows (a resumed directory may hold other rows too). With one
    job the progress bar moves per simulated request, over every page size."""
    from experiments.answers.runner import (
        config_document,
        pending_cells,
        run_cell,
        run_sweep,
        sweep_jobs,
    )
    from experiments.execution.executors import LocalExecutor
    from experiments.execution.progress import RequestBar
    from experiments.execution.shared import SharedWorkloads
    from reports.io import check_writable
    from reports.results import write_config
    from reports.schema import SUMMARY_FILE

    out = Path(opts.output.out or "kvsim-plan")
    grid = page_size_grid(opts, sizes, seeds)
    for c in grid:  # every user mistake before the first simulation
        c.sim_config()
    check_writable(out)
    write_config(out, config_document("plan", opts, axes={"page_size": list(sizes)}))
    todo, _ = pending_cells(grid, out / SUMMARY_FILE)
    shared = SharedWorkloads()  # the workload, built once for every page size
    try:
        jobs = sweep_jobs(jobs, todo, shared)  # AUTO (0): as many as the cores, if worth it
        if jobs > 1:  # cells in worker processes: the bar moves per cell
            df = run_sweep(grid, out, jobs=jobs, progress=progress, shared=shared)
        else:  # cells in this process: one bar over every page size's requests
            bar = RequestBar(len(todo), enabled=progress, desc="plan")
            try:
                df = run_sweep(grid, out, progress=False, shared=shared,
                               executor=LocalExecutor(lambda cell: run_cell(cell, bar)))
            finally:
                bar.close()
    finally:
        shared.close()
    hashes = {c.config_hash() for c in grid}
    return out, df[df["config_hash"].astype(str).isin(hashes)]


__all__ = ["page_size_grid", "page_size_study", "static_plan"]
