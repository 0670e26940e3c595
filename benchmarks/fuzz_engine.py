"""The engine's full differential fuzz: thousands of small random workloads, each simulated
stepped and fast-forwarded with invariants checked every iteration (tests/simulator/
engine_fuzz.py has the generator and the checks). Prints the outcome counts, the wall time
and every failing case; exits 1 if any case failed.

    python benchmarks/fuzz_engine.py [--cases 5040] [--start 0] [--jobs 2]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.simulator.engine_fuzz import COMBOS, describe, run_case


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=len(COMBOS) * 70)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per case")
    args = ap.parse_args()
    from tqdm import tqdm

    seeds = range(args.start, args.start + args.cases)
    counts: collections.Counter[str] = collections.Counter()
    failures = []
    requests = 0
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = pool.map(run_case, seeds, [args.time_limit] * len(seeds), chunksize=8)
        for o in tqdm(outcomes, total=len(seeds), unit="case", desc="fuzz"):
            counts[o.kind] += 1
            requests += o.requests
            if not o.ok:
                failures.append(o)
    wall = time.perf_counter() - t0
    print(f"{len(seeds)} cases (seeds {seeds.start}..{seeds.stop - 1}, {requests} requests, "
          f"each run stepped and fast-forwarded = {2 * len(seeds)} simulations) in {wall:.0f} s")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for o in failures:
        print(f"  {describe(o.seed)}: {o.kind}: {o.detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
