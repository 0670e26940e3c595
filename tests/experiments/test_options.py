"""RunOptions: composed of one spec per concern, one name per option (aliases accepted), each
field validated by its owner, memory resolution, the generic SimConfig, the config hash."""

from __future__ import annotations

import json

import pytest

from experiments.options.config_file import load_config, options_from
from experiments.options.run_options import ALIASES, IMPLIED, OPTIONS, SPECS, RunOptions
from kvcore.model.memory import DEFAULT_BUDGET, HYBRID_MEMORY_OPTIONS, MemorySpec
from kvcore.model.planner import resolve_kv_tokens
from kvcore.model.presets import MODELS, get_model
from simulator.config import FLAT_FIELDS
from simulator.hybrid import HYBRID_OPTIONS
from simulator.shared_tier import SHARED_OPTIONS
from simulator.specs import EngineSpec, PolicySpec
from workloads.spec import WorkloadSpec

# SimConfig fields no option sets: engine internals, left at the engine's defaults
ENGINE_INTERNALS = {"check_every", "max_timeline_rows", "new_token_ratio_init",
                    "new_token_ratio_min", "new_token_ratio_decay", "vllm_watermark",
                    "max_steps_per_stretch", "max_stalled_preemptions"}


def opts(**values) -> RunOptions:
    return RunOptions.from_mapping(values)


def test_defaults_resolve_to_a_budget_on_the_gpu_preset():
    o = RunOptions()
    cfg = o.sim_config()
    assert cfg.pool.kv_tokens == resolve_kv_tokens(MemorySpec(budget=DEFAULT_BUDGET), 16)
    assert cfg.pool.max_context_len == get_model("llama-3.1-8b").max_position
    assert o.workload_spec().max_context_len == cfg.pool.max_context_len


def test_memory_options():
    assert opts(kv_tokens=5000, page_size=16).sim_config().pool.kv_tokens == 4992
    assert opts(num_pages=10, page_size=16).sim_config().pool.kv_tokens == 160
    # the vLLM paper's Table 1: OPT-13B, 12 GiB of KV -> 15,728 slots
    o = opts(model="opt-13b", gpu="a100-40gb", kv_mem_gib=12, page_size=1)
    assert o.sim_config().pool.kv_tokens == 15728
    assert o.sim_config().pool.max_context_len == 2048  # OPT's maximum position
    big = opts(budget="vllm", mem_fraction=0.9).sim_config().pool.kv_tokens
    small = opts(budget="vllm", mem_fraction=0.5).sim_config().pool.kv_tokens
    assert big > small > 0


@pytest.mark.parametrize("kw, needle", [
    ({"kv_tokens": 10, "kv_mem_gib": 1.0}, "at most one"),
    ({"kv_tokens": 1000, "budget": "vllm"}, "--budget"),
    ({"policy": "nope"}, "--policy 'nope' is not one of"),
    ({"page_size": 0}, "--page-size"),
    ({"mem_fraction": 1.5}, "--mem-fraction"),
    ({"admission": "x"}, "--admission"),
    ({"think_time_s": -1.0}, "--think-time-s"),
    ({"num_pages": 1 << 30, "page_size": 4}, "--num-pages"),
])
def test_bad_options_name_the_option(kw, needle):
    with pytest.raises(ValueError) as e:
        opts(**kw)
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_each_spec_validates_its_own_fields():
    """A field is checked by the class that owns it, whoever builds it."""
    for build, needle in ((lambda: PolicySpec(page_size=0), "--page-size"),
                          (lambda: EngineSpec(schedule="lifo"), "--schedule"),
                          (lambda: MemorySpec(tp=0), "--tp"),
                          (lambda: WorkloadSpec(num_turns=0), "--num-turns")):
        with pytest.raises(ValueError, match=needle):
            build()


def test_from_mapping_accepts_dashes_and_aliases_and_rejects_unknown():
    o = RunOptions.from_mapping({"page-size": 4, "num-gpu-blocks-override": 7})
    assert (o.policy.page_size, o.memory.num_pages) == (4, 7)
    old = RunOptions.from_mapping({"think_time": 2.0, "duration": 30, "level-interval": 1.0,
                                   "warmup": 1.0, "timeline_interval": 0.5})
    assert (old.workload.think_time_s, old.workload.duration_s, old.workload.level_interval_s,
            old.engine.warmup_s, old.engine.timeline_interval_s) == (2.0, 30.0, 1.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="unknown option 'pagesize'"):
        RunOptions.from_mapping({"pagesize": 4})
    with pytest.raises(ValueError, match="--page-size must be int"):
        RunOptions.from_mapping({"page_size": "big"})


def test_one_name_per_option_and_every_alias_is_an_old_or_engine_spelling():
    names = [o.name for o in OPTIONS.values()]
    assert len(names) == len(set(names))
    assert not set(ALIASES) & set(OPTIONS)
    expected = {"num_gpu_blocks_override": "num_pages", "duration": "duration_s",
                "think_time": "think_time_s", "level_interval": "level_interval_s",
                "warmup": "warmup_s", "timeline_interval": "timeline_interval_s",
                # the engines' own names (vLLM, SGLang)
                "block_size": "page_size", "max_num_seqs": "max_running_requests",
                "gpu_memory_utilization": "mem_fraction",
                "mem_fraction_static": "mem_fraction",
                "engine_version": "vllm_version", "mamba_ssm_dtype": "mamba_ssm_cache_dtype",
                # SLO targets at a percentile (they imply --slo-percentile)
                **{f"slo_{m}_p{p}": f"slo_{m}" for m in ("ttft", "tpot") for p in (99, 90, 50)}}
    assert expected == ALIASES
    assert {"gpu_memory_utilization": {"budget": "vllm"},
                       "mem_fraction_static": {"budget": "sglang"},
                       **{f"slo_{m}_p{p}": {"slo_percentile": float(p)}
                          for m in ("ttft", "tpot") for p in (99, 90, 50)}} == IMPLIED
    assert list(SPECS) == ["workload", "policy", "memory", "engine", "tier", "fleet",
                           "output"]


def test_sim_config_is_built_from_the_options_by_name():
    """Every SimConfig field is an option or an engine internal: a new engine knob that users
    should set shows up here."""
    sim = set(FLAT_FIELDS)
    # kv_bytes: the pool's budget in bytes, resolved from the memory options (hybrids only)
    assert sim - set(OPTIONS) == ENGINE_INTERNALS | {"kv_bytes"}
    # a full-attention model's columns have no hybrid option, a run without a shared tier
    # none of its options (simulator/shared_tier.py)
    sim -= {"kv_bytes", *HYBRID_OPTIONS, *HYBRID_MEMORY_OPTIONS, *SHARED_OPTIONS}
    assert not {*HYBRID_OPTIONS, *HYBRID_MEMORY_OPTIONS, *SHARED_OPTIONS} & set(
        opts().resolved())
    sim -= {"engine"}  # a column only under --engine (experiments/options/engines.py)
    assert "engine" not in opts().resolved() and opts(engine="vllm").resolved()["engine"]
    o = opts(kv_tokens=4096, warmup_s=3.0, duration_s=50.0, timeline_interval_s=0.25,
             admission="vllm", eviction="lfu", seed=9)
    flat = o.sim_config().to_dict()
    resolved = o.resolved()
    for name in sim - ENGINE_INTERNALS:
        assert flat[name] == resolved[name], name
    assert opts().sim_config().duration_s == 0.0  # no --duration-s: SimConfig's default


def test_workload_spec_takes_the_runs_seed_and_context():
    w = opts(seed=7, max_context_len=4096).workload_spec()
    assert (w.seed, w.max_context_len) == (7, 4096)


def test_config_hash_tracks_only_what_changes_results(tmp_path):
    a = opts(kv_tokens=4096)
    assert a.config_hash() == opts(kv_tokens=4096, out=str(tmp_path)).config_hash()
    assert a.config_hash() == opts(kv_tokens=4096, check_invariants=True).config_hash()
    assert a.config_hash() != opts(kv_tokens=4096, page_size=32).config_hash()
    assert a.config_hash() != opts(kv_tokens=4096, seed=1).config_hash()
    # same pool however it is spelled
    assert a.config_hash() == opts(num_pages=256).config_hash()


def test_model_config_is_registered(tmp_path):
    cfg = get_model("qwen2.5-7b").to_hf_config()
    cfg["_name_or_path"] = "org/My-Model"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    o = opts(model_config=str(path), kv_tokens=4096)
    sc = o.sim_config()
    assert sc.pool.model == "my-model" and "my-model" in MODELS
    assert MODELS["my-model"].kv_bytes_per_token() == get_model("qwen2.5-7b").kv_bytes_per_token()
    assert sc.pool.max_context_len == cfg["max_position_embeddings"]


def test_config_file_under_the_command_line(tmp_path):
    toml = tmp_path / "exp.toml"
    toml.write_text('think-time = 1.5\npage_size = [4, 8]\npolicy = "vllm"\n')
    o, extras = options_from(toml, {"policy": "paged"})
    assert (o.workload.think_time_s, o.policy.policy) == (1.5, "paged")
    assert extras == {"page_size": [4, 8]}
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps({"options": {"duration": 9.0, "out": "elsewhere"}}))
    assert load_config(saved) == {"duration": 9.0}
    with pytest.raises(ValueError, match="not valid TOML"):
        (tmp_path / "bad.toml").write_text("page_size = = 3")
        load_config(tmp_path / "bad.toml")
