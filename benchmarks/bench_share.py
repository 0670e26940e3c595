"""The real allocator's share of an end-to-end run: whole-process wall time of
`bench_e2e.py --policy paged` against the counting-only stand-in (`--policy counting`), run in
alternation (A B A B ...) so that both see the same machine load, and the ratio of medians.

    python benchmarks/bench_share.py [--repeats 3] [--num-requests N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _run(policy: str, extra: list[str]) -> tuple[float, float]:
    """(whole-process seconds, simulate seconds as the script prints it)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "bench_e2e.py", "--policy", policy, *extra],
                         cwd=HERE, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    row = out.strip().splitlines()[-1].split("|")
    return wall, float(row[6])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=None)
    args = ap.parse_args()
    extra = [] if args.num_requests is None else ["--num-requests", str(args.num_requests)]
    runs: dict[str, list[tuple[float, float]]] = {"paged": [], "counting": []}
    for _ in range(args.repeats):
        for policy in runs:
            runs[policy].append(_run(policy, extra))
    med = {p: (statistics.median(w for w, _ in r), statistics.median(s for _, s in r))
           for p, r in runs.items()}
    print("| policy | whole process, median (s) | simulate, median (s) | runs (whole, s) |")
    print("|---|---|---|---|")
    for p, r in runs.items():
        print(f"| {p} | {med[p][0]:.1f} | {med[p][1]:.1f} | "
              f"{', '.join(f'{w:.1f}' for w, _ in r)} |")
    print(f"| ratio paged / counting | **{med['paged'][0] / med['counting'][0]:.2f}x** | "
          f"{med['paged'][1] / med['counting'][1]:.2f}x | |")


if __name__ == "__main__":
    main()
