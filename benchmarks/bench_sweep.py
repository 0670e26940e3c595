"""Sweep scaling: the same 8-point page-size sweep with --jobs 1 and --jobs 2, timed as whole
processes, alternating A B A B so that machine drift hits both; prints the speed-up.

    python benchmarks/bench_sweep.py [--repeat 2] [--num-requests 4000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def _sweep(jobs: int, n: int) -> float:
    out = tempfile.mkdtemp(prefix="kvsim-bench-sweep-")
    cmd = [sys.executable, "-m", "cli", "sweep", "--workload", "azure-conv", "--num-requests",
           str(n), "--page-sizes", "1,2,4,8,16,32,64,128", "--jobs", str(jobs), "--out", out]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--num-requests", type=int, default=4000)
    args = ap.parse_args()
    one, two = [], []
    for _ in range(args.repeat):
        one.append(_sweep(1, args.num_requests))
        two.append(_sweep(2, args.num_requests))
    ratios = [a / b for a, b in zip(one, two, strict=True)]
    print("| jobs 1 (s) | jobs 2 (s) | speed-up (median of pairs) |")
    print("|---|---|---|")
    print(f"| {statistics.median(one):.1f} | {statistics.median(two):.1f} | "
          f"{statistics.median(ratios):.2f}x |")


if __name__ == "__main__":
    main()
