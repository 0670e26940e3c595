"""Hit rates and TTFT with a host KV tier on the whole bundled Mooncake conversation trace
(Llama-3.1-8B, one H100, the sglang budget rule's pool), the figures of docs/tiers.md:

    python benchmarks/tiers_mooncake.py 16 0,1,4,400     # page size, host tiers (x the pool)
    python benchmarks/tiers_mooncake.py 512 400
    python benchmarks/tiers_mooncake.py 16 0,1,4,400 vllm  # the vllm policy's block tier

A ratio of 400 holds every token the trace writes: the unbounded tier, whose total hit rate
must equal the trace's ideal reuse (printed first).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.options.run_options import RunOptions
from simulator.run import simulate
from workloads import build_workload
from workloads.reuse import ideal_reuse


def main() -> None:
    ps = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    ratios = [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "0,1,4,400").split(",")]
    policy = sys.argv[3] if len(sys.argv) > 3 else "paged"
    base = {"workload": "mooncake-conv", "model": "llama-3.1-8b", "gpu": "h100",
            "page_size": ps, "policy": policy}
    opts = RunOptions.from_mapping(base)
    w = build_workload(opts.workload_spec())
    total = sum(r.prompt_len + r.output_len for r in w.requests)
    print(f"policy={policy} ps={ps} requests={w.num_requests} "
          f"kv_tokens={opts.resolved_kv_tokens()} tokens={total} "
          f"ideal={ideal_reuse(w, ps):.4f}", flush=True)
    for r in ratios:
        cell = RunOptions.from_mapping({**base, "hicache_ratio": r} if r else base)
        t = time.time()
        s = simulate(w, cell.sim_config()).summary
        print(f"ratio={r:g} host_slots={s['host_capacity_slots']} "
              f"total={s['prefix_hit_rate']:.4f} device={s['device_hit_rate']:.4f} "
              f"host={s['host_hit_rate']:.4f} ttft_p50={s['ttft_p50_s']:.2f} "
              f"ttft_p99={s['ttft_p99_s']:.2f} load_stall_s={s['load_stall_s']:.2f} "
              f"h2d_GB={s['host_to_device_bytes'] / 1e9:.1f} "
              f"d2h_GB={s['device_to_host_bytes'] / 1e9:.1f} "
              f"rejected={s['requests_rejected']} wall={time.time() - t:.0f}s", flush=True)


if __name__ == "__main__":
    main()
