"""The hybrid `paged` policy driven by the engine, unchanged. Until the run builder passes a
model's layout (issue 27 item 8), these tests hand `simulate` a hybrid PolicyConfig through
`policy_config`. About 2 s in all."""

from __future__ import annotations

import dataclasses

import pytest

import simulator.run as run
from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.layers import FULL, SLIDING, HybridLayout, LayerGroup
from kvcore.sglang.policy import PoolKindsPolicy
from simulator.pool_columns import pool_column_names
from simulator.reuse_gap import HYBRID_REUSE_COLUMNS
from tests.simulator.helpers import NON_DETERMINISTIC_KEYS, chat, config, kshot


def _with_layout(monkeypatch: pytest.MonkeyPatch, layout: HybridLayout, kv_bytes: int,
                 **fields: float) -> None:
    base = run.policy_config

    def hybrid(cfg, max_context_len):
        return dataclasses.replace(base(cfg, max_context_len), layout=layout,
                                   kv_bytes=kv_bytes, **fields)

    monkeypatch.setattr(run, "policy_config", hybrid)


def _summary(res) -> dict:
    """The summary without its wall time and the hybrid-only columns (the pools per kind, the
    block the policy ran, the reuse its layer kinds' rules refused), which a full-attention
    run does not have."""
    hybrid_only = {"effective_page_size", "pools_shared", *HYBRID_REUSE_COLUMNS,
                   *(f"{k}_pool_{s}" for k in pool_column_names(res.summary)
                     for s in ("capacity_bytes", "used_pct", "cached_pct", "hit_rate"))}
    return {k: v for k, v in res.summary.items()
            if k not in NON_DETERMINISTIC_KEYS and k not in hybrid_only}


@pytest.mark.parametrize("policy", ["paged", "paged-nocache"])
def test_long_window_runs_like_full_attention(monkeypatch, policy) -> None:
    """A window longer than the context and an SWA pool as large as the full one: the run's
    every summary figure equals full-attention `paged`'s (2,048 slots either way: 8 B per
    token over the two 1 x 1-head layers, ratio 1)."""
    wl = kshot(n=20, rate=20, prefix=200)
    ref = run.simulate(wl, config(policy=policy))
    layout = HybridLayout((LayerGroup(SLIDING, 1, kv_heads=1, head_dim=1, window=4096),
                           LayerGroup(FULL, 1, kv_heads=1, head_dim=1)))
    _with_layout(monkeypatch, layout, 8 * 2048, swa_full_tokens_ratio=1.0)
    built = run.build_policy(config(policy=policy), 512)
    assert isinstance(built, PoolKindsPolicy)
    assert _summary(run.simulate(wl, config(policy=policy))) == _summary(ref)


@pytest.mark.parametrize("model,kv_bytes,page,slots", [
    ("gemma-3-27b", 2 * 10**9, 16, 0),  # 4,731 full and 3,784 SWA tokens
    ("qwen3.5-4b", 12 * 51_511_296 + 4096 * 32_768, 1, 12),  # 12 states, 4,096 full tokens
])
def test_hybrid_models_run_with_every_invariant_checked(monkeypatch, model, kv_bytes, page,
                                                        slots) -> None:
    _with_layout(monkeypatch, LAYOUTS[model], kv_bytes, max_mamba_cache_size=slots)
    res = run.simulate(chat(sessions=4, turns=3), config(page_size=page, check_invariants=True))
    assert res.summary["requests_completed"] == 12
    assert res.summary["prefix_hit_rate"] > 0.3  # later turns hit the earlier turns' state
