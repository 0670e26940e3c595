"""Admission on a hybrid `vllm` model counts every KV cache group's blocks: vLLM allocates a new
request's blocks in all groups at once (`KVCacheManager.allocate_slots` summing the
coordinator's `get_num_blocks_to_allocate` over groups; vllm/v1/core/kv_cache_manager.py and
kv_cache_coordinator.py, v0.11+ to v0.24), Mamba state blocks included, so a request whose
attention pages fit but whose state blocks do not is not admitted (before, it was admitted and
its prefill could not allocate). Cost: well under 1 s."""

from __future__ import annotations

import simpy

from simulator.admission import AdmissionParams, make_admission
from simulator.request import SimRequest
from tests.kvcore.test_vllm_hybrid import toy
from tests.kvcore.vllm_views import tables
from workloads.request import PromptSpec, Request


def _sreq(prompt: int) -> SimRequest:
    req = Request(0, 0.0, PromptSpec((("unique", 9, prompt, 0),)), 1, 1, seed=3)
    return SimRequest(req, 256, simpy.Environment())


def test_state_blocks_count_at_admission() -> None:
    """Toy layout (full, sliding window 32, linear attention; blocks of 16, two attention
    groups: a slot is half a block). A 40-token prompt + 1 token is 3 pages; vLLM allocates 3
    full + 3 sliding + 2 state blocks (the running block at position 2 and the boundary state
    at position 1, mode align) = 8 blocks = 64 slots, 16 more than its 48 slots of pages.
    A pool of 7 blocks (56 slots) shows 3 free pages: the pages fit, the 8 blocks do not."""
    p = toy("align", blocks=7)
    s = _sreq(40)
    ids = s.seq_ids(s.prefill_target)
    peek = p.peek_admission(s.prefill_key())
    assert (peek.hit, peek.evictable, peek.other_pools) == (0, 0, 16)
    adm = make_admission("vllm", p, AdmissionParams())
    assert p.available_tokens() == 56
    assert not adm.admissible(s, peek, 0, [], [])
    # what admitting it anyway does: the prefill cannot allocate its 8 blocks
    assert p.admit(0, ids, len(ids) + 1, 1) is not None
    assert not p.extend([0], [len(ids)])
    p.release(0)
    p.check_invariants()
    # with one more block the whole request fits, and admission takes it
    q = toy("align", blocks=8)
    assert make_admission("vllm", q, AdmissionParams()).admissible(
        s, q.peek_admission(s.prefill_key()), 0, [], [])
    assert q.admit(0, ids, len(ids) + 1, 1) is not None and q.extend([0], [len(ids)])
    assert sum(1 for t in tables(q, 0) for b in t if b) == 8  # the 8 blocks counted
