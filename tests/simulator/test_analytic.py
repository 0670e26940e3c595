"""Analytic checks: page rounding of identical requests, and contiguous-max's concurrency."""

from __future__ import annotations

import pytest

from kvcore.policies import PolicyConfig, make_policy
from tests.simulator.helpers import identical, run
from workloads.request import unique_prompt

# policies whose only internal fragmentation is the tail of the last page
ON_DEMAND = ("paged", "paged-nocache", "vllm", "contiguous-oracle")


def _rounding(length: int, page_size: int) -> int:
    return -(-length // page_size) * page_size - length


@pytest.mark.parametrize("policy", ON_DEMAND)
@pytest.mark.parametrize("page_size", [1, 7, 16, 64])
@pytest.mark.parametrize("prompt,output", [(37, 20), (64, 1), (100, 29)])
def test_rounding_just_before_finish_policy(policy, page_size, prompt, output):
    """Drive the policy the way the engine does (admit, prefill, decode output-1 steps):
    right before `finish`, n identical requests of final length L hold n x rounding(L)."""
    n, final = 5, prompt + output - 1
    p = make_policy(policy, PolicyConfig(kv_tokens=8192, page_size=page_size,
                                         max_context_len=512, max_requests=8))
    rids = list(range(n))
    for rid in rids:
        assert p.admit(rid, unique_prompt(1, rid, prompt).token_ids(), final, output)
    assert p.extend(rids, [prompt] * n)
    for _ in range(output - 1):
        assert p.decode(rids)
    p.check_invariants()
    b = p.breakdown(512)
    assert b.rounding == n * _rounding(final, page_size)
    assert b.over_reservation == 0 and b.reserved == 0
    assert b.token_states == n * final


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_rounding_just_before_finish_engine(page_size):
    """The same through the engine: n identical requests run in lockstep; the timeline row
    of their last iteration (sampled after its allocations) holds n x rounding(L)."""
    n, prompt, output = 6, 45, 30
    final = prompt + output - 1
    r = run(identical(n, prompt, output), policy="paged-nocache", page_size=page_size,
            kv_tokens=4096, max_steps_per_stretch=1, timeline_interval_s=1e-9)
    tl = r.timeline
    last = tl[tl.running == n].iloc[-1]
    assert last.token_states == n * final
    assert last.internal == n * _rounding(final, page_size)
    assert r.summary["requests_completed"] == n


CONTIGUOUS_MAX_CASES = [("first-fit", 2048, 512), ("first-fit", 2048, 300),
                        ("first-fit", 3000, 256), ("buddy", 2048, 512), ("buddy", 3000, 256)]


@pytest.mark.parametrize("placement,kv_tokens,max_ctx", CONTIGUOUS_MAX_CASES)
def test_contiguous_max_admits_capacity_over_max_context(placement, kv_tokens, max_ctx):
    """Every request reserves the max context length, so floor(capacity / max context) run at
    once, however short they are (buddy placement needs a power-of-two max context)."""
    n = 40  # far more than fit; they all wait from t=0
    r = run(identical(n, 20, 60), policy="contiguous-max", admission="reserve",
            placement=placement, page_size=1, kv_tokens=kv_tokens, max_context_len=max_ctx,
            max_running_requests=64)
    expect = r.summary["capacity_slots"] // max_ctx
    assert r.summary["peak_batch_size"] == expect
    assert r.summary["requests_completed"] == n
    # with a full queue the batch is always full but for the tail
    assert r.summary["avg_batch_size"] > expect - 1
