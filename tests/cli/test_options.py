"""RunOptions: one source of names and defaults, memory resolution, config hash."""

from __future__ import annotations

import json

import pytest

from kvcore.planner import resolve_kv_tokens
from kvcore.presets import MODELS, get_model
from simulator.options import DEFAULT_BUDGET, RunOptions


def test_defaults_resolve_to_a_budget_on_the_gpu_preset():
    o = RunOptions()
    cfg = o.to_sim_config()
    assert cfg.kv_tokens == resolve_kv_tokens("llama-3.1-8b", "h100", page_size=16,
                                              rule=DEFAULT_BUDGET)
    assert cfg.max_context_len == get_model("llama-3.1-8b").max_position
    assert o.to_workload_spec().max_context_len == cfg.max_context_len


def test_memory_options():
    assert RunOptions(kv_tokens=5000, page_size=16).to_sim_config().kv_tokens == 4992
    assert RunOptions(num_pages=10, page_size=16).to_sim_config().kv_tokens == 160
    # the vLLM paper's Table 1: OPT-13B, 12 GiB of KV -> 15,728 slots
    o = RunOptions(model="opt-13b", gpu="a100-40gb", kv_mem_gib=12, page_size=1)
    assert o.to_sim_config().kv_tokens == 15728
    assert o.to_sim_config().max_context_len == 2048  # OPT's maximum position
    big = RunOptions(budget="vllm", mem_fraction=0.9).to_sim_config().kv_tokens
    small = RunOptions(budget="vllm", mem_fraction=0.5).to_sim_config().kv_tokens
    assert big > small > 0


@pytest.mark.parametrize("kw, needle", [
    ({"kv_tokens": 10, "kv_mem_gib": 1.0}, "at most one"),
    ({"kv_tokens": 1000, "budget": "vllm"}, "--budget"),
    ({"policy": "nope"}, "--policy 'nope' is not one of"),
    ({"page_size": 0}, "--page-size"),
    ({"mem_fraction": 1.5}, "--mem-fraction"),
    ({"admission": "x"}, "--admission"),
])
def test_bad_options_name_the_option(kw, needle):
    with pytest.raises(ValueError, match=None) as e:
        RunOptions(**kw).to_sim_config()
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_from_mapping_accepts_dashes_and_alias_and_rejects_unknown():
    o = RunOptions.from_mapping({"page-size": 4, "num-gpu-blocks-override": 7})
    assert (o.page_size, o.num_pages) == (4, 7)
    with pytest.raises(ValueError, match="unknown option 'pagesize'"):
        RunOptions.from_mapping({"pagesize": 4})
    with pytest.raises(ValueError, match="--page-size must be int"):
        RunOptions.from_mapping({"page_size": "big"})


def test_config_hash_tracks_only_what_changes_results(tmp_path):
    a = RunOptions(kv_tokens=4096)
    assert a.config_hash() == RunOptions(kv_tokens=4096, out=str(tmp_path)).config_hash()
    assert a.config_hash() == RunOptions(kv_tokens=4096, check_invariants=True).config_hash()
    assert a.config_hash() != RunOptions(kv_tokens=4096, page_size=32).config_hash()
    assert a.config_hash() != RunOptions(kv_tokens=4096, seed=1).config_hash()
    # same pool however it is spelled
    assert a.config_hash() == RunOptions(num_pages=256).config_hash()


def test_model_config_is_registered(tmp_path):
    cfg = get_model("qwen2.5-7b").to_hf_config()
    cfg["_name_or_path"] = "org/My-Model"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    o = RunOptions(model_config=str(path), kv_tokens=4096)
    sc = o.to_sim_config()
    assert sc.model == "my-model" and "my-model" in MODELS
    assert MODELS["my-model"].kv_bytes_per_token() == get_model("qwen2.5-7b").kv_bytes_per_token()
    assert sc.max_context_len == cfg["max_position_embeddings"]
