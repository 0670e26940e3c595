"""Prefix reuse: with unbounded memory, FCFS and arrivals spaced beyond each prefill, the
radix hit rate equals the workloads' ideal reuse at that page size; a closed-loop session hits
its own earlier turns."""

from __future__ import annotations

import pytest

from tests.simulator.helpers import chat, kshot, run
from workloads.reuse import ideal_reuse, ideal_reuse_hits

HUGE = 1 << 18  # slots: nothing is ever evicted
# one request per second; a prefill takes ~15 ms and a whole request < 1.5 s
KSHOT = kshot(n=30, rate=1.0, num_prefixes=3)
# sessions 3 s apart with short think times: turns of different sessions interleave
CHAT = chat(sessions=4, turns=4, spacing_s=3.0)


@pytest.mark.parametrize("policy", ["paged", "vllm"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("name,workload", [("kshot", KSHOT), ("chat", CHAT)])
def test_hit_rate_equals_ideal_reuse(policy, page_size, name, workload):
    r = run(workload, policy=policy, page_size=page_size, kv_tokens=HUGE,
            max_context_len=4096, schedule="fcfs", check_invariants=False)
    assert r.summary["requests_completed"] == workload.num_requests
    assert r.summary["prefix_hit_rate"] == pytest.approx(ideal_reuse(workload, page_size),
                                                         abs=1e-12)
    if name == "kshot":  # open loop: per request as well
        ideal = ideal_reuse_hits(workload, page_size)
        got = r.requests.set_index("request_id").cached_tokens
        assert {int(i): int(h) for i, h in zip(ideal.request_ids, ideal.hits, strict=True)} \
            == {int(i): int(h) for i, h in got.items()}


def test_missed_reuse_is_the_page_alignment_loss():
    r1 = run(KSHOT, page_size=1, kv_tokens=HUGE, max_context_len=4096)
    r64 = run(KSHOT, page_size=64, kv_tokens=HUGE, max_context_len=4096)
    assert r1.summary["missed_reuse_pct"] == 0.0
    loss = (ideal_reuse(KSHOT, 1) - ideal_reuse(KSHOT, 64)) * 100.0
    assert r64.summary["missed_reuse_pct"] == pytest.approx(loss)


@pytest.mark.parametrize("policy", ["paged", "vllm"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_session_hits_its_previous_turns(policy, page_size):
    w = chat(sessions=3, turns=4, spacing_s=0.3, think_time_s=0.1)
    r = run(w, policy=policy, page_size=page_size, kv_tokens=16384, max_context_len=4096)
    rq = r.requests
    assert (rq.status == "completed").all()
    for sess in w.sessions:
        turns = rq[rq.session_id == sess.session_id].sort_values("turn")
        assert list(turns.turn) == list(range(len(sess.turns)))
        for prev, cur in zip(turns.itertuples(), turns.iloc[1:].itertuples(), strict=False):
            assert cur.arrival_s >= prev.finish_s  # closed loop
            floor = prev.final_len - prev.final_len % page_size
            assert cur.cached_tokens >= floor
            assert cur.prompt_len > prev.final_len
