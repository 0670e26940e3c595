"""Every policy's speed against `paged` (target: at most 2x everywhere): the same workload
through each policy and through `paged` at page sizes 1, 16 and 256, with the default engine
and with small interleaved prefill chunks (`--chunked-prefill-size 64`), in one process.

    python benchmarks/bench_policies.py [--num-requests 300] [--repeats 3]
        [--page-sizes 1 16 256] [--chunks 0 64] [--policies vllm contiguous-max ...]
        [--placements first-fit best-fit buddy] [--profile N]

The workload is the first N requests of the bundled Mooncake conversation trace (default
300): its requests share prefixes (a session's turns
resend the history), so the caching policies do real prefix work (hash chains, lookups,
evictions), and its long prompts (thousands of tokens) make many chunks per request at
`--chunked-prefill-size 64`, the interleaved case; 1,000 requests at chunk 64 take over
20 s per `paged` run on the reference machine, 300 a few seconds, so the whole table with
repeats stays within minutes.
Llama-3.1-8B on an H100, vLLM budget rule, roofline latency.

The machine's speed drifts, so each cell is timed as pairs: `paged` and the policy back to
back, the order alternating between repeats, and the cell's figure is the median of the
pairs' ratios. Contiguous policies have no pages of their own, but the engine's page size
still sets the pool (budget rounding) and the chunk rule, so they run at every page size too;
their placement is the default (first-fit) unless `--placements` names more.

Prints a Markdown table: policy, page, chunk, median simulate seconds of the policy and of
`paged`, and the median ratio (target <= 2.0), then the machine's load average at the start
and the end (a ratio is only as steady as the machine under it). `--profile N` then runs
cProfile on the N worst cells and prints their top entries by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time
from dataclasses import dataclass

from kvcore.model.memory import MemorySpec
from kvcore.model.planner import resolve_kv_tokens
from simulator.config import SimConfig
from simulator.run import simulate
from workloads.registry import build_workload
from workloads.request import Workload
from workloads.spec import WorkloadSpec

POLICIES = ("paged-nocache", "vllm", "contiguous-max", "contiguous-pow2", "contiguous-oracle")
CONTIGUOUS = ("contiguous-max", "contiguous-pow2", "contiguous-oracle")


@dataclass(frozen=True)
class Cell:
    """One table row: a policy (and placement) at a page size and chunk size."""

    policy: str
    placement: str
    page_size: int
    chunk: int

    def label(self) -> str:
        return self.policy if self.policy not in CONTIGUOUS else f"{self.policy} ({self.placement})"


def config(policy: str, page_size: int, chunk: int, placement: str = "first-fit") -> SimConfig:
    """The run's configuration: the same pool for every policy at one page size."""
    kv = resolve_kv_tokens(MemorySpec(model="llama-3.1-8b", gpu="h100", budget="vllm"),
                           page_size=page_size)
    flat: dict[str, object] = dict(policy=policy, page_size=page_size, model="llama-3.1-8b",
                                   gpu="h100", kv_tokens=kv)
    if chunk:
        flat["chunked_prefill_size"] = chunk
    if policy in CONTIGUOUS:
        flat["placement"] = placement
    return SimConfig.of(**flat)


def timed(wl: Workload, cfg: SimConfig) -> float:
    t0 = time.perf_counter()
    simulate(wl, cfg)
    return time.perf_counter() - t0


def measure(wl: Workload, cell: Cell, repeats: int) -> tuple[float, float, float]:
    """Median policy seconds, median paged seconds, median of the pairs' ratios."""
    mine = config(cell.policy, cell.page_size, cell.chunk, cell.placement)
    base = config("paged", cell.page_size, cell.chunk)
    ts, tb, ratios = [], [], []
    for r in range(repeats):
        if r % 2 == 0:
            b = timed(wl, base)
            m = timed(wl, mine)
        else:
            m = timed(wl, mine)
            b = timed(wl, base)
        ts.append(m)
        tb.append(b)
        ratios.append(m / b)
    return statistics.median(ts), statistics.median(tb), statistics.median(ratios)


def profile(wl: Workload, cell: Cell, top: int = 18) -> str:
    prof = cProfile.Profile()
    cfg = config(cell.policy, cell.page_size, cell.chunk, cell.placement)
    prof.enable()
    simulate(wl, cfg)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def _load(avg: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.2f}" for x in avg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=300)
    ap.add_argument("--workload", default="mooncake-conv")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 64],
                    help="chunked prefill sizes; 0: the engine's default")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--placements", nargs="+", default=["first-fit"],
                    help="placements for the contiguous policies")
    ap.add_argument("--profile", type=int, default=0, help="cProfile the N worst cells")
    args = ap.parse_args()
    wl = build_workload(WorkloadSpec(name=args.workload, num_requests=args.num_requests))
    cells = [Cell(p, pl, ps, ch)
             for ch in args.chunks for ps in args.page_sizes for p in args.policies
             for pl in (args.placements if p in CONTIGUOUS else ["first-fit"])]
    load0 = os.getloadavg()
    print(f"{args.workload}, first {args.num_requests} requests; simulate wall seconds, "
          f"median of {args.repeats} alternating pairs")
    print()
    print("| policy | page | chunk | simulate s | paged s | ratio to paged |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    results = []
    for cell in cells:
        tm, tb, ratio = measure(wl, cell, args.repeats)
        results.append((ratio, cell))
        chunk = cell.chunk or "default"
        flag = "**" if ratio > 2.0 else ""
        print(f"| {cell.label()} | {cell.page_size} | {chunk} | {tm:.2f} | {tb:.2f} "
              f"| {flag}{ratio:.2f}{flag} |", flush=True)
    print(f"\nload average (1, 5, 15 min): {_load(load0)} at the start, "
          f"{_load(os.getloadavg())} at the end")
    for ratio, cell in sorted(results, key=lambda x: x[0], reverse=True)[:args.profile]:
        print(f"\n### profile: {cell.label()}, page {cell.page_size}, chunk "
              f"{cell.chunk or 'default'} (ratio {ratio:.2f})\n")
        print(profile(wl, cell))


if __name__ == "__main__":
    main()
