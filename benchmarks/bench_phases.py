"""Where a whole run's fixed costs go: the `bench_e2e.py` run (the whole Azure conversation
trace, `paged`, page 16) split into imports, the trace load, `simulate` with the calls it makes
after the engine stops, and the interpreter's exit (printed as the time of the last line:
subtract it from the time the process ended). Wall seconds; compare runs alternated in one
session, as docs/performance.md does.

    python benchmarks/bench_phases.py [--num-requests N]; echo "exited $(date +%s.%N)"
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import sys  # noqa: E402

from kvcore.model.memory import MemorySpec  # noqa: E402
from kvcore.model.planner import resolve_kv_tokens  # noqa: E402
from simulator import run as run_module  # noqa: E402
from simulator.config import SimConfig  # noqa: E402
from workloads.registry import build_workload  # noqa: E402
from workloads.spec import WorkloadSpec  # noqa: E402

POST_RUN = ("summarize", "_overload", "reuse_gap", "latency_columns")  # simulator/run.py


def _timed(name: str, spent: dict[str, float]) -> None:
    """Replace simulator.run's `name` with a copy that adds its wall time to `spent`."""
    inner = getattr(run_module, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

    setattr(run_module, name, timed)


def main() -> None:
    imports = time.perf_counter() - T0
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--num-requests", type=int, default=None)
    args = ap.parse_args()
    t1 = time.perf_counter()
    wl = build_workload(WorkloadSpec(name="azure-conv", num_requests=args.num_requests))
    load = time.perf_counter() - t1
    kv = resolve_kv_tokens(MemorySpec(model="llama-3.1-8b", gpu="h100", budget="vllm"),
                           page_size=16)
    cfg = SimConfig.of(policy="paged", page_size=16, model="llama-3.1-8b", gpu="h100",
                       kv_tokens=kv)
    spent: dict[str, float] = {}
    for name in POST_RUN:
        _timed(name, spent)
    t2 = time.perf_counter()
    res = run_module.simulate(wl, cfg)
    sim = time.perf_counter() - t2
    print("| imports s | load s | simulate s | " + " | ".join(f"{n} s" for n in POST_RUN)
          + " | requests | pandas imported |")
    print("|---" * (5 + len(POST_RUN)) + "|")
    print(f"| {imports:.2f} | {load:.2f} | {sim:.2f} | "
          + " | ".join(f"{spent.get(n, 0.0):.2f}" for n in POST_RUN)
          + f" | {res.summary['requests_completed']} | {'pandas' in sys.modules} |")
    print(f"last line at {time.time():.3f}", flush=True)


if __name__ == "__main__":
    main()
