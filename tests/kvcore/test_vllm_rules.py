"""vLLM's hybrid rules by version (kvcore.model.vllm_rules), the engines' state dtypes
(kvcore.model.state_dtypes), KV memory given directly under an engine's layout, and plan and run
reading the same rules. About 3 s."""

from __future__ import annotations

import pytest

from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.memory import MemorySpec
from kvcore.model.planner import model_layout, plan, resolve_kv_bytes
from kvcore.model.presets import GiB, get_model
from kvcore.model.state_dtypes import resolve_state_dtypes
from kvcore.model.vllm_rules import CHANGES, RULE_NAMES, parse_version, vllm_rules


def test_every_rule_has_a_value_from_the_first_version_and_a_source() -> None:
    first = vllm_rules("0.11.0")
    for name in RULE_NAMES:
        assert name in first.sources and "vllm/" in first.sources[name], name
    assert all(c.source and c.since >= (0, 11, 0, 0) for c in CHANGES)


@pytest.mark.parametrize(("version", "formula", "caching", "state", "align", "ratio"), [
    ("0.11.0", "blocks", False, "off", "fixed", 1.0),
    ("0.14", "blocks", False, "mamba2", "fixed", 1.25),
    ("0.19.0", "blocks", False, "modes", "fixed", 1.5),
    ("0.20.0", "blocks", False, "modes", "block_size", 1.5),
    ("0.20.1rc1.dev16+g7a1eb8ac2", "blocks", False, "modes", "block_size", 1.5),
    ("v0.20.1", "concurrency", False, "modes", "block_size", 1.5),
    ("0.24.0", "concurrency", False, "modes", "block_size", 1.5),
    ("0.26.0", "concurrency", True, "modes", "block_size", 1.5),
    ("0.31.2", "concurrency", True, "modes", "block_size", 1.5),
])
def test_rules_by_version(version, formula, caching, state, align, ratio) -> None:
    r = vllm_rules(version)
    assert (r.token_formula, r.hybrid_prefix_caching, r.state_prefix_caching,
            r.block_alignment, r.group_ratio) == (formula, caching, state, align, ratio)


@pytest.mark.parametrize("bad", ["0.10.2", "0.32.0", "1.0", "latest", "0.19.x"])
def test_versions_outside_the_rules_are_one_line_errors(bad: str) -> None:
    with pytest.raises(ValueError, match="--vllm-version") as e:
        parse_version(bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="--vllm-version"):
        MemorySpec(model="qwen3.5-4b", vllm_version=bad)


def test_mamba_cache_mode_and_state_pages_by_version() -> None:
    v11, v14, v19, v21, v22, now = (vllm_rules(v) for v in
                                   ("0.11.0", "0.14.0", "0.19.0", "0.21.0", "0.22.0", "0.31.0"))
    # defaults: prefix caching off for hybrids until v0.26
    assert [r.mamba_cache_mode(False) for r in (v11, v19, now)] == ["none", "none", "align"]
    assert now.mamba_cache_mode(True) == "all"  # Mamba-2 supports Mamba prefix caching
    assert v19.mamba_cache_mode(True, prefix_caching=True) == "all"
    assert v14.mamba_cache_mode(True, prefix_caching=True) == "all"
    assert v14.mamba_cache_mode(False, prefix_caching=True) == "none"  # GDN: caching off
    assert v11.mamba_cache_mode(True, prefix_caching=True) == "none"
    # speculative decoding: align from v0.20.1
    assert v19.mamba_cache_mode(True, True, speculative_tokens=3) == "all"
    assert v21.mamba_cache_mode(True, True, speculative_tokens=3) == "align"
    # a requested mode: checked against the version, "all" on GDN falls back to align
    assert now.mamba_cache_mode(False, requested="all") == "align"
    assert now.mamba_cache_mode(True, requested="none") == "none"
    with pytest.raises(ValueError, match=r"v0\.14\.0 has none"):
        v14.mamba_cache_mode(False, requested="align")
    # pages per request: none 1 (+ spec from v0.16), align 2 + spec, all cdiv(L, block)
    # (+ spec from v0.22)
    assert v11.state_pages("none", 1000, 100, 3) == 1
    assert v19.state_pages("none", 1000, 100, 3) == 4
    assert v19.state_pages("align", 1000, 100, 3) == 5
    assert v21.state_pages("all", 1000, 100, 3) == 10
    assert v22.state_pages("all", 1000, 100, 3) == 13


def test_fp8_kv_does_not_shrink_the_states() -> None:
    """kvsim issue 37: --kv-dtype fp8 applied to the GDN conv state gave Qwen3.5-35B-A3B a
    block of 2,080; vLLM sizes states by --mamba-cache-dtype (the model's bf16) and prints
    2,096. --mamba-cache-dtype fp16 and --mamba-ssm-cache-dtype bf16 are what change them."""
    r = plan(MemorySpec(model="qwen3.5-35b-a3b", kv_dtype="fp8", budget="vllm", kv_mem_gib=10))
    assert r.hybrid is not None and r.hybrid.block_size == 2096
    assert r.state_bytes_per_request == 30 * 2_146_304
    half = plan(MemorySpec(model="qwen3.5-35b-a3b", kv_dtype="fp8", budget="vllm",
                           kv_mem_gib=10, mamba_ssm_cache_dtype="bf16"))
    assert half.state_bytes_per_request == 30 * (3 * 8192 * 2 + 32 * 128 * 128 * 2)


def test_state_dtypes_per_engine() -> None:
    v11, now = vllm_rules("0.11.0"), vllm_rules()

    def dtypes(model, engine, rules, **kw):
        g = resolve_state_dtypes(LAYOUTS[model], engine, rules, **kw).state_groups()[0]
        return g.conv_dtype, g.state_dtype

    # vLLM: Qwen3.5 takes the config's float32; Qwen3-Next keeps the conv state's bf16;
    # Nemotron-H float32 from v0.13 (bf16 before)
    assert dtypes("qwen3.5-4b", "vllm", now) == ("bf16", "fp32")
    assert dtypes("qwen3-next-80b-a3b", "vllm", now) == ("bf16", "bf16")
    assert dtypes("nemotron-nano-9b-v2", "vllm", now) == ("bf16", "fp32")
    assert dtypes("nemotron-nano-9b-v2", "vllm", v11) == ("bf16", "bf16")
    assert dtypes("qwen3.5-4b", "vllm", now, cache_dtype="fp16") == ("fp16", "fp32")
    assert dtypes("qwen3-next-80b-a3b", "vllm", now, cache_dtype="fp32") == ("fp32", "fp32")
    # SGLang: bf16 conv, float32 recurrent unless the config or --mamba-ssm-dtype says
    assert dtypes("qwen3-next-80b-a3b", "sglang", now) == ("bf16", "fp32")
    assert dtypes("qwen3.5-4b", "sglang", now, ssm_dtype="bf16") == ("bf16", "bf16")


def test_state_options_apply_to_hybrids_only() -> None:
    for kw in ({"vllm_version": "0.19.0"}, {"mamba_cache_dtype": "fp32"},
               {"mamba_ssm_cache_dtype": "bf16"}):
        with pytest.raises(ValueError, match=r"applies to hybrid models; llama-3\.1-8b"):
            MemorySpec(model="llama-3.1-8b", **kw)


def test_kv_memory_given_directly_under_an_engines_layout() -> None:
    """`--budget vllm|sglang --kv-mem-gib X` (or --kv-cache-memory-bytes per GPU): the rule
    names the layout, the number replaces the rule's computation (kvsim issue 37 item 3)."""
    v = MemorySpec(model="qwen3.5-4b", budget="vllm", kv_mem_gib=9.1, max_context_len=32768)
    s = MemorySpec(model="qwen3.5-4b", budget="sglang", kv_mem_gib=9.1)
    b = MemorySpec(model="qwen3.5-4b", budget="vllm", kv_cache_memory_bytes=int(9.1 * GiB),
                   max_context_len=32768)
    assert (v.engine, s.engine, b.engine) == ("vllm", "sglang", "vllm")
    pv, ps, pb = plan(v), plan(s), plan(b)
    assert pv.kv_budget_bytes_per_rank == pytest.approx(9.1 * GiB)
    assert pv.hybrid.engine == "vllm" and ps.hybrid.engine == "sglang"
    assert pv.hybrid.kv_cache_tokens == 267_842 and pv.hybrid.num_blocks == 564
    assert pb.hybrid.num_blocks == 564
    # tp 2: --kv-mem-gib is the group's, --kv-cache-memory-bytes one GPU's
    assert resolve_kv_bytes(MemorySpec(model="qwen3.5-4b", kv_mem_gib=2, tp=2)) == GiB
    assert resolve_kv_bytes(MemorySpec(model="qwen3.5-4b", kv_cache_memory_bytes=GiB,
                                       tp=2)) == GiB
    for bad in ({"kv_tokens": 1000, "budget": "vllm"}, {"kv_mem_gib": 1, "mem_fraction": 0.5},
                {"kv_mem_gib": 1, "kv_cache_memory_bytes": 10}):
        with pytest.raises(ValueError) as e:
            MemorySpec(model="qwen3.5-4b", **bad)
        assert "\n" not in str(e.value)


def test_the_plans_layout_is_the_engines() -> None:
    m = get_model("qwen3-next-80b-a3b")
    v = model_layout(MemorySpec(model=m.id, budget="vllm"), m)
    s = model_layout(MemorySpec(model=m.id, budget="sglang"), m)
    assert v is not None and s is not None
    assert v.state_groups()[0].state_dtype == "bf16" and s.state_groups()[0].state_dtype == "fp32"
