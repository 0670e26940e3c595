"""The host KV tier through the CLI: a sweep over host-tier sizes with its figure, and option
errors as exit code 2 naming the flag."""

from __future__ import annotations

import pandas as pd

from tests.cli.test_commands import assert_png_not_blank

# closed-loop chat sessions in a pool too small to keep a session between its turns
CHAT = ["--workload", "chat", "--num-requests", "60", "--kv-tokens", "2048",
        "--max-context-len", "2048", "--page-sizes", "16", "--latency", "constant",
        "--no-progress"]


def test_sweep_over_host_tier_sizes_draws_hit_rate_and_ttft(invoke, tmp_path):
    out = tmp_path / "hc"
    r = invoke("sweep", *CHAT, "--hicache-ratios", "0,2,8", "--out", out)
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "summary.csv").sort_values("hicache_ratio")
    assert df.hicache_ratio.tolist() == [0.0, 2.0, 8.0]
    assert df.host_hit_rate.iloc[0] == 0 and df.host_hit_rate.iloc[-1] > 0
    assert df.ideal_reuse.iloc[1:].notna().all() and df.ideal_reuse.iloc[1] > 0
    assert (df.prefix_hit_rate <= df.ideal_reuse.max() + 1e-12).all()
    assert_png_not_blank(out / "figures" / "hit_rate_ttft_vs_host_tier.png")


def test_run_vllm_with_a_host_tier(invoke, tmp_path):
    """`kvsim run --policy vllm --hicache-ratio 2`: the hash-keyed host tier serves hits the
    device forgot; a policy without a tier is exit code 2 naming the option."""
    run = ["run", *CHAT[:4], "--kv-tokens", "2048", "--max-context-len", "2048",
           "--page-size", "16", "--latency", "constant", "--no-progress"]
    r = invoke(*run, "--policy", "vllm", "--hicache-ratio", "2", "--out", tmp_path / "v")
    assert r.exit_code == 0, r.output
    row = pd.read_csv(tmp_path / "v" / "summary.csv").iloc[0]
    assert row.policy == "vllm" and row.hicache_ratio == 2.0
    assert row.host_capacity_slots == 2 * 2048 and row.host_hit_rate > 0
    assert row.prefix_hit_rate > row.device_hit_rate
    r = invoke(*run, "--policy", "contiguous-max", "--hicache-ratio", "2")
    assert r.exit_code == 2 and "--hicache-ratio" in r.stderr and "vllm" in r.stderr


def test_tier_option_errors_exit_2(invoke, tmp_path):
    r = invoke("run", "--hicache-size", "1", "--hicache-ratio", "2")
    assert r.exit_code == 2 and "--hicache-ratio" in r.stderr
    r = invoke("run", "--hicache-write-policy", "sometimes")
    assert r.exit_code == 2 and "--hicache-write-policy" in r.stderr
    r = invoke("sweep", *CHAT, "--hicache-ratios", "1,x", "--out", tmp_path / "bad")
    assert r.exit_code == 2 and "--hicache-ratios" in r.stderr


def test_plan_sizes_the_host_tier_for_a_target_hit_rate(invoke):
    import json

    args = ["plan", *CHAT[:-3], "--page-size", "16", "--latency", "constant"]
    r = invoke(*args, "--target-hit-rate", "0.2", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    need = doc["needed"]
    assert need is not None and need["prefix_hit_rate"] >= 0.2 and need["host_gib"] > 0
    misses = [s for s in doc["steps"] if s["ratio"] < need["ratio"]]
    assert misses and all(s["prefix_hit_rate"] < 0.2 for s in misses if s["ratio"] == 0)
    r = invoke(*args, "--target-hit-rate", "0.99")
    assert r.exit_code == 2 and "ideal reuse" in r.stderr
    r = invoke("plan", "--target-hit-rate", "0.5")
    assert r.exit_code == 2 and "--trace or --workload" in r.stderr
