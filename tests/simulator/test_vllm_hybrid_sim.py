"""The `vllm` policy on a hybrid layout driven by the simulator (`simulate`), unchanged engine.

Until run.py passes the model's layout to the policy (issue 27 item 8), the PolicyConfig the
run builds gets the layout and a byte budget here. Qwen3.5-4B's block is 528 tokens; 60
blocks of 8 layers x 2,162,688 B. Cost: about 3 s (invariants checked every iteration).
"""

from __future__ import annotations

import dataclasses

import pytest

import simulator.run as run
from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.vllm.pool_kinds import PooledVLLMManager

from .helpers import config, kshot


def _simulate(monkeypatch: pytest.MonkeyPatch, mode: str) -> dict:
    base = run.policy_config

    def with_layout(cfg, ctx):  # type: ignore[no-untyped-def]
        return dataclasses.replace(base(cfg, ctx), layout=LAYOUTS["qwen3.5-4b"],
                                   kv_bytes=60 * 2_162_688 * 8, mamba_cache_mode=mode)

    monkeypatch.setattr(run, "policy_config", with_layout)
    cfg = config(policy="vllm", max_context_len=4096, chunked_prefill_size=512)
    assert isinstance(run.build_policy(cfg, 4096), PooledVLLMManager)
    wl = kshot(n=16, prefix=1200)
    res = run.simulate(wl, cfg)
    assert len(res.requests) == len(wl.requests)  # every request ran to completion
    return res.summary


def test_hybrid_vllm_runs_and_mamba_mode_decides_the_hits(monkeypatch: pytest.MonkeyPatch):
    """Two 1,200-token prefixes + 24-token questions: align keeps the state at the prompt's
    last 528-token boundary, so later requests hit 1,056 of 1,224 tokens (at most 86 %);
    mode none caches nothing."""
    align = _simulate(monkeypatch, "align")
    assert 0.5 < align["prefix_hit_rate"] <= 1056 / 1224
    assert align["capacity_slots"] == 60 * 528  # 60 blocks of 528 tokens
    # the summary says which block ran: --page-size asked 16, vLLM's rule raised it to 528
    assert align["page_size"] == 16 and align["effective_page_size"] == 528
    assert _simulate(monkeypatch, "none")["prefix_hit_rate"] == 0.0
