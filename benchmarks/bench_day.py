"""A day of traffic: peak RSS and wall time of one long `kvsim run`, and the wall time of a
9-page-size `kvsim sweep` over a day of generated traffic with the default --jobs.

Each measurement is a whole process (`python -m cli ...`, as a user runs it), timed from
start to exit; peak RSS is the process's own maximum resident set (`wait4`'s ru_maxrss), and
for a sweep also the largest of its workers (RUSAGE_CHILDREN after it exits). The workload is
ShareGPT-like requests with diurnal arrivals (`--arrival diurnal`, docs/workloads.md).

    python benchmarks/bench_day.py run --num-requests 1000000      # the issue's run
    python benchmarks/bench_day.py run --num-requests 100000,250000  # two sizes: the slope
    python benchmarks/bench_day.py sweep --rate 10                 # 864,000 requests x 9

`run` with several sizes also prints the per-request slope of wall time and peak RSS (a
least-squares line through the points) and what it predicts for 1,000,000 requests.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DAY_S = 86400
COMMON = ["--workload", "sharegpt", "--arrival", "diurnal", "--no-progress"]


def measure(args: list[str]) -> tuple[float, float, float]:
    """(wall s, peak RSS MiB of the process, peak RSS MiB of any process it waited for)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=REPO, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"kvsim {' '.join(args)} failed:\n{err[-2000:]}")
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return wall, usage.ru_maxrss / 1024, children


def run_sizes(sizes: list[int], rate: float, ratio: float) -> None:
    points = []
    print(f"{'requests':>10} {'wall s':>9} {'peak RSS MiB':>13} {'rows on disk':>13}")
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="kvsim-day-") as out:
            wall, rss, _ = measure(["run", *COMMON, "--rate", str(rate), "--peak-to-trough",
                                    str(ratio), "--num-requests", str(n), "--out", out])
            import pyarrow.parquet as pq

            rows = pq.ParquetFile(Path(out) / "requests.parquet").metadata.num_rows
        points.append((n, wall, rss))
        print(f"{n:>10,} {wall:>9.1f} {rss:>13.0f} {rows:>13,}", flush=True)
    if len(points) >= 2:
        n, wall, rss = (np.array(c, dtype=float) for c in zip(*points, strict=True))
        sw, iw = np.polyfit(n, wall, 1)
        sr, ir = np.polyfit(n, rss, 1)
        print(f"slope: {sw * 1e3:.3f} ms and {sr * 1024 * 1024:.0f} bytes of peak RSS per "
              f"request; at 1,000,000 requests: {iw + sw * 1e6:.0f} s, "
              f"{ir + sr * 1e6:.0f} MiB")


def sweep(rate: float, ratio: float, hours: float, jobs: int | None) -> None:
    with tempfile.TemporaryDirectory(prefix="kvsim-day-sweep-") as out:
        args = ["sweep", *COMMON, "--rate", str(rate), "--peak-to-trough", str(ratio),
                "--duration", str(hours * 3600), "--page-sizes", "1..256", "--no-plot",
                "--out", out]
        if jobs is not None:
            args += ["--jobs", str(jobs)]
        wall, rss, worst = measure(args)
        import pandas as pd

        df = pd.read_csv(Path(out) / "summary.csv")
    print(f"9-page-size sweep, {hours:g} h at a mean {rate:g} req/s "
          f"({int(df.requests_total.iloc[0]):,} requests per cell, {len(df)} cells), "
          f"--jobs {'default' if jobs is None else jobs} on {len(os.sched_getaffinity(0))} "
          f"cores: {wall:.1f} s wall; peak RSS {rss:.0f} MiB (this process), "
          f"{worst:.0f} MiB (largest process)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("--num-requests", default="1000000", help="one size or a comma list")
    r.add_argument("--rate", type=float, default=10.0)
    r.add_argument("--peak-to-trough", type=float, default=3.0)
    s = sub.add_parser("sweep")
    s.add_argument("--rate", type=float, default=10.0)
    s.add_argument("--peak-to-trough", type=float, default=3.0)
    s.add_argument("--hours", type=float, default=24.0)
    s.add_argument("--jobs", type=int, default=None, help="default: kvsim's own (0)")
    a = ap.parse_args()
    if a.what == "run":
        run_sizes([int(x) for x in a.num_requests.split(",")], a.rate, a.peak_to_trough)
    else:
        sweep(a.rate, a.peak_to_trough, a.hours, a.jobs)


if __name__ == "__main__":
    main()
