"""The hybrid layout is resolved once per run and passed on (simulator/hybrid.py `RunLayout`):
the options resolve it, the engine's config takes it over, a fleet's per-replica copy keeps
it, and a config built from other options resolves its own. Cost: about 2 s (one small
hybrid run)."""

from __future__ import annotations

from dataclasses import replace

import simulator.hybrid as hybrid
from experiments.answers.runner import simulate_options
from experiments.options.run_options import RunOptions
from simulator.config import SimConfig

_QWEN = {"model": "qwen3.5-4b", "policy": "vllm", "budget": "vllm", "num_requests": 12,
         "workload": "azure-conv"}


def test_a_run_resolves_its_layout_once(monkeypatch) -> None:
    calls: list[str] = []
    real = hybrid.resolve_state_dtypes

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(hybrid, "resolve_state_dtypes", counted)
    row, result = simulate_options(RunOptions.from_mapping(_QWEN))
    assert calls == ["vllm"]  # once, for the policy's engine
    assert result.config.layout.layout is not None and row["mamba_cache_mode"] == "align"


def test_the_layout_is_handed_over_not_resolved_again() -> None:
    opts = RunOptions.from_mapping(_QWEN)
    cfg = opts.sim_config()
    assert cfg.layout is opts.run_layout
    assert replace(cfg, duration_s=5.0).layout is cfg.layout  # same options: kept
    other = replace(cfg, policy=replace(cfg.policy, kv_layout="full-attention"))
    assert other.layout is not cfg.layout and other.layout.layout is None
    assert other.layout.model is not None  # the model's layout, for the summary's dtypes
    plain = SimConfig.of(policy="paged", kv_tokens=4096)
    assert plain.layout.layout is None and plain.layout.key != hybrid.UNRESOLVED.key
