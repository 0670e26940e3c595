"""Conservation: every request of a drained run ends completed or rejected with a reason,
for every policy, admission mode, preemption mode and schedule, with invariants checked after
every iteration. Requests that can never fit are rejected, never retried forever."""

from __future__ import annotations

import itertools

import pytest

from tests.simulator.helpers import (
    ADMISSIONS,
    CONTIGUOUS_POLICIES,
    PAGED_POLICIES,
    chat,
    identical,
    run,
    with_misfits,
)

MAX_CTX = 512

# memory pressure: 30 requests at once whose outputs all run to max_new_tokens
PRESSURE = with_misfits(identical(30, 40, 150), MAX_CTX)
SESSIONS = with_misfits(chat(), MAX_CTX)
# a pool smaller than the max context length: one request is longer than the pool
SMALL_POOL = with_misfits(identical(12, 60, 50, spacing_s=0.05), 1024, pool_slots=600)

CASES = [
    (pol, adm, pre, sch, "first-fit")
    for pol, adm, pre, sch in itertools.product(
        PAGED_POLICIES, ADMISSIONS, ("recompute", "swap"), ("fcfs", "lpm"))
] + [
    (pol, "reserve", "recompute", sch, placement)
    for pol, sch, placement in itertools.product(
        CONTIGUOUS_POLICIES, ("fcfs", "lpm"), ("first-fit", "buddy"))
]


def _check(result, workload, expect_rejected: set[int]):
    rq = result.requests
    assert len(rq) == workload.num_requests
    assert rq.request_id.is_unique
    assert set(rq.status) <= {"completed", "rejected"}
    rejected = rq[rq.status == "rejected"]
    assert (rejected.reject_reason.str.len() > 0).all()
    assert expect_rejected <= set(rejected.request_id)
    s = result.summary
    assert s["requests_completed"] + s["requests_rejected"] == workload.num_requests
    assert s["requests_completed"] == int((rq.status == "completed").sum())
    done = rq[rq.status == "completed"]
    assert (done.finish_s >= done.first_token_s).all()
    assert (done.first_token_s >= done.arrival_s).all()


@pytest.mark.parametrize("policy,admission,preempt,schedule,placement", CASES,
                         ids=["-".join(c) for c in CASES])
def test_drained_run_conserves_requests(policy, admission, preempt, schedule, placement):
    kw = dict(policy=policy, admission=admission, preempt=preempt, schedule=schedule,
              placement=placement)
    misfits = {r.request_id for r in PRESSURE.requests if r.prompt_len >= MAX_CTX}
    r = run(PRESSURE, kv_tokens=1024, **kw)
    _check(r, PRESSURE, misfits)
    assert r.summary["requests_completed"] == 30
    r = run(SESSIONS, kv_tokens=768, **kw)
    _check(r, SESSIONS, {x.request_id for x in SESSIONS.requests})
    r = run(SMALL_POOL, kv_tokens=600, max_context_len=1024, **kw)
    too_long = {x.request_id for x in SMALL_POOL.requests if x.prompt_len > 600}
    _check(r, SMALL_POOL, too_long)


def test_pressure_exercises_preemption():
    """The conservation workloads do reach the preemption paths they claim to cover."""
    for admission, preempt in (("sglang", "recompute"), ("vllm", "swap")):
        s = run(PRESSURE, kv_tokens=1024, admission=admission, preempt=preempt).summary
        assert s["preemptions"] > 0
        key = "swapped_tokens" if preempt == "swap" else "recomputed_tokens"
        assert s[key] > 0


def test_never_fitting_requests_have_reasons():
    r = run(SMALL_POOL, kv_tokens=600, max_context_len=1024, admission="vllm")
    rej = r.requests.set_index("request_id")
    by_len = {x.request_id: x.prompt_len for x in SMALL_POOL.requests}
    for rid, plen in by_len.items():
        if plen >= 1024:
            assert "max context length" in rej.loc[rid, "reject_reason"]
        elif plen > 600:
            assert "the pool has" in rej.loc[rid, "reject_reason"]
        else:
            assert rej.loc[rid, "status"] == "completed"


def test_sglang_caps_output_budget_by_pool():
    """SGLang caps max_new_tokens by the pool (max_req_len), so requests that fit a pool
    smaller than the max context length run instead of being refused for their budget."""
    r = run(SMALL_POOL, kv_tokens=600, max_context_len=1024, admission="sglang")
    assert r.summary["requests_completed"] == 12
