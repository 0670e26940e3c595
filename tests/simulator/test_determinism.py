"""Determinism: the same workload, configuration and seed give identical results."""

from __future__ import annotations

import pytest

from tests.simulator.helpers import assert_same_results, mixed, run


@pytest.mark.parametrize(
    "kw",
    [
        dict(policy="paged", admission="sglang", schedule="lpm"),
        dict(policy="vllm", admission="vllm", preempt="swap", page_size=1),
        dict(policy="contiguous-pow2", admission="reserve", placement="buddy"),
    ],
    ids=["paged-sglang-lpm", "vllm-swap", "pow2-buddy"],
)
def test_same_inputs_same_results(kw):
    w = mixed()
    a = run(w, kv_tokens=1024, **kw)
    b = run(mixed(), kv_tokens=1024, **kw)  # rebuilt from scratch: no shared state
    assert_same_results(a, b)
    assert a.summary["requests_completed"] > 0
    assert a.timeline.equals(b.timeline)


def test_workload_seed_matters():
    a = run(mixed(seed=7), kv_tokens=1024)
    b = run(mixed(seed=8), kv_tokens=1024)
    assert not a.requests.equals(b.requests)
