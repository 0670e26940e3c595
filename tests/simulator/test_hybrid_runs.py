"""Hybrid models through the engine (needs the hybrid layouts of kvcore/sglang/ and
kvcore/vllm/). A sliding window at least as long as every request gives
exactly the run of full attention: same requests, same summary (the per-kind pool columns
aside), under `paged` and `vllm`; a hybrid run has the per-kind columns, a full-attention one
none.
Cost: about 4 s (two runs of 16 requests, two of 8)."""

from __future__ import annotations

import math

import pytest

from kvcore.model.hybrid_presets import CONFIG_LAYOUTS
from kvcore.model.layers import FULL, SLIDING, HybridLayout, LayerGroup
from simulator.config import SimConfig
from simulator.hybrid import HYBRID_OPTIONS
from simulator.pool_columns import pool_column_names
from simulator.run import simulate
from workloads import build_workload
from workloads.spec import WorkloadSpec

# llama-3.1-8b's 32 layers (8 KV heads x 128) as 16 sliding + 16 full: the window never slides
WIDE = HybridLayout((LayerGroup(SLIDING, 16, kv_heads=8, head_dim=128, window=1 << 20),
                     LayerGroup(FULL, 16, kv_heads=8, head_dim=128)))
NOT_COMPARED = {"sim_wall_s", "kv_bytes", *HYBRID_OPTIONS}  # the options that differ


def _run(policy: str, layout: str, n: int = 16, kv_tokens: int = 3072, **extra):
    w = build_workload(WorkloadSpec(name="chat", num_requests=n, seed=3,
                                    max_context_len=2048))
    cfg = SimConfig.of(model="llama-3.1-8b", policy=policy, page_size=16, kv_tokens=kv_tokens,
                       max_context_len=2048, kv_layout=layout, **extra)
    return simulate(w, cfg)


@pytest.mark.parametrize(("policy", "extra"), [
    ("paged", {"swa_full_tokens_ratio": 1.0}),  # the SWA pool as large as the full one
    # vllm: one slot is 1 / block_size of a block in each attention group (this test found
    # the policy counting every group's free blocks as slots: twice the memory with two).
    # A pool that never evicts: under eviction the two layouts differ by vLLM's own rule, as
    # the next test shows
    ("vllm", {"kv_tokens": 16384}),
])
def test_a_window_longer_than_every_request_runs_exactly_as_full_attention(
        monkeypatch, policy, extra) -> None:
    monkeypatch.setitem(CONFIG_LAYOUTS, "llama-3.1-8b", WIDE)
    hybrid = _run(policy, "hybrid", **extra)
    full = _run(policy, "full-attention", kv_tokens=extra.get("kv_tokens", 3072))
    assert pool_column_names(hybrid.summary) and not pool_column_names(full.summary)
    assert hybrid.summary["preemptions"] + hybrid.summary["prefix_hit_rate"] > 0
    pd_cols = hybrid.requests.columns
    assert hybrid.requests[pd_cols].equals(full.requests[pd_cols])
    # vLLM keeps one block table per KV cache group (twice the bytes with two groups, where
    # full attention has one token-level table); the entries per request are the same
    tables = {"page_table_bytes"} if policy == "vllm" else set()
    for key, value in full.summary.items():
        if key in NOT_COMPARED | tables or key in pool_column_names(hybrid.summary):
            continue
        other = hybrid.summary[key]
        both_nan = isinstance(value, float) and math.isnan(value) and math.isnan(other)
        assert both_nan or other == value, key


def test_under_eviction_vllm_s_shared_free_queue_loses_a_whole_group_s_chain_first(
        monkeypatch) -> None:
    """vLLM frees a finished request's blocks group by group, each group's reversed
    (vllm/v1/core/single_type_kv_cache_manager.py `free`: `reversed(blocks)` per manager, the
    coordinator calling the managers in group order), so the shared free queue holds one
    group's whole chain ahead of the other's, and eviction empties a group's chain before it
    touches the other: a prefix hit needs both groups, so the hybrid loses more reuse than
    full attention at the same memory (same admissions: the slots are the same). On this
    chat run: request 3 hits 560 tokens instead of full attention's 992."""
    monkeypatch.setitem(CONFIG_LAYOUTS, "llama-3.1-8b", WIDE)
    hybrid, full = _run("vllm", "hybrid"), _run("vllm", "full-attention")
    assert hybrid.requests["admit_s"].equals(full.requests["admit_s"])
    assert hybrid.summary["prefix_hit_rate"] < full.summary["prefix_hit_rate"]
