"""The host KV tier through the CLI: a sweep over host-tier sizes with its figure, and option
errors as exit code 2 naming the flag."""

from __future__ import annotations

import pandas as pd
import pytest

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

    args = ["plan", *CHAT[:-5], "--page-size", "16", "--latency", "constant"]
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


def test_plan_target_hit_rate_warns_on_overload_and_writes_out(invoke, tmp_path):
    """Every probe of a k-shot stream at 500 req/s is overloaded: the sizing says so (the
    one-line warning and a note), and --out gets every probe's summary row (issue 26 item 5;
    a few seconds: about six small constant-latency simulations)."""
    import pandas as pd

    out = tmp_path / "host"
    r = invoke("plan", "--workload", "kshot", "--num-requests", "60", "--rate", "500",
               "--kv-tokens", "4096", "--latency", "constant", "--page-size", "16",
               "--max-context-len", "2048", "--target-hit-rate", "0.3", "--out", out)
    assert r.exit_code == 0, r.output
    assert "warning: overloaded" in r.output and "probes were overloaded" in r.output
    rows = pd.read_csv(out / "summary.csv")
    assert len(rows) >= 1 and rows["overloaded"].all()
    assert set(rows["hicache_ratio"]) >= {0.0}


def test_plan_target_hit_rate_at_the_sustainable_rate(invoke):
    """--at-sustainable-rate with --target-hit-rate searches the rate first and sizes the
    tier there (it was silently ignored: issue 38, item 5); --find-rate only reports it."""
    import json

    args = ["plan", "--workload", "kshot", "--num-requests", "60", "--rate", "500",
            "--kv-tokens", "4096", "--latency", "constant", "--page-size", "16",
            "--max-context-len", "2048", "--target-hit-rate", "0.3", "--steps", "1", "--json"]
    plain = json.loads(invoke(*args[:-3], "--json").stdout)
    assert plain["overloaded"] and "capacity" not in plain
    r = invoke(*args, "--at-sustainable-rate")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    cap, used = doc["capacity"], doc["sizing_rate"]
    assert cap["overloaded_at_start"] and used["flag"] == "--rate" and used["value"] < 500
    assert not doc["overloaded"] and doc != plain
    found = json.loads(invoke(*args, "--find-rate").stdout)
    assert "sizing_rate" not in found and found["steps"] == plain["steps"]
    assert found["capacity"]["rate_req_s"] == cap["rate_req_s"]


@pytest.mark.parametrize("flag", [["--tolerance", "0.1"], ["--page-sizes", "1,16"],
                                  ["--seeds", "0,1"], ["--jobs", "2"], ["--context-len", "64"],
                                  ["--progress"], ["--hicache-ratio", "2"]])
def test_plan_target_hit_rate_refuses_what_it_would_not_read(invoke, flag):
    r = invoke("plan", *CHAT[:-5], "--target-hit-rate", "0.2", *flag)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
    assert r.stderr.startswith(f"kvsim: error: {flag[0]}")


def test_a_host_tier_above_a_servers_memory_per_gpu_gets_a_note():
    from experiments.answers.host_sizing import TYPICAL_HOST_GIB_PER_GPU, HostSizing, SizingStep

    big = SizingStep(64.0, 952.0, 0.5, 0.4, 0.1)
    res = HostSizing(0.5, 0.6, big, (SizingStep(0.0, 0.0, 0.1, 0.0, 0.1), big))
    assert abs(TYPICAL_HOST_GIB_PER_GPU - 232.8) < 0.1
    assert any("952 GiB per rank, more than the 233 GiB" in n for n in res.notes())
    small = HostSizing(0.5, 0.6, SizingStep(1.0, 10.0, 0.5, 0.4, 0.1), ())
    assert small.notes() == [] and not small.overloaded
