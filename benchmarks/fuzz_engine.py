"""The engine's full differential fuzz: thousands of small random workloads, each simulated
stepped and fast-forwarded with invariants checked every iteration (tests/simulator/
engine_fuzz.py has the generator and the checks). Prints the outcome counts, the cases that
never took a decode stretch (they compare one code path with itself), the prefill stretches
taken (reserving policies' chunked prefills, simulator/fastforward/) and by how many
cases, the wall time and every failing case; exits 1 if any case failed.

With `--reference`, the cases are instead the reference engine's (tests/simulator/
reference_cases.py: paged / paged-nocache / vllm, vllm admission, fcfs, recompute, constant
latency), each run through the engine and the plain reference engine and compared request by
request; prints cases, requests, preemptions, cache hits and the differences.

    python benchmarks/fuzz_engine.py [--cases 5040] [--start 0] [--jobs 2]
    python benchmarks/fuzz_engine.py --reference [--cases 1000] [--start 36]
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
from tests.simulator.reference_cases import compare_case, make_ref_case


def fuzz(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    seeds = range(args.start, args.start + (args.cases or len(COMBOS) * 70))
    counts: collections.Counter[str] = collections.Counter()
    failures, no_stretch = [], []
    requests = stretches = prefill = prefill_cases = 0
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = pool.map(run_case, seeds, [args.time_limit] * len(seeds), chunksize=8)
        for o in tqdm(outcomes, total=len(seeds), unit="case", desc="fuzz"):
            counts[o.kind] += 1
            requests += o.requests
            stretches += o.stretches
            prefill += o.prefill_stretches
            prefill_cases += o.prefill_stretches > 0
            if not o.ok:
                failures.append(o)
            elif not o.stretches:
                no_stretch.append(o.seed)
    wall = time.perf_counter() - t0
    print(f"{len(seeds)} cases (seeds {seeds.start}..{seeds.stop - 1}, {requests} requests, "
          f"each run stepped and fast-forwarded = {2 * len(seeds)} simulations) in {wall:.0f} s")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"decode stretches taken: {stretches}; ok cases without one: {len(no_stretch)}"
          + (f" (seeds {', '.join(map(str, no_stretch[:40]))}"
             f"{', ...' if len(no_stretch) > 40 else ''})" if no_stretch else ""))
    print(f"prefill stretches taken: {prefill}, in {prefill_cases} cases")
    for o in failures:
        print(f"  {describe(o.seed)}: {o.kind}: {o.detail}")
    return 1 if failures else 0


def reference(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    seeds = range(args.start, args.start + (args.cases or 1000))
    requests = preemptions = cached = 0
    bad = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for o in tqdm(pool.map(compare_case, seeds, chunksize=4), total=len(seeds),
                      unit="case", desc="reference"):
            requests += o.requests
            preemptions += o.preemptions
            cached += o.cached_tokens
            if o.differences:
                bad.append(o)
    wall = time.perf_counter() - t0
    print(f"{len(seeds)} cases (seeds {seeds.start}..{seeds.stop - 1}), {requests} requests, "
          f"{preemptions} preemptions, {cached} cached prompt tokens, in {wall:.0f} s")
    print(f"cases that differ: {len(bad)}; differing request columns: "
          f"{sum(len(o.differences) for o in bad)}")
    for o in bad:
        print(f"  {make_ref_case(o.seed).describe()}: {'; '.join(o.differences[:5])}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", action="store_true",
                    help="compare the engine with the plain reference engine instead")
    ap.add_argument("--cases", type=int, default=0,
                    help="cases to run (default 5,040; 1,000 with --reference)")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per case")
    args = ap.parse_args()
    return reference(args) if args.reference else fuzz(args)


if __name__ == "__main__":
    raise SystemExit(main())
