"""End-to-end speed: the whole bundled Azure conversation trace (19,366 requests, one hour)
through `paged` at page size 16 with the radix cache, Llama-3.1-8B on an H100 (vLLM budget).
Prints wall time, simulated requests per wall-clock second and peak RSS.

    python benchmarks/bench_e2e.py [--policy paged] [--page-size 16] [--num-requests N]
"""

from __future__ import annotations

import argparse
import resource
import time

from kvcore.model.memory import MemorySpec
from kvcore.model.planner import resolve_kv_tokens
from kvcore.policies import register_policy
from simulator.config import SimConfig
from simulator.run import simulate
from workloads.registry import build_workload
from workloads.spec import WorkloadSpec


def _register_counting() -> None:
    from counting_policy import CountingPolicy

    register_policy("counting", when="benchmark only")(CountingPolicy)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--policy", default="paged")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--num-requests", type=int, default=None)
    args = ap.parse_args()
    if args.policy == "counting":
        _register_counting()
    t0 = time.perf_counter()
    wl = build_workload(WorkloadSpec(name="azure-conv", num_requests=args.num_requests))
    kv = resolve_kv_tokens(MemorySpec(model="llama-3.1-8b", gpu="h100", budget="vllm"),
                           page_size=args.page_size)
    load_s = time.perf_counter() - t0
    cfg = SimConfig.of(policy=args.policy, page_size=args.page_size, model="llama-3.1-8b",
                    gpu="h100", kv_tokens=kv)
    t1 = time.perf_counter()
    res = simulate(wl, cfg)
    wall = time.perf_counter() - t1
    s = res.summary
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("| policy | page | requests | engine steps | load s | simulate s | req/s "
          "| peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {args.policy} | {args.page_size} | {s['requests_completed']} | {s['iterations']} "
          f"| {load_s:.2f} | {wall:.1f} | {s['requests_completed'] / wall:.0f} | {rss_mib:.0f} |")


if __name__ == "__main__":
    main()
