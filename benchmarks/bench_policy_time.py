"""The policy's own share of a real run: every engine-facing call of the policy (the kvcore
structures: allocator, radix cache or block pool, page table) timed from inside a normal
`simulate`, the rest of the run being the engine's (SimPy, admission, stretch planning,
latency, recording).

    python benchmarks/bench_policy_time.py                  # bench_e2e's run: Azure, paged, page 16
    python benchmarks/bench_policy_time.py --policy vllm --page-size 1 --chunk 64 \
        --workload mooncake-conv --num-requests 300             # a bench_policies cell

Why: whatever the engine does, the process still pays its fixed costs (imports, trace load,
exit: `bench_phases.py`) and the policy's own calls, so those two together bound the ratio
any engine work can reach.
A replay of the recorded calls (`bench_paged_replay.py`) overstates the calls (each replays
cold); here they run with the data as warm as in a real run. Each call is wrapped by a timer
(outermost calls only); the wrapper's own cost is measured on a no-op and printed, and the
policy column has its in-call part taken off. The first run warms the caches and is not shown.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable
from typing import Any

from bench_paged_replay import METHODS
from bench_policies import config as cell_config

from kvcore import policies
from kvcore.model.memory import MemorySpec
from kvcore.model.planner import resolve_kv_tokens
from simulator.config import SimConfig
from simulator.run import simulate
from workloads.registry import build_workload
from workloads.spec import WorkloadSpec


class CallTimer:
    """Wraps a policy's engine-facing methods; `spent[name]` sums the outermost calls."""

    def __init__(self) -> None:
        self.spent: collections.Counter[str] = collections.Counter()
        self.calls = 0
        self._depth = 0

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:  # an inner call: its time is inside the outer one's
                return fn(*args, **kwargs)
            self._depth += 1
            self.calls += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[name] += time.perf_counter() - t0
                self._depth -= 1

        return timed

    def instrument(self, policy: Any) -> Any:
        for name in METHODS:
            fn = getattr(policy, name, None)
            if fn is not None:
                setattr(policy, name, self.wrap(name, fn))  # shadows the class's method
        return policy


def wrapper_cost(n: int = 200_000) -> tuple[float, float]:
    """Seconds per wrapped call: (counted inside the call, added outside it)."""
    probe = CallTimer()
    noop = probe.wrap("noop", lambda *a: None)
    t0 = time.perf_counter()
    for _ in range(n):
        noop(1, 2)
    wrapped = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n):
        (lambda *a: None)(1, 2)
    plain = time.perf_counter() - t0
    inside = probe.spent["noop"] / n
    return inside, max(0.0, (wrapped - plain) / n - inside)


def run_config(args: argparse.Namespace) -> SimConfig:
    if args.workload == "azure-conv" and not args.chunk:  # bench_e2e.py's run exactly
        kv = resolve_kv_tokens(MemorySpec(model="llama-3.1-8b", gpu="h100", budget="vllm"),
                               page_size=args.page_size)
        return SimConfig.of(policy=args.policy, page_size=args.page_size, model="llama-3.1-8b",
                            gpu="h100", kv_tokens=kv)
    return cell_config(args.policy, args.page_size, args.chunk)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="paged")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=0, help="--chunked-prefill-size (0: default)")
    ap.add_argument("--workload", default="azure-conv")
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    wl = build_workload(WorkloadSpec(name=args.workload, num_requests=args.num_requests))
    cfg = run_config(args)
    timer = CallTimer()
    build = policies.make_policy

    def instrumented(name: str, pconfig: Any) -> Any:
        return timer.instrument(build(name, pconfig))

    # the engine looks the factory up by name at run time (simulator/run.py)
    patched = [m for m in list(sys.modules.values())
               if m is not None and getattr(m, "make_policy", None) is build]
    for module in patched:
        module.make_policy = instrumented  # type: ignore[attr-defined]
    inside, outside = wrapper_cost()
    print(f"{args.policy}, page {args.page_size}, chunk {args.chunk or 'default'}, "
          f"{args.workload} ({wl.num_requests} requests); "
          f"wrapper: {inside * 1e6:.2f} us inside + {outside * 1e6:.2f} us outside a call\n")
    print("| run | simulate s | policy s | engine s | policy calls | top methods (s) |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for run in range(args.runs + 1):
        timer.spent.clear()
        timer.calls = 0
        t0 = time.perf_counter()
        simulate(wl, cfg)
        total = time.perf_counter() - t0
        policy = sum(timer.spent.values()) - timer.calls * inside
        engine = total - policy - timer.calls * (inside + outside)
        if run == 0:
            continue  # warm-up
        top = ", ".join(f"{k} {v:.2f}" for k, v in timer.spent.most_common(5))
        print(f"| {run} | {total:.2f} | {policy:.2f} | {engine:.2f} | {timer.calls:,} | {top} |")


if __name__ == "__main__":
    main()
