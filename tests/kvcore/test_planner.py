"""Planner: the vLLM paper's Table 1, budget rules, fragmentation, recommendation."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvcore.planner import (
    BUDGET_RULES,
    internal_fragmentation,
    plan,
    recommend_page_size,
    resolve_kv_tokens,
)
from kvcore.presets import GiB, get_gpu, get_model


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "gib", "slots", "bytes_per_token"),
    [
        ("opt-13b", "a100-40gb", 1, 12, 15_728, 800 * 2**10),
        ("opt-66b", "a100-40gb", 4, 21, 9_557, int(2.25 * 2**20)),
        ("opt-175b", "a100-80gb", 8, 264, 60_074, int(4.5 * 2**20)),
    ],
)
def test_vllm_paper_table1(model, gpu, tp, gib, slots, bytes_per_token):
    r = plan(model, gpu, tp=tp, kv_dtype="fp16", kv_mem_gib=gib, page_size=1)
    assert r.kv_tokens == slots
    assert r.kv_bytes_per_token == bytes_per_token
    assert resolve_kv_tokens(model, gpu, tp, "fp16", kv_mem_gib=gib) == slots


def test_tokens_floor_to_pages_and_direct_options():
    r = plan("opt-66b", "a100-40gb", tp=4, kv_mem_gib=21, page_size=16)
    assert (r.kv_tokens, r.kv_pages, r.kv_tokens_unaligned) == (9_552, 597, 9_557)
    assert resolve_kv_tokens("llama-3.1-8b", "h100", kv_tokens=1000, page_size=16) == 992
    assert resolve_kv_tokens("llama-3.1-8b", "h100", num_gpu_blocks_override=50,
                             page_size=16) == 800
    with pytest.raises(ValueError, match="at most one"):
        plan("llama-3.1-8b", "h100", kv_tokens=10, kv_mem_gib=1)


def test_vllm_rule_formula_and_defaults():
    m, g = get_model("llama-3.1-8b"), get_gpu("h100")
    r = plan(m, g)
    expected = 0.9 * g.mem_bytes - m.weight_bytes() - 2.0 * GiB - 0.5 * GiB
    assert r.kv_budget_bytes == pytest.approx(expected)
    assert r.page_size == 16
    assert r.kv_tokens == int(expected // 131_072) // 16 * 16
    assert r.activation_peak_bytes == 2 * GiB and r.non_torch_bytes == 0.5 * GiB
    bigger = plan(m, g, activation_peak_gib=0.0, non_torch_gib=0.0, fraction=0.95)
    assert bigger.kv_tokens > r.kv_tokens


@pytest.mark.parametrize("rule", sorted(BUDGET_RULES))
def test_every_rule_gives_a_positive_page_aligned_pool(rule):
    r = plan("qwen2.5-7b", "a100-80gb", rule=rule)
    assert r.kv_tokens > 0 and r.kv_tokens % r.page_size == 0
    assert r.kv_budget_bytes < get_gpu("a100-80gb").mem_bytes
    assert r.fraction is not None and 0 < r.fraction <= 1


def test_sglang_classic_formula():
    m, g = get_model("llama-3.1-8b"), get_gpu("h100")
    r = plan(m, g, rule="sglang", fraction=0.85, non_torch_gib=1.0)
    free_after_load = g.mem_bytes - m.weight_bytes() - 1.0 * GiB
    assert r.kv_budget_bytes == pytest.approx(free_after_load - g.mem_bytes * 0.15)
    assert r.page_size == 1


def test_model_that_does_not_fit_says_by_how_much():
    with pytest.raises(ValueError, match=r"does not fit.*GiB per GPU short") as e:
        plan("llama-3.1-70b", "a100-40gb")
    short = float(str(e.value).split("; ")[1].split(" GiB")[0])
    assert 95 < short < 110
    with pytest.raises(ValueError, match=r"exceed .* by \d+\.\d+ GiB"):
        plan("opt-13b", "a100-40gb", kv_mem_gib=20)
    # the same model fits once split over enough GPUs
    assert plan("llama-3.1-70b", "a100-40gb", tp=8).kv_tokens > 0


def test_mla_and_tp_group_totals():
    r = plan("deepseek-v3", "h200", tp=8, rule="sglang")
    assert r.kv_bytes_per_token_per_rank == 70_272
    assert r.kv_bytes_per_token == 8 * 70_272
    assert any("MLA" in n for n in r.notes)
    assert r.weight_bytes == pytest.approx(671e9)  # fp8 weights


def test_outputs_json_concurrency_page_table():
    lengths = np.array([1, 16, 17, 100])
    r = plan("llama-3.1-8b", "h100", page_size=16, max_running_requests=8, context_len=4096,
             concurrency_contexts=[4096], lengths=lengths)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["kv_bytes_per_token"] == 131_072 and d["kv_tokens"] == r.kv_tokens
    assert d["req_to_token_bytes"] == 9 * 4096 * 4
    assert d["concurrency"][0]["max_requests"] == r.kv_pages // 256
    rows = {row["page_size"]: row for row in d["page_sizes"]}
    assert sorted(rows) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert rows[1]["mean_internal_frag_tokens"] == 0
    assert rows[16]["mean_internal_frag_tokens"] == pytest.approx((15 + 0 + 15 + 12) / 4)
    assert rows[16]["mean_page_table_entries"] == pytest.approx((1 + 1 + 2 + 7) / 4)
    assert internal_fragmentation(lengths, 256) == pytest.approx(
        np.mean(256 - lengths))
    assert any("sliding" in n for n in plan("mistral-7b", "h100").notes)


def test_recommend_page_size():
    df = pd.DataFrame({
        "page_size": [1, 4, 16, 32, 64, 128, 16, 32],
        "normalized_latency_s": [0.20, 0.12, 0.100, 0.101, 0.101, 0.104, 0.100, 0.101],
        "prefix_hit_rate": [0.50, 0.50, 0.495, 0.492, 0.48, 0.45, 0.495, 0.492],
    })
    rec = recommend_page_size(df)
    assert rec.page_size == 32 and rec.within_tolerance
    assert rec.best_latency_page_size == 16 and rec.best_hit_rate == pytest.approx(0.5)
    assert [row["page_size"] for row in rec.rows] == [1, 4, 16, 32, 64, 128]
    assert recommend_page_size(df, tolerance=0.05).page_size == 64
    with pytest.raises(ValueError, match="lack"):
        recommend_page_size(df.drop(columns=["prefix_hit_rate"]))


def test_plan_view_renders():
    from rich.console import Console

    from reports.plan_view import render_plan_all, render_recommendation

    console = Console(width=160, record=True)
    console.print(render_plan_all(plan("opt-13b", "a100-40gb", kv_mem_gib=12)))
    df = pd.DataFrame({"page_size": [1, 16], "normalized_latency_s": [0.2, 0.1],
                       "prefix_hit_rate": [0.5, 0.5]})
    console.print(render_recommendation(recommend_page_size(df)))
    text = console.export_text()
    assert "15,728" in text and "819,200 B" in text and "Recommended page size: 16" in text
