"""Hybrid models in a run's options (simulator/hybrid.py, experiments/options/run_options.py): the
layout and budget reach PolicyConfig, an option the run would ignore is a one-line error, and a
full-attention model's summary columns and config are what they were. The per-kind pool
columns (simulator/pool_columns.py) by hand. Cost: about 1 s."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.options.engines import ENGINE_OPTION
from experiments.options.run_options import OPTIONS, RunOptions
from kvcore.contract.capabilities import PoolUsage
from kvcore.contract.policy import PolicyConfig
from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.memory import HYBRID_MEMORY_OPTIONS, MemorySpec
from kvcore.model.planner import plan
from kvcore.model.presets import get_model
from kvcore.policies import make_policy
from simulator.config import SimConfig
from simulator.fleet.spec import ROUTER_OPTIONS
from simulator.hybrid import HYBRID_OPTIONS
from simulator.metrics import Recorder
from simulator.pool_columns import pool_column_names, pool_columns
from simulator.run import policy_config
from simulator.shared_tier import SHARED_OPTIONS


def _pc(**flat) -> PolicyConfig:
    return policy_config(SimConfig.of(kv_tokens=65536, **flat), 4096)


def test_a_hybrid_run_hands_its_layout_budget_and_options_to_the_policy() -> None:
    pc = _pc(model="gpt-oss-20b", policy="paged", swa_full_tokens_ratio=0.5)
    assert pc.layout == LAYOUTS["gpt-oss-20b"] and pc.is_hybrid
    # no kv_bytes in the pool spec: kv_tokens slots of every layer as full attention
    assert pc.kv_bytes == 65536 * get_model("gpt-oss-20b").kv_bytes_per_token("bf16", 1)
    assert pc.swa_full_tokens_ratio == 0.5 and pc.mamba_full_memory_ratio == 0.9
    pc = _pc(model="nemotron-nano-9b-v2", policy="vllm", mamba_cache_mode="all",
             kv_bytes=10 << 30)
    assert (pc.mamba_cache_mode, pc.kv_bytes) == ("all", 10 << 30)
    # vLLM (v0.16+) runs "all" on a gated delta net model as "align", its fallback
    assert _pc(model="qwen3.5-4b", policy="vllm", mamba_cache_mode="all",
               kv_bytes=10 << 30).mamba_cache_mode == "align"
    # none given: the version's pick (v0.31: prefix caching on, align for GDN, all for
    # Mamba-2; v0.19: prefix caching off for hybrids, none)
    assert _pc(model="qwen3.5-4b", policy="vllm", kv_bytes=1 << 30).mamba_cache_mode == "align"
    assert _pc(model="nemotron-nano-9b-v2", policy="vllm",
               kv_bytes=1 << 30).mamba_cache_mode == "all"
    old = _pc(model="qwen3.5-4b", policy="vllm", kv_bytes=1 << 30, vllm_version="0.19.0")
    assert (old.mamba_cache_mode, old.vllm_version) == ("none", "0.19.0")
    pc = _pc(model="qwen3.5-4b", policy="paged", max_mamba_cache_size=7)
    assert pc.max_mamba_cache_size == 7


def test_the_pre_hybrid_baseline_is_the_full_attention_config() -> None:
    base = _pc(model="gpt-oss-20b", kv_layout="full-attention")
    assert base.layout is None and base.kv_bytes == 0 and not base.is_hybrid
    assert base == _pc(model="gpt-oss-20b", kv_layout="full-attention", policy="paged")


@pytest.mark.parametrize(("flat", "message"), [
    ({"model": "llama-3.1-8b", "kv_layout": "full-attention"}, "all full attention already"),
    ({"model": "llama-3.1-8b", "mamba_cache_mode": "none"},
     "--mamba-cache-mode applies to hybrid models"),
    ({"model": "gpt-oss-20b", "policy": "vllm", "swa_full_tokens_ratio": 0.5},
     "--swa-full-tokens-ratio is an option of --policy paged / paged-nocache"),
    ({"model": "qwen3.5-4b", "mamba_cache_mode": "all"},
     "--mamba-cache-mode is an option of --policy vllm, not of --policy paged"),
    ({"model": "gpt-oss-20b", "max_mamba_cache_size": 8},
     "--max-mamba-cache-size sizes Mamba / linear-attention layers; gpt-oss-20b has none"),
    ({"model": "qwen3.5-4b", "swa_full_tokens_ratio": 0.5},
     "--swa-full-tokens-ratio sizes sliding-window or chunked layers"),
    ({"model": "gpt-oss-20b", "kv_layout": "full-attention", "swa_full_tokens_ratio": 0.5},
     "--kv-layout full-attention stores every layer"),
    ({"model": "gpt-oss-20b", "policy": "contiguous-pow2"},
     "--policy contiguous-pow2 has no hybrid layout"),
    ({"model": "gpt-oss-20b", "hicache_ratio": 1.0}, "host tiers of a hybrid"),
    ({"model": "qwen3.5-4b", "max_mamba_cache_size": 4, "mamba_full_memory_ratio": 0.5},
     "give one of --mamba-full-memory-ratio and --max-mamba-cache-size"),
    ({"model": "gpt-oss-20b", "swa_full_tokens_ratio": 1.5}, r"--swa-full-tokens-ratio must "
     r"be in \(0, 1\]"),
    ({"model": "qwen3.5-4b", "policy": "vllm", "mamba_cache_mode": "some"},
     "--mamba-cache-mode 'some' is not one of: none, align, all"),
])
def test_an_option_the_run_would_ignore_is_a_one_line_error(flat, message) -> None:
    with pytest.raises(ValueError, match=message) as e:
        SimConfig.of(**flat)
    assert "\n" not in str(e.value)


def test_other_policies_on_a_hybrid_layout_are_refused_by_make_policy() -> None:
    cfg = PolicyConfig(kv_tokens=1024, layout=LAYOUTS["gemma-3-27b"])
    with pytest.raises(ValueError, match="policy 'contiguous-max' does not support hybrid "
                       "layouts"):
        make_policy("contiguous-max", cfg)


def test_full_attention_columns_and_hash_leave_the_hybrid_options_out() -> None:
    llama = RunOptions.from_mapping({"model": "llama-3.1-8b", "kv_tokens": 4096})
    cols = llama.resolved()
    assert not set(HYBRID_OPTIONS) & set(cols)
    # one replica: the fleet's options stay out too (simulator/fleet/spec.py), and so do the
    # shared tier's without one (simulator/shared_tier.py), and --engine without it
    # (experiments/options/engines.py: a column only when given)
    fleet = {"replicas", *ROUTER_OPTIONS, *SHARED_OPTIONS}
    assert set(cols) >= (set(OPTIONS) - set(HYBRID_OPTIONS) - set(HYBRID_MEMORY_OPTIONS)
                         - {"kv_cache_memory_bytes", ENGINE_OPTION} - fleet)
    assert not {*HYBRID_MEMORY_OPTIONS, "kv_cache_memory_bytes"} & set(cols)
    qwen = RunOptions.from_mapping({"model": "qwen3.5-4b", "kv_tokens": 4096,
                                    "policy": "vllm"})
    cols = qwen.resolved()
    assert (cols["kv_layout"], cols["mamba_cache_mode"], cols["swa_full_tokens_ratio"]) == (
        "hybrid", "align", 0.8)  # the values in effect
    base = RunOptions.from_mapping({"model": "qwen3.5-4b", "kv_tokens": 4096,
                                    "policy": "vllm", "kv_layout": "full-attention"})
    assert base.config_hash() != qwen.config_hash()
    # an explicit default is the same run as none given
    same = RunOptions.from_mapping({"model": "qwen3.5-4b", "kv_tokens": 4096,
                                    "policy": "vllm", "mamba_cache_mode": "align"})
    assert same.config_hash() == qwen.config_hash()


def test_the_budget_in_bytes_is_the_planners() -> None:
    opts = RunOptions.from_mapping({"model": "qwen3.5-4b", "gpu": "h100", "budget": "vllm",
                                    "policy": "vllm"})
    want = plan(MemorySpec(model="qwen3.5-4b", gpu="h100", budget="vllm"), page_size=16)
    assert opts.sim_config().pool.kv_bytes == int(want.kv_budget_bytes_per_rank)
    base = RunOptions.from_mapping({"model": "qwen3.5-4b", "gpu": "h100", "budget": "vllm",
                                    "policy": "vllm", "kv_layout": "full-attention"})
    assert base.sim_config().pool.kv_bytes == 0


def test_a_model_config_with_sliding_layers_runs_its_layout(tmp_path) -> None:
    config = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
              "head_dim": 64, "hidden_size": 512, "intermediate_size": 1024,
              "vocab_size": 1000, "max_position_embeddings": 4096, "sliding_window": 128,
              "model_type": "toy-swa",
              "layer_types": ["sliding_attention", "full_attention"] * 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    opts = RunOptions.from_mapping({"model_config": str(path), "kv_tokens": 4096})
    pc = policy_config(opts.sim_config(), 4096)
    assert pc.layout is not None and pc.layout.mix == "2 SWA w=128 + 2 full"


def test_pool_columns_by_hand() -> None:
    usage = {"full": PoolUsage("full", 1000, 500, 100, 30, 120),
             "mamba": PoolUsage("mamba", 4000, 4000, 0, 0, 0)}
    seconds = {"full": np.array([1000.0, 200.0]), "mamba": np.array([8000.0, 0.0])}
    cols = pool_columns(usage, seconds, span=4.0)
    assert cols["full_pool_used_pct"] == 25.0 and cols["full_pool_cached_pct"] == 5.0
    assert cols["full_pool_hit_rate"] == 0.25 and cols["mamba_pool_hit_rate"] == 0.0
    assert cols["mamba_pool_used_pct"] == 50.0 and cols["mamba_pool_capacity_bytes"] == 4000
    assert pool_column_names(cols) == ["full", "mamba"]
    assert not any(k.startswith("swa_") for k in cols)


def test_the_recorder_integrates_pool_bytes_inside_the_window() -> None:
    rec = Recorder(100, 1.0, 3.0, 0.0, 100)
    state = {"full": PoolUsage("full", 1000, 400, 100, 0, 0)}
    rec.pools = lambda: state
    parts = np.zeros(6)
    rec.add_interval(0.0, 2.0, parts, 0.0, 0, 0)  # 1 s inside the window
    state = {"full": PoolUsage("full", 1000, 800, 0, 0, 0)}
    rec.add_interval(2.0, 5.0, parts, 0.0, 0, 0)  # 1 s inside
    assert list(rec.pool_seconds["full"]) == [400.0 + 800.0, 100.0]


@pytest.mark.parametrize("bad", [
    dict(kind="swa", capacity_bytes=10, used_bytes=11, cached_bytes=0, hit_tokens=0,
         queried_tokens=0),
    dict(kind="swa", capacity_bytes=10, used_bytes=5, cached_bytes=6, hit_tokens=0,
         queried_tokens=0),
    dict(kind="swa", capacity_bytes=10, used_bytes=5, cached_bytes=0, hit_tokens=3,
         queried_tokens=2),
    dict(kind="kv", capacity_bytes=10, used_bytes=5, cached_bytes=0, hit_tokens=0,
         queried_tokens=0),
])
def test_pool_usage_rejects_impossible_figures(bad) -> None:
    with pytest.raises(ValueError, match="pool"):
        PoolUsage(**bad)


@pytest.mark.parametrize(("model", "version"), [("qwen3.5-4b", None), ("qwen3.5-4b", "0.19.0"),
                                                ("nemotron-nano-9b-v2", None),
                                                ("nemotron-nano-9b-v2", "0.11.0")])
def test_plan_and_run_read_the_same_rules(model: str, version: str | None) -> None:
    """`plan` and a `vllm` run of the same options (the KV memory given directly under
    vLLM's layout, kvsim issue 37 item 3) build the same blocks: block size, block count,
    mamba cache mode and the state bytes, by the version's rules."""
    from experiments.answers.planning import static_plan
    from simulator.run import build_policy

    flat = {"model": model, "policy": "vllm", "budget": "vllm", "kv_mem_gib": 9.1,
            "max_context_len": 32768}
    if version:
        flat["vllm_version"] = version
    opts = RunOptions.from_mapping(flat)
    p = static_plan(opts).hybrid
    cfg = opts.sim_config()
    pol = build_policy(cfg, 32768)
    assert p is not None
    assert (pol.page_size, pol.groups.num_blocks, pol.mamba_cache_mode) == (
        p.block_size, p.num_blocks, p.mamba_cache_mode)
    assert opts.resolved()["mamba_cache_mode"] == p.mamba_cache_mode
    assert opts.resolved()["vllm_version"] == (version or "0.31.0")
