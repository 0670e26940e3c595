"""Sweep scaling: the same 8-point page-size sweep with --jobs 1 and --jobs 2, timed as whole
processes, alternating A B A B so that machine drift hits both; prints the speed-up.

    python benchmarks/bench_sweep.py [--repeat 2] [--num-requests 4000]   # 0: whole trace
    python benchmarks/bench_sweep.py --ceiling   # this machine's limit for two processes

The ceiling is what two CPU-bound pure-Python processes gain from running side by side on
this machine (shared cores, hyperthreads and thermal limits make it less than 2x); a sweep's
speed-up cannot exceed it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _sweep(jobs: int, n: int) -> float:
    out = tempfile.mkdtemp(prefix="kvsim-bench-sweep-")
    cmd = [sys.executable, "-m", "cli", "sweep", "--workload", "azure-conv",
           "--page-sizes", "1,2,4,8,16,32,64,128", "--jobs", str(jobs), "--out", out]
    if n:  # 0: the whole trace (19,366 requests)
        cmd += ["--num-requests", str(n)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return dt


def _spin(_: int) -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(30_000_000):
        x += i
    return time.perf_counter() - t0


def _cell(n: int) -> float:
    """Seconds to simulate one sweep cell (page 16, the first n Azure requests)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from simulator.config import SimConfig
    from simulator.run import simulate
    from workloads.registry import build_workload
    from workloads.spec import WorkloadSpec

    wl = build_workload(WorkloadSpec(name="azure-conv", num_requests=n or None))
    t0 = time.perf_counter()
    simulate(wl, SimConfig.of(page_size=16))
    return time.perf_counter() - t0


def ceiling(n: int) -> None:
    """Two kinds of work, each alone and then two copies side by side: a pure-Python loop,
    and one sweep cell (which also contends for caches and memory bandwidth)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    print("| work | alone (s) | two side by side (s each) | ceiling |")
    print("|---|---|---|---|")
    for name, fn, arg in (("pure-Python loop", _spin, 0), ("sweep cell", _cell, n)):
        with ctx.Pool(1) as pool:
            alone = pool.map(fn, [arg])[0]
        with ctx.Pool(2) as pool:
            both = pool.map(fn, [arg, arg])
        print(f"| {name} | {alone:.2f} | {both[0]:.2f}, {both[1]:.2f} | "
              f"{2 * alone / max(both):.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--num-requests", type=int, default=4000,
                    help="requests per cell (0: the whole Azure trace)")
    ap.add_argument("--ceiling", action="store_true", help="measure the machine's ceiling")
    args = ap.parse_args()
    if args.ceiling:
        ceiling(args.num_requests)
        return
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
