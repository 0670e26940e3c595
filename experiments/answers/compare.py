"""`kvsim compare`: several policies on one set of options, and what it writes.

The runs are simulated in this process, one progress bar over every policy's requests; the
results directory gets the runs (summary.csv, requests.parquet, timeline.parquet,
config.json), the deltas against the baseline policy (deltas.csv, with two or more policies)
and the figures. The command prints the tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.options.grid import cells, parse_list
from experiments.options.run_options import RunOptions

# compare's default: every policy family, the caching ones first
COMPARED = "paged,paged-nocache,vllm,contiguous-max,contiguous-pow2,contiguous-oracle"


@dataclass(frozen=True)
class Compared:
    """The policies compared (in the order given), the baseline's index, each run's summary
    row and result, and the results directory."""

    names: list[str]
    base: int
    rows: list[dict[str, Any]]
    results: list[Any] = field(repr=False)
    out: Path


def compare_policies(opts: RunOptions, policies: str | None, baseline: str | None,
                     progress: bool) -> Compared:
    """Simulate `opts` under each policy of the comma list `policies`; every user mistake
    (an unknown policy or baseline, an option a policy refuses) before the first run."""
    from experiments.answers.runner import simulate_options
    from experiments.execution.progress import RequestBar
    from reports.deltas import baseline_index
    from reports.io import check_writable

    names = parse_list(policies, str, "--policies") or []
    base = baseline_index(names, baseline)
    runs = cells(opts, {"policy": names})
    for r in runs:
        r.sim_config()
    out = Path(opts.output.out or "kvsim-compare")
    check_writable(out)
    rows, results = [], []
    bar = RequestBar(len(runs), enabled=progress, desc="compare")
    try:
        for r in runs:
            row, res = simulate_options(r, progress=bar)
            rows.append(row)
            results.append(res)
    finally:
        bar.close()
    return Compared(names, base, rows, results, out)


def write_deltas(c: Compared) -> None:
    """out/deltas.csv: each policy's metrics against the baseline (two or more policies)."""
    import pandas as pd

    from reports.deltas import delta_records
    from reports.io import write_csv_atomic

    if len(c.rows) >= 2:
        write_csv_atomic(c.out / "deltas.csv",
                         pd.DataFrame(delta_records(c.rows, c.names, c.base)))


def write_compare(opts: RunOptions, c: Compared) -> list[Path]:
    """The runs and their figures into the results directory; the figures' paths."""
    import pandas as pd

    from experiments.answers.runner import config_document
    from reports.fleet_view import fleet_figures, write_fleet_results
    from reports.plots import plot_results
    from reports.results import write_run

    axes = {"policy": c.names}
    write_run(c.out, c.rows, c.results, config_document("compare", opts, axes=axes))
    write_fleet_results(c.out, c.rows, c.results)  # fleet runs only
    return plot_results(pd.DataFrame(c.rows), c.out / "figures",
                        requests=pd.read_parquet(c.out / "requests.parquet"),
                        timeline=pd.read_parquet(c.out / "timeline.parquet"), axes=axes) \
        + fleet_figures(c.out, c.out / "figures", pd.DataFrame(c.rows))


__all__ = ["COMPARED", "Compared", "compare_policies", "write_compare", "write_deltas"]
