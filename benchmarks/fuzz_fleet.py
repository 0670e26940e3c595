"""The fleet's full differential fuzz: small random fleets (tests/simulator/fleet_fuzz.py:
the engine fuzz's cases on 2-4 replicas behind a random router, a KV event delay, sometimes
the benchmark client's --max-concurrency), each simulated stepped and fast-forwarded with
invariants checked every iteration and the router's view compared at every decision. Prints
the outcome counts by router, the cases without a decode stretch, the wall time and every
failing case; exits 1 if any case failed.

    python benchmarks/fuzz_fleet.py [--cases 700] [--start 0] [--jobs 2]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.simulator.fleet_fuzz import fleet_case, run_fleet_case


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=700)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    from tqdm import tqdm

    seeds = range(args.start, args.start + args.cases)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    failures, no_stretch = [], []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = pool.map(run_fleet_case, seeds, [args.time_limit] * len(seeds), chunksize=4)
        for o in tqdm(outcomes, total=len(seeds), unit="case", desc="fleet fuzz"):
            counts[(fleet_case(o.seed).setup.router, o.kind)] += 1
            if not o.ok:
                failures.append(o)
            elif not o.stretches:
                no_stretch.append(o.seed)
    wall = time.perf_counter() - t0
    print(f"{len(seeds)} cases (seeds {seeds.start}..{seeds.stop - 1}) in {wall:.0f} s")
    for (router, kind), n in sorted(counts.items()):
        print(f"  {router:16s} {kind:9s} {n}")
    print(f"ok cases without a decode stretch: {len(no_stretch)}")
    for o in failures:
        print(f"FAIL seed {o.seed}: {o.kind}: {o.detail} | {fleet_case(o.seed).describe()}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
