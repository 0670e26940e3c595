"""Planner: the vLLM paper's Table 1, budget rules, fragmentation; MemorySpec's checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvcore.model.memory import BUDGET_RULES, MemorySpec
from kvcore.model.planner import internal_fragmentation, plan, resolve_kv_tokens
from kvcore.model.presets import GiB, get_gpu, get_model


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "gib", "slots", "bytes_per_token"),
    [
        ("opt-13b", "a100-40gb", 1, 12, 15_728, 800 * 2**10),
        ("opt-66b", "a100-40gb", 4, 21, 9_557, int(2.25 * 2**20)),
        ("opt-175b", "a100-80gb", 8, 264, 60_074, int(4.5 * 2**20)),
    ],
)
def test_vllm_paper_table1(model, gpu, tp, gib, slots, bytes_per_token):
    mem = MemorySpec(model=model, gpu=gpu, tp=tp, kv_dtype="fp16", kv_mem_gib=gib)
    r = plan(mem, page_size=1)
    assert r.kv_tokens == slots
    assert r.kv_bytes_per_token == bytes_per_token
    assert resolve_kv_tokens(mem) == slots


def test_tokens_floor_to_pages_and_direct_options():
    r = plan(MemorySpec(model="opt-66b", gpu="a100-40gb", tp=4, kv_mem_gib=21), page_size=16)
    assert (r.kv_tokens, r.kv_pages, r.kv_tokens_unaligned) == (9_552, 597, 9_557)
    assert resolve_kv_tokens(MemorySpec(kv_tokens=1000), page_size=16) == 992
    n = plan(MemorySpec(num_pages=50), page_size=16)
    assert (n.kv_tokens, n.budget_rule) == (800, "num_pages")
    assert resolve_kv_tokens(MemorySpec(num_pages=50), page_size=16) == 800
    # the spec refuses two sizes, or a size and a rule, before anything is planned
    with pytest.raises(ValueError, match="at most one"):
        MemorySpec(kv_tokens=10, kv_mem_gib=1)
    with pytest.raises(ValueError, match="--budget"):
        MemorySpec(kv_tokens=10, budget="vllm")


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("tp", 0, "--tp"), ("budget", "tgi", "--budget 'tgi' is not one of"),
    ("mem_fraction", 1.5, "--mem-fraction"), ("gpu_mem_gib", 0.0, "--gpu-mem-gib"),
    ("activation_peak_gib", -1.0, "--activation-peak-gib"), ("kv_dtype", "int3", "--kv-dtype"),
    ("model", "gpt-5", "--model"), ("kv_mem_gib", float("nan"), "--kv-mem-gib"),
])
def test_memory_spec_checks_each_field_once(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        MemorySpec(**{field: value})
    assert MemorySpec(model="OPT-13B").model_preset().id == "opt-13b"  # case, aliases


def test_vllm_rule_formula_and_defaults():
    m, g = get_model("llama-3.1-8b"), get_gpu("h100")
    vllm = MemorySpec(model=m.id, gpu=g.id, budget="vllm")
    r = plan(vllm)
    expected = 0.9 * g.mem_bytes - m.weight_bytes() - 2.0 * GiB - 0.5 * GiB
    assert r.kv_budget_bytes == pytest.approx(expected)
    assert r.page_size == 16
    assert r.kv_tokens == int(expected // 131_072) // 16 * 16
    assert r.activation_peak_bytes == 2 * GiB and r.non_torch_bytes == 0.5 * GiB
    bigger = plan(MemorySpec(model=m.id, gpu=g.id, budget="vllm", activation_peak_gib=0.0,
                             non_torch_gib=0.0, mem_fraction=0.95))
    assert bigger.kv_tokens > r.kv_tokens


@pytest.mark.parametrize("rule", sorted(BUDGET_RULES))
def test_every_rule_gives_a_positive_page_aligned_pool(rule):
    r = plan(MemorySpec(model="qwen2.5-7b", gpu="a100-80gb", budget=rule))
    assert r.kv_tokens > 0 and r.kv_tokens % r.page_size == 0
    assert r.kv_budget_bytes < get_gpu("a100-80gb").mem_bytes
    assert r.fraction is not None and 0 < r.fraction <= 1


def test_sglang_classic_formula():
    m, g = get_model("llama-3.1-8b"), get_gpu("h100")
    r = plan(MemorySpec(model=m.id, gpu=g.id, budget="sglang", mem_fraction=0.85,
                        non_torch_gib=1.0))
    free_after_load = g.mem_bytes - m.weight_bytes() - 1.0 * GiB
    assert r.kv_budget_bytes == pytest.approx(free_after_load - g.mem_bytes * 0.15)
    assert r.page_size == 1


def test_model_that_does_not_fit_says_by_how_much():
    with pytest.raises(ValueError, match=r"does not fit.*GiB per GPU short") as e:
        plan(MemorySpec(model="llama-3.1-70b", gpu="a100-40gb", budget="vllm"))
    short = float(str(e.value).split("; ")[1].split(" GiB")[0])
    assert 95 < short < 110
    with pytest.raises(ValueError, match=r"exceed .* by \d+\.\d+ GiB"):
        plan(MemorySpec(model="opt-13b", gpu="a100-40gb", kv_mem_gib=20))
    # the same model fits once split over enough GPUs
    assert plan(MemorySpec(model="llama-3.1-70b", gpu="a100-40gb", tp=8)).kv_tokens > 0


def test_a_pool_smaller_than_one_page_names_the_pool_and_the_page():
    """A direct size below one page is the pool's fault, not the GPU's: the error names the
    size given and the page, and suggests no more GPUs (issue 38, item 10)."""
    with pytest.raises(ValueError) as e:
        plan(MemorySpec(kv_tokens=10), page_size=16)
    msg = str(e.value)
    assert msg.startswith("--kv-tokens 10 is smaller than one 16-token page")
    assert "GPU" not in msg and "tp" not in msg and "\n" not in msg
    with pytest.raises(ValueError, match=r"^--kv-mem-gib 0.0001 is .* smaller than one "
                                         r"16-token page of llama-3.1-8b"):
        plan(MemorySpec(kv_mem_gib=0.0001), page_size=16)
    with pytest.raises(ValueError, match=r"^--kv-cache-memory-bytes 1 is .* smaller than one "
                                         r"16-token page"):
        plan(MemorySpec(kv_cache_memory_bytes=1), page_size=16)
    assert plan(MemorySpec(kv_tokens=10), page_size=8).kv_tokens == 8  # one page fits


def test_mla_and_tp_group_totals():
    r = plan(MemorySpec(model="deepseek-v3", gpu="h200", tp=8, budget="sglang"))
    assert r.kv_bytes_per_token_per_rank == 70_272
    assert r.kv_bytes_per_token == 8 * 70_272
    assert any("MLA" in n for n in r.notes)
    assert r.weight_bytes == pytest.approx(671e9)  # fp8 weights


def test_outputs_json_concurrency_page_table():
    lengths = np.array([1, 16, 17, 100])
    r = plan(MemorySpec(budget="vllm"), page_size=16, max_running_requests=8,
             context_len=4096, concurrency_contexts=[4096], lengths=lengths)
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
    assert any("sliding" in n for n in plan(MemorySpec(model="mistral-7b")).notes)
    # the page-table figure defaults to the spec's maximum context
    assert plan(MemorySpec(max_context_len=8192)).context_len == 8192
