"""What a fleet costs to simulate: the bundled Mooncake conversation trace on 1, 8 and 32
replicas, its rate scaled to the fleet (`--rate-scale 0.3 x replicas`: 0.3 is one replica's
sustainable share, README), `--requests-per-replica` requests per replica, under each router.

Prints, per (replicas, router): the wall time, the simulation's wall time per request (the
trace's parsing left out; a fleet should cost about what one replica costs per request), the
router's own time per decision, and what the fleet did (prefix hit rate, TTFT p90,
throughput, load imbalance); writes them to --csv and
the per-request cost against the replica count to --png. Timings are of this machine, taken
one run after another (a busy machine stretches them all alike; compare the ratios).

    python benchmarks/bench_fleet.py [--replicas 1,8,32] [--routers round-robin,...]
        [--requests-per-replica 375] [--repeat 1] [--csv out.csv] [--png out.png]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROUTERS = "round-robin,cache-aware,llm-d-precise,dynamo"
PER_REPLICA_SCALE = 0.3  # one replica's sustainable --rate-scale on this trace (README)


def run(replicas: int, router: str, per: int) -> dict:
    import numpy as np

    from experiments.answers.runner import simulate_options
    from experiments.options.run_options import RunOptions

    values = {"workload": "mooncake-conv", "num_requests": per * replicas,
              "rate_scale": PER_REPLICA_SCALE * replicas, "page_size": 16}
    if replicas > 1:
        values.update(replicas=replicas, router=router)
    opts = RunOptions.from_mapping(values)
    t0 = time.perf_counter()
    row, res = simulate_options(opts)
    wall = time.perf_counter() - t0
    n = int(row["requests_total"])
    ttft = res.requests.ttft_s[res.requests.status == "completed"].to_numpy(dtype=float)
    # sim_wall_s: the simulation alone (the trace's parsing, a fixed cost, left out)
    return {"replicas": replicas, "router": router if replicas > 1 else "-", "requests": n,
            "wall_s": wall, "sim_wall_s": row["sim_wall_s"],
            "ms_per_request": 1e3 * row["sim_wall_s"] / n,
            "router_us_per_request": row.get("router_us_per_request", float("nan")),
            "prefix_hit_rate": row["prefix_hit_rate"],
            "ttft_p90_s": float(np.percentile(ttft, 90)) if len(ttft) else float("nan"),
            "ttft_p99_s": row["ttft_p99_s"], "throughput_tok_s": row["throughput_tok_s"],
            "load_imbalance": row.get("load_imbalance", 1.0),
            "overloaded": bool(row["overloaded"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="1,8,32")
    ap.add_argument("--routers", default=ROUTERS)
    ap.add_argument("--requests-per-replica", type=int, default=375)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each cell (the median's "
                    "costs are reported: a busy machine's timings are noisy)")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--png", default=None)
    args = ap.parse_args()
    import pandas as pd

    rows = []
    for n in [int(x) for x in args.replicas.split(",")]:
        for router in (args.routers.split(",") if n > 1 else ["-"]):
            runs = [run(n, router, args.requests_per_replica) for _ in range(args.repeat)]
            r = sorted(runs, key=lambda x: x["sim_wall_s"])[len(runs) // 2]
            rows.append(r)
            print(f"{n:3d} replicas {r['router']:14s} {r['requests']:6d} req  wall "
                  f"{r['wall_s']:7.1f} s  {r['ms_per_request']:.2f} ms/req  router "
                  f"{r['router_us_per_request']:.0f} us/req  hit {r['prefix_hit_rate']:.3f}  "
                  f"TTFT p90 {r['ttft_p90_s']:.3g} s  {r['throughput_tok_s']:,.0f} tok/s  "
                  f"imbalance {r['load_imbalance']:.2f}  overloaded {r['overloaded']}",
                  flush=True)
    df = pd.DataFrame(rows)
    if args.csv:
        df.to_csv(args.csv, index=False)
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.8), layout="constrained")
        single = df[df.replicas == 1]
        for router, g in df[df.replicas > 1].groupby("router", sort=False):
            g = pd.concat([single, g]).sort_values("replicas")
            ax.plot(g.replicas, g.ms_per_request, marker="o", label=router)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("replicas (rate scaled with them)")
        ax.set_ylabel("simulation wall ms per request")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("fleet cost per request, Mooncake conversation trace")
        fig.savefig(args.png, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
