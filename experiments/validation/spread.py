"""The seed spread behind the paper rows' bands: `python -m experiments.validation.spread`.

Each paper row's band (rows.Tolerance) allows Z_SEEDS standard deviations of seed noise on the
difference between kvsim's run and the paper's. This measures that deviation: the Fig. 2,
Fig. 13 and Fig. 15 rows rerun at their full scale with workload (and beam model) seeds 0..N-1,
Fig. 2 at the rate the full run chose (no rate search, so every seed measures the same
setting). It prints, per row, the mean, the sample standard deviation (in the row's units, and
in % of the mean for the relative bands) and the range; the seed_sd constants in
vllm_paper.py and sharing.py quote these figures. About 1 minute of CPU per seed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import pandas as pd

from experiments.validation.sharing import fig15_rows
from experiments.validation.vllm_paper import fig2_rows, fig13_rows

FIG2_RATE = 2.5  # the rate the full run's search chooses (docs/validation.md, "Fig. 2 rate")


def _numbers(rows: list[dict]) -> dict[str, float]:
    """kvsim's value per row name; a range row ("12.0-26.6") as its two ends."""
    out: dict[str, float] = {}
    for r in rows:
        v = r["kvsim"]
        if isinstance(v, str) and "-" in v:
            lo, hi = v.split("-")
            out[f"{r['name']} (low end)"] = float(lo)
            out[f"{r['name']} (high end)"] = float(hi)
        elif isinstance(v, (int, float)):
            out[r["name"]] = float(v)
    return out


def _one_seed(seed: int) -> dict[str, float]:
    """kvsim's value per paper row at one seed (a top-level function: a worker runs it)."""
    quiet = lambda _m: None  # noqa: E731
    return _numbers(fig2_rows(False, {}, quiet, seed=seed, rates=(FIG2_RATE,))
                    + fig13_rows(False, {}, quiet, seed=seed)
                    + fig15_rows(False, {}, quiet, seed=seed))


def seed_values(seeds: range, jobs: int = 1, progress: bool = True) -> pd.DataFrame:
    """One column per seed, one row per paper row: kvsim's value at that seed (`jobs`
    processes, one seed each at a time; the values do not depend on it)."""
    t0 = time.perf_counter()
    cols: dict[int, dict[str, float]] = {}

    def done(seed: int, values: dict[str, float]) -> None:
        cols[seed] = values
        if progress:
            print(f"[{time.perf_counter() - t0:6.1f} s] seed {seed}", file=sys.stderr, flush=True)

    if jobs <= 1:
        for seed in seeds:
            done(seed, _one_seed(seed))
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            for seed, values in zip(seeds, pool.map(_one_seed, seeds), strict=True):
                done(seed, values)
    return pd.DataFrame({seed: cols[seed] for seed in seeds})


def spread(values: pd.DataFrame) -> pd.DataFrame:
    """Per row: mean, sample sd (absolute and in % of the mean), min and max over seeds."""
    out = []
    for name, row in values.iterrows():
        xs = [float(x) for x in row.tolist()]
        mean = statistics.fmean(xs)
        sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
        out.append({"row": name, "mean": mean, "sd": sd,
                    "sd_pct_of_mean": sd / abs(mean) * 100 if mean else float("nan"),
                    "min": min(xs), "max": max(xs)})
    return pd.DataFrame(out).set_index("row")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.validation.spread",
                                 description="seed spread of the simulated paper rows")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    args = ap.parse_args(argv)
    if args.seeds < 2:
        ap.error(f"--seeds {args.seeds}: need at least 2 for a standard deviation")
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: need at least 1")
    values = seed_values(range(args.seeds), jobs=args.jobs)
    with pd.option_context("display.width", 200, "display.max_rows", None):
        print(values.round(3).to_string())
    table = spread(values)
    with pd.option_context("display.width", 200, "display.max_rows", None):
        print(table.round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
