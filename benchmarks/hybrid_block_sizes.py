"""The hit-rate cliff of large blocks on a hybrid model: prefix hit rate against the block size
for Qwen3.5-4B (24 gated-delta-net + 8 full-attention layers) under the `vllm` policy on a
slice of the bundled Mooncake conversation trace, one H100 under vLLM's budget rule; beside it
the same model with every layer stored as full attention (`--kv-layout full-attention`, the
pre-hybrid baseline) and the trace's ideal reuse. The gallery figure of docs/hybrid.md:

    python benchmarks/hybrid_block_sizes.py                # 400 requests, the trace's rate
    python benchmarks/hybrid_block_sizes.py 100 2 /tmp/x   # a quick look, arrivals x 2
    python benchmarks/hybrid_block_sizes.py --replot 400 1 # the figure again from the CSV

The arrivals keep the trace's own rate by default (`--rate-scale` 1), which one H100 serves:
every run's overload verdict (`overloaded`, docs/planning.md) is in the CSV, and a point whose
run is overloaded is drawn hollow, since its latency measures the queue. The hit rate depends
on which prompts arrive, not on when (the pool holds every prefix of the slice).

vLLM raises the attention block of an attention + Mamba hybrid until one attention page holds
one layer's state (kvcore.model.hybrid_plan.vllm_block_size: 528 tokens for Qwen3.5-4B), so no
block below 528 exists; Mamba's prefix cache (mode "align") keeps states at block boundaries
only, so a prompt shares at most its whole blocks. Writes OUT/hybrid_block_size.csv (every
run's summary columns that matter here) and OUT/hybrid_block_size_hit_rate.png.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from experiments.options.run_options import RunOptions
from kvcore.model.hybrid_plan import vllm_block_size
from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.presets import get_model
from reports.io import atomic_write_text, save_figure_atomic
from simulator.run import simulate
from workloads import build_workload
from workloads.reuse import ideal_reuse

MODEL = "qwen3.5-4b"
HYBRID_BLOCKS = (528, 1056, 2112, 4224)  # any smaller block is raised to 528 by vLLM
FULL_BLOCKS = (16, 64, 256, 528, 1056, 2112, 4224)
COLUMNS = ("kv_layout", "page_size", "block_size", "prefix_hit_rate", "ideal_reuse",
           "kv_mem_gib", "used_gib", "full_pool_used_pct", "mamba_pool_used_pct",
           "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "requests_completed", "overloaded",
           "sim_wall_s")


def main() -> None:
    if sys.argv[1:2] == ["--replot"]:
        n, scale = int(sys.argv[2]), float(sys.argv[3])
        out = Path(sys.argv[4]) if len(sys.argv) > 4 else Path("docs/gallery")
        plot(pd.read_csv(out / "hybrid_block_size.csv"), n, scale,
             out / "hybrid_block_size_hit_rate.png")
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    scale = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else Path("docs/gallery")
    base = {"workload": "mooncake-conv", "num_requests": n, "model": MODEL, "gpu": "h100",
            "budget": "vllm", "policy": "vllm", "max_context_len": 32768,
            "rate_scale": scale}
    w = build_workload(RunOptions.from_mapping(base).workload_spec())
    rows = []
    for layout, blocks in (("hybrid", HYBRID_BLOCKS), ("full-attention", FULL_BLOCKS)):
        for bs in blocks:
            opts = RunOptions.from_mapping({**base, "page_size": bs, "kv_layout": layout})
            t = time.time()
            cfg = opts.sim_config()
            s = simulate(w, cfg).summary
            eff = (vllm_block_size(LAYOUTS[MODEL], "bf16", 1, bs).block_size
                   if layout == "hybrid" else bs)
            # memory in use, time-averaged: every part of the shared pool but the free one
            row = {"kv_layout": layout, "page_size": bs, "block_size": eff,
                   "ideal_reuse": ideal_reuse(w, 1),
                   "kv_mem_gib": pool_bytes(cfg) / 2**30,
                   "used_gib": pool_bytes(cfg) / 2**30 * (100.0 - s["free_pct"]) / 100.0,
                   **{k: s.get(k) for k in COLUMNS if k in s}}
            rows.append(row)
            print(" ".join(f"{k}={row.get(k)}" for k in COLUMNS), f"wall={time.time() - t:.0f}s",
                  flush=True)
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "hybrid_block_size.csv", df.to_csv(index=False))
    plot(df, n, scale, out / "hybrid_block_size_hit_rate.png")


def pool_bytes(cfg) -> float:
    """The KV pool's bytes: a hybrid run's per-rank budget, or the full-attention pool's
    tokens x every layer's KV per token (the pre-hybrid baseline)."""
    if cfg.pool.kv_bytes:
        return float(cfg.pool.kv_bytes)
    return float(cfg.pool.kv_tokens * get_model(MODEL).kv_bytes_per_token("bf16"))


def plot(df: pd.DataFrame, n: int, scale: float, path: Path) -> None:
    """Hit rate, memory in use and median TTFT against the block size, one line per layout;
    a hollow marker is an overloaded run (its latency measures the queue)."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    lines = (("full-attention", "s--", "every layer full attention (pre-hybrid)", 2),
             ("hybrid", "o-", "Qwen3.5-4B hybrid (vLLM: blocks >= 528, Mamba align)", 3))
    for ax, col, ylabel in zip(axes, ("prefix_hit_rate", "used_gib", "ttft_p50_s"),
                               ("prefix hit rate", "KV memory in use, time average (GiB)",
                                "TTFT p50 (s)"), strict=True):
        for layout, style, label, z in lines:
            d = df[df.kv_layout == layout].drop_duplicates("block_size")
            d = d.sort_values("block_size")
            line, = ax.plot(d.block_size, d[col], style, label=label, zorder=z, ms=7 - z)
            over = d[d.overloaded.astype(bool)]
            if len(over):  # hollow: overloaded
                ax.plot(over.block_size, over[col], style[0], ms=10 - z, mfc="white",
                        mec=line.get_color(), zorder=z + 1)
        ax.axvline(528, color="tab:red", lw=0.8, alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(df.block_size)))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.tick_params(axis="x", labelsize=7, rotation=45)
        ax.set_xlabel("block size (tokens)")
        ax.set_ylabel(ylabel)
    ax = axes[0]
    ax.axhline(float(df.ideal_reuse.iloc[0]), color="grey", ls=":",
               label="ideal reuse (token level, infinite cache)")
    ax.text(528, 0.03, " smallest hybrid block: 528", color="tab:red", fontsize=8)
    ax.set_ylim(0, max(float(df.ideal_reuse.iloc[0]), float(df.prefix_hit_rate.max())) * 1.15)
    ax.legend(fontsize=7, loc="upper right")
    over = int(df.overloaded.astype(bool).sum())
    fig.suptitle(f"Block size on a hybrid model: Mooncake conversation trace, first {n} "
                 f"requests (arrivals x {scale:g}), one H100 under vLLM's budget; "
                 f"{over} of {len(df)} runs overloaded (hollow)", fontsize=9)
    fig.tight_layout()
    save_figure_atomic(path, fig, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
