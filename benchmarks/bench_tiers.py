"""What a host KV tier costs in simulation time: the bundled Azure conversation trace with
`--policy paged` (or `vllm`), without a tier and with one (`--hicache-ratio`, write_through),
run in alternation (A B A B ...) in this process so that both see the same machine load; the
ratio of medians of `simulate` wall time. The target is at most 1.3x.

    python benchmarks/bench_tiers.py [--repeats 3] [--num-requests N] [--ratio R]
    python benchmarks/bench_tiers.py --policy vllm --page-size 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.options.run_options import RunOptions
from simulator.run import simulate
from workloads import build_workload


def _run(opts: RunOptions, workload) -> tuple[float, dict]:
    result = simulate(workload, opts.sim_config())
    return result.summary["sim_wall_s"], result.summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--ratio", type=float, default=4.0)
    ap.add_argument("--write-policy", default="write_through")
    ap.add_argument("--policy", default="paged", choices=("paged", "vllm"))
    ap.add_argument("--page-size", type=int, default=None)
    args = ap.parse_args()
    base: dict = {"workload": "azure-conv", "policy": args.policy}
    if args.page_size is not None:
        base["page_size"] = args.page_size
    if args.num_requests is not None:
        base["num_requests"] = args.num_requests
    variants = {
        "no tier": RunOptions.from_mapping(base),
        f"host tier x{args.ratio:g}": RunOptions.from_mapping(
            {**base, "hicache_ratio": args.ratio, "hicache_write_policy": args.write_policy}),
    }
    workload = build_workload(next(iter(variants.values())).workload_spec())
    times: dict[str, list[float]] = {k: [] for k in variants}
    summaries: dict[str, dict] = {}
    for _ in range(args.repeats):
        for name, opts in variants.items():
            wall, summaries[name] = _run(opts, workload)
            times[name].append(wall)
    print("| run | simulate, median (s) | runs (s) | prefix hit | host hit | ttft p50 (s) |")
    print("|---|---|---|---|---|---|")
    for name, ts in times.items():
        s = summaries[name]
        print(f"| {name} | {statistics.median(ts):.2f} | {', '.join(f'{t:.2f}' for t in ts)} | "
              f"{s['prefix_hit_rate']:.4f} | {s['host_hit_rate']:.4f} | {s['ttft_p50_s']:.3f} |")
    a, b = (statistics.median(ts) for ts in times.values())
    print(f"| ratio tier / no tier | **{b / a:.2f}x** | | | | |")


if __name__ == "__main__":
    main()
