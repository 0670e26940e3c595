"""Simulated latency at page 1 against page 16 for each attention backend, on one
long-prompt workload (the issue-25 closing figure; docs/latency.md "Measured").

Llama-3.1-8B on an H100 under the `sglang-hopper` profile (the only engine whose backends
run page 1; vLLM's need multiples of 16 and fa2 upstream 256, which the table marks as
refused): 8 requests of 32,000 prompt tokens and 256 output tokens, at most 4 in flight.
Prints one Markdown row per backend: TPOT p50, ITL p50, TTFT p50 and the simulated makespan.

    python benchmarks/page_cost_by_backend.py [--input-len 32000] [--num-requests 8]
"""

from __future__ import annotations

import argparse

from simulator.attention_backends import BACKENDS
from simulator.config import SimConfig
from simulator.run import simulate
from workloads.registry import build_workload
from workloads.spec import WorkloadSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--input-len", type=int, default=32_000)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--num-requests", type=int, default=8)
    ap.add_argument("--max-concurrency", type=int, default=4)
    a = ap.parse_args()
    w = build_workload(WorkloadSpec(lengths="uniform", input_len=a.input_len,
                                    output_len=a.output_len, spread=0.0, rate=0.5,
                                    num_requests=a.num_requests, max_context_len=131_072))
    print("| backend | page | TPOT p50 (ms) | ITL p50 (ms) | TTFT p50 (s) | makespan (s) |")
    print("|---|---|---|---|---|---|")
    for name in BACKENDS:
        for page in (1, 16):
            try:
                cfg = SimConfig.of(model="llama-3.1-8b", gpu="h100", max_context_len=131_072,
                                   kv_tokens=a.max_concurrency * (a.input_len + a.output_len)
                                   + 65_536, page_size=page, latency_profile="sglang-hopper",
                                   attention_backend=name, max_concurrency=a.max_concurrency)
                cfg.engine.latency_constants(page)
            except ValueError as e:
                print(f"| {name} | {page} | refused: {str(e).split(': ', 1)[1]} | | | |")
                continue
            s = simulate(w, cfg).summary
            print(f"| {name} | {page} | {s['tpot_p50_s'] * 1e3:.2f} | "
                  f"{s['itl_p50_s'] * 1e3:.2f} | {s['ttft_p50_s']:.3f} | "
                  f"{s['sim_end_s']:.2f} |")


if __name__ == "__main__":
    main()
