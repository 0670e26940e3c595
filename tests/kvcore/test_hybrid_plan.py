"""vLLM's and SGLang's layouts of hybrid models (kvcore.model.hybrid_plan) and the planner's hybrid
fields: the block-size rule as a property, worked examples by hand. About 2 s."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcore.model.hybrid_plan import kv_waste_as_full, sglang_plan, vllm_block_size, vllm_plan
from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.layers import FULL, LINEAR, MAMBA, SLIDING, HybridLayout, LayerGroup
from kvcore.model.memory import MemorySpec
from kvcore.model.planner import plan
from kvcore.model.presets import GiB
from kvcore.model.state_dtypes import resolve_state_dtypes
from kvcore.model.vllm_rules import vllm_rules

GIB10 = 10 * GiB
V11, V19 = vllm_rules("0.11.0"), vllm_rules("0.19.0")


def as_vllm(model: str, version: str = "0.31.0") -> HybridLayout:
    """The preset's layout with its states as that vLLM version stores them."""
    return resolve_state_dtypes(LAYOUTS[model], "vllm", vllm_rules(version))


def test_published_block_sizes():
    q = vllm_block_size(LAYOUTS["qwen3.5-4b"])
    # attention 2 x 4 x 256 x 2 = 4,096 B per token; GDN page 2,146,304 B -> 16 x 33 = 528
    assert (q.block_size, q.attn_page_bytes, q.mamba_page_bytes) == (528, 2_162_688, 2_146_304)
    assert round(q.padding_pct, 2) == 0.76
    # Nemotron-H under v0.11 keeps its recurrent state in bf16: 2,695,168 / 4,096 = 658 -> 672
    # (vllm #24280); from v0.13 in fp32: 5,316,608 / 4,096 = 1,298 -> 1,312, and in mode
    # "all" a multiple of the SSD chunk (128): 1,408
    n = vllm_block_size(as_vllm("nemotron-nano-9b-v2", "0.11.0"), rules=V11)
    assert n.block_size == 672 and n.raised
    assert vllm_block_size(as_vllm("nemotron-nano-9b-v2")).block_size == 1312
    assert vllm_block_size(as_vllm("nemotron-nano-9b-v2"),
                           mamba_cache_mode="all").block_size == 1408
    assert vllm_block_size(as_vllm("nemotron-nano-9b-v2", "0.11.0"), requested=1024,
                           rules=V11).block_size == 1024
    assert not vllm_block_size(LAYOUTS["gpt-oss-20b"]).raised  # no state: 16 stays


@given(st.integers(1, 64), st.integers(1, 512), st.integers(2, 6), st.integers(1, 64),
       st.sampled_from([8, 16, 32, 64]), st.none() | st.integers(1, 4096))
def test_block_rule_attention_page_covers_mamba_page_minimally(kvh, hd, kernel, heads, align,
                                                                requested):
    layout = HybridLayout((
        LayerGroup(FULL, 1, kv_heads=kvh, head_dim=hd),
        LayerGroup(MAMBA, 3, num_v_heads=heads, v_head_dim=16, k_head_dim=16, n_groups=1,
                   conv_kernel=kernel)))
    r = vllm_block_size(layout, requested=requested, alignment=align, rules=V19)
    per_token = 2 * kvh * hd * 2
    assert r.attn_page_bytes == r.block_size * per_token >= r.mamba_page_bytes
    assert r.padding_pct == pytest.approx(
        100 * (r.attn_page_bytes - r.mamba_page_bytes) / r.mamba_page_bytes)
    if r.raised:  # a multiple of the alignment, and the smallest one that covers the state
        assert r.block_size % align == 0
        assert (r.block_size - align) * per_token < r.mamba_page_bytes
    else:
        assert r.block_size == requested


@given(st.integers(1, 8), st.integers(1, 256), st.integers(1, 16),
       st.none() | st.integers(1, 4096))
def test_block_alignment_from_v0_20_is_the_block_size_in_effect(kvh, hd, heads, requested):
    """From v0.20 (vllm/platforms/interface.py) the alignment is max(16, the block size in
    effect), so a requested block below the state's need is raised to a multiple of itself
    (of 16 when smaller), and one at or above it is kept."""
    layout = HybridLayout((
        LayerGroup(FULL, 1, kv_heads=kvh, head_dim=hd),
        LayerGroup(MAMBA, 3, num_v_heads=heads, v_head_dim=16, k_head_dim=16, n_groups=1,
                   conv_kernel=4)))
    r = vllm_block_size(layout, requested=requested)
    align = max(16, requested or 16)
    if r.raised:
        assert r.block_size % align == 0
        assert (r.block_size - align) * 2 * kvh * hd * 2 < r.mamba_page_bytes
    else:
        assert r.block_size == requested and requested * 2 * kvh * hd * 2 >= r.mamba_page_bytes


def test_vllm_groups_by_hand():
    # gpt-oss-20b: 12 SWA (w=128) + 12 full, 8 KV heads x 64: page 16 x 2,048 = 32,768 B,
    # group size 12, 10 GiB // (32,768 x 12) = 27,306 blocks; 2 groups -> 27,306 // 2 x 16
    p = vllm_plan(LAYOUTS["gpt-oss-20b"], GIB10, 8192, max_num_batched_tokens=8192, rules=V19)
    assert p.block_size == 16 and p.pools[0].pages == 27_306
    assert p.kv_cache_tokens == 27_306 // 2 * 16 == 218_448
    # a request of 8,192: full 512 pages + sliding cdiv(min(127 + 8,192, 8,192), 16) + 1 = 513
    assert p.max_concurrency == pytest.approx(27_306 / 1025)
    assert "GPU KV cache size: 218,448 tokens" in p.log
    # every layer as full attention: 10 GiB // (16 x 2,048 x 24) pages of 16
    assert p.baseline_tokens == GIB10 // (16 * 2048 * 24) * 16
    # from v0.20.1 the token figure is int(concurrency x max_model_len): 27,306 / 1,025 x 8,192
    c = vllm_plan(LAYOUTS["gpt-oss-20b"], GIB10, 8192, rules=vllm_rules("0.20.1"))
    assert c.kv_cache_tokens == int(27_306 / 1025 * 8192) == 218_234
    assert vllm_plan(LAYOUTS["gpt-oss-20b"], GIB10, 8192,
                     rules=vllm_rules("0.20.1rc1.dev16+g7a1eb8ac2")).kv_cache_tokens == 218_448


def test_vllm_padding_layers_and_state_pages():
    p = vllm_plan(as_vllm("nemotron-nano-9b-v2", "0.11.0"), GIB10, 4096, rules=V11)
    # 27 Mamba + 4 full: group size 4, 7 Mamba groups (1 padding layer) + 1 full group
    assert "Add 1 padding layers, may waste at most 3.70% KV cache memory" in p.log
    blocks = GIB10 // (672 * 4096 * 4)
    assert p.pools[0].pages == blocks and p.kv_cache_tokens == blocks // 8 * 672
    # per request: 7 Mamba groups x 1 page + cdiv(4,096, 672) = 7 full pages
    assert p.max_concurrency == pytest.approx(blocks / 14)


def test_qwen35_4b_current_and_legacy_report():
    """kvsim issue 37's example: Qwen3.5-4B, 9.1 GiB, max_model_len 32,768. One block id is
    8 layers x 2,162,688 B: 564 blocks. v0.19 (prefix caching off by default for hybrids,
    mode none, one state page per group): 564 / (63 + 3) = 8.55x and 564 // 4 x 528 tokens;
    v0.31 (on, mode align, two state pages per group): 564 / (63 + 6) = 8.17x and
    int(8.17... x 32,768) tokens, 3.6 times as many."""
    budget = 9.1 * GiB
    old = vllm_plan(LAYOUTS["qwen3.5-4b"], budget, 32768, rules=V19)
    new = vllm_plan(LAYOUTS["qwen3.5-4b"], budget, 32768)
    assert old.num_blocks == new.num_blocks == 564
    assert (old.mamba_cache_mode, old.prefix_caching) == ("none", False)
    assert (new.mamba_cache_mode, new.prefix_caching) == ("align", True)
    assert old.kv_cache_tokens == 564 // 4 * 528 == 74_448
    assert old.max_concurrency == pytest.approx(564 / 66)
    assert new.max_concurrency == pytest.approx(564 / 69)
    assert new.kv_cache_tokens == int(564 / 69 * 32768) == 267_842
    # prefix caching given on v0.19 gives align's pages, the legacy token figure
    on = vllm_plan(LAYOUTS["qwen3.5-4b"], budget, 32768, rules=V19, prefix_caching=True)
    assert on.mamba_cache_mode == "align" and on.max_concurrency == pytest.approx(564 / 69)
    assert on.kv_cache_tokens == 74_448


def test_fp8_kv_leaves_the_state_dtype_alone():
    """Qwen3.5-35B-A3B with fp8 KV: one attention token is 2 x 2 x 256 x 1 = 1,024 B; the GDN
    state stays bf16 conv (3 x 8,192 x 2 B) + fp32 recurrent (32 x 128 x 128 x 4 B) =
    2,146,304 B, so the block is 16 x cdiv(2,146,304, 16,384) = 2,096 with no padding (vLLM
    prints 2,096; an fp8 conv state would give 2,080)."""
    r = vllm_block_size(as_vllm("qwen3.5-35b-a3b"), kv_dtype="fp8")
    assert (r.block_size, r.mamba_page_bytes, r.padding_pct) == (2096, 2_146_304, 0.0)


def test_sglang_swa_and_mamba_pools_by_hand():
    # gemma-2-9b: full 21 x 8,192 B, SWA 21 x 8,192 B per token; r = 0.8
    p = sglang_plan(LAYOUTS["gemma-2-9b"], GIB10, 8192)
    cell = 21 * 8192 + 0.8 * 21 * 8192
    full = int(GIB10 // cell)
    assert p.kv_cache_tokens == full
    assert [x.tokens for x in p.pools] == [int(full * 0.8), full]
    # qwen3.5-4b: a state pool of 10 GiB x 0.9 / 1.9 bytes in requests of 24 x 2,146,304 B
    q = sglang_plan(LAYOUTS["qwen3.5-4b"], GIB10, 8192, max_running_requests=1000)
    slots = int(GIB10 * 0.9 / 1.9 // (24 * 2_146_304))
    # the running cap: 3 slots per running request with the radix cache (SGLang v0.5), 1
    # without it (the chunk cache)
    assert q.pools[0].pages == slots and q.running_request_cap == slots // 3
    chunk = sglang_plan(LAYOUTS["qwen3.5-4b"], GIB10, 8192, max_running_requests=1000,
                        radix_cache=False)
    assert chunk.running_request_cap == slots
    assert q.kv_cache_tokens == int((GIB10 - slots * 24 * 2_146_304) // (8 * 4096))
    fixed = sglang_plan(LAYOUTS["qwen3.5-4b"], GIB10, 8192, max_mamba_cache_size=10)
    assert fixed.pools[0].pages == 10
    with pytest.raises(ValueError, match="swa_full_tokens_ratio"):
        sglang_plan(LAYOUTS["gemma-2-9b"], GIB10, 8192, swa_full_tokens_ratio=0)


def test_rfc_11382_waste():
    assert kv_waste_as_full(LAYOUTS["gemma-2-9b"], 8192) == 0.25  # half the layers, half ctx
    assert kv_waste_as_full(LAYOUTS["ministral-8b"], 131_072) == 0.5625  # 3/4 x 3/4
    assert kv_waste_as_full(LAYOUTS["ministral-8b"], 32_768) == 0.0  # window = context


def test_planner_json_fields_for_hybrids_only():
    r = plan(MemorySpec(model="qwen3.5-4b", gpu="h100", budget="vllm"))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["block_size"] == 528 and d["hybrid_engine"] == "vllm"
    # one key answers how many tokens fit: the engine's figure; the all-full baseline is named
    assert d["kv_tokens"] == r.hybrid.kv_cache_tokens > 0 and d["max_concurrency"] > 0
    assert d["baseline_kv_tokens"] == r.kv_tokens and "kv_cache_tokens" not in d
    assert not {"baseline_tokens", "kv_pages", "concurrency", "page_sizes"} & set(d)
    assert d["attention_kv_bytes_per_token"] == 8 * 4096
    assert d["state_bytes_per_request"] == 24 * 2_146_304
    assert d["vllm_version"] == "0.31.0" and d["mamba_cache_mode"] == "align"
    assert {p["kind"] for p in d["pools"]} == {LINEAR, FULL}
    assert set(d["pools"][0]) == {"kind", "layers", "page_bytes", "pages", "tokens", "note"}
    assert d["layer_mix"] == "24 linear-attention (GDN) + 8 full"
    s = plan(MemorySpec(model="gpt-oss-20b", gpu="h100", budget="sglang")).to_dict()
    assert s["hybrid_engine"] == "sglang" and {p["kind"] for p in s["pools"]} == {SLIDING, FULL}
    assert s["max_running_requests"] == 256  # the plan's batch limit, not overwritten
    assert d["max_running_requests"] == 256 and d["running_request_cap"] is None
    full = plan(MemorySpec(model="llama-3.1-8b", gpu="h100", budget="vllm")).to_dict()
    assert not {"block_size", "pools", "kv_cache_tokens", "layer_mix", "hybrid",
                "baseline_kv_tokens", "state_bytes_per_request"} & set(full)


def test_planner_reads_a_hybrid_model_config(tmp_path):
    from tests.kvcore.test_layers import QWEN35_4B_CONFIG

    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN35_4B_CONFIG))
    r = plan(MemorySpec(model_config=str(path), gpu="h100", budget="vllm"))
    assert r.hybrid is not None and r.hybrid.block_size == 528


@pytest.mark.parametrize("model", ["qwen3.5-4b", "nemotron-nano-9b-v2"])
def test_sglang_plan_and_policy_run_mamba_hybrids_at_page_size_1(model):
    """SGLang v0.5's Mamba radix cache runs page size 1 only, so `kvsim plan --budget sglang`
    prints block 1 for a Mamba / linear-attention hybrid (not the planner's page size 16),
    and the `paged` policy built at that page size from the same budget holds exactly the
    plan's full-attention tokens; at 16 the policy refuses, naming the rule."""
    from kvcore.policies import PolicyConfig, make_policy

    r = plan(MemorySpec(model=model, gpu="h100", budget="sglang"), page_size=16)  # the CLI
    assert r.hybrid is not None and r.hybrid.block_size == 1
    assert any("page size 1" in n for n in r.notes)
    cfg = PolicyConfig(kv_tokens=0, page_size=r.hybrid.block_size, max_context_len=4096,
                       max_requests=8, layout=LAYOUTS[model],
                       kv_bytes=int(r.kv_budget_bytes_per_rank))
    assert make_policy("paged", cfg).capacity == r.hybrid.kv_cache_tokens
    with pytest.raises(ValueError, match="needs page size 1"):
        make_policy("paged", dataclasses.replace(cfg, page_size=16))
    gpt = plan(MemorySpec(model="gpt-oss-20b", gpu="h100", budget="sglang"), page_size=16)
    assert gpt.hybrid is not None and gpt.hybrid.block_size == 16  # no state layers: kept
