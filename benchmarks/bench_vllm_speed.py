"""The `vllm` policy's speed against `paged`: the same bundled Mooncake conversation slice
through both, at page sizes 1, 16 and 64, in one process (the machine's drift cancels in the
ratio). Llama-3.1-8B on an H100, vLLM budget rule, roofline latency, default engine.

    python benchmarks/bench_vllm_speed.py [--num-requests 1000] [--page-sizes 1 16 64]

Prints a Markdown table: simulate wall seconds per policy, the ratio vllm / paged (target
<= 3 at every page size), and each run's prefix hit rate (the two policies cache differently:
the radix tree reuses partial pages' worth of tokens at page 1 as vLLM's full blocks do).
"""

from __future__ import annotations

import argparse
import time

from kvcore.model.memory import MemorySpec
from kvcore.model.planner import resolve_kv_tokens
from simulator.config import SimConfig
from simulator.run import simulate
from workloads.registry import build_workload
from workloads.spec import WorkloadSpec


def _time(policy: str, page_size: int, wl: object, kv: int) -> tuple[float, dict]:
    cfg = SimConfig.of(policy=policy, page_size=page_size, model="llama-3.1-8b", gpu="h100",
                       kv_tokens=kv)
    t0 = time.perf_counter()
    res = simulate(wl, cfg)  # type: ignore[arg-type]
    return time.perf_counter() - t0, res.summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16, 64])
    args = ap.parse_args()
    wl = build_workload(WorkloadSpec(name="mooncake-conv", num_requests=args.num_requests))
    print(f"Mooncake conversation, first {args.num_requests} requests; simulate wall seconds")
    print()
    print("| page | paged s | vllm s | vllm / paged | paged hit rate | vllm hit rate |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for ps in args.page_sizes:
        kv = resolve_kv_tokens(MemorySpec(model="llama-3.1-8b", gpu="h100", budget="vllm"),
                               page_size=ps)
        tp, sp = _time("paged", ps, wl, kv)
        tv, sv = _time("vllm", ps, wl, kv)
        print(f"| {ps} | {tp:.2f} | {tv:.2f} | **{tv / tp:.2f}** "
              f"| {sp['prefix_hit_rate']:.4f} | {sv['prefix_hit_rate']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
