"""The contiguous policies' one-write decode stretch (`decode_steps`) and prefill stretch
(`prefill_steps`) against stepping, and their running breakdown sums against a recount
(`check_invariants`). Cost: about 2 s (hypothesis, 30 + 40 examples)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcore.contiguous.policy  # noqa: F401 - registers the policies
from kvcore.contract.capabilities import Reserving
from kvcore.policies import PolicyConfig, make_policy

POLICIES = ["contiguous-max", "contiguous-pow2", "contiguous-oracle"]


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(POLICIES), placement=st.sampled_from(["first-fit", "buddy"]),
       ps=st.sampled_from([1, 4]), data=st.data())
def test_decode_steps_equal_stepping(name: str, placement: str, ps: int, data) -> None:
    n_req = data.draw(st.integers(1, 4))
    prompts = data.draw(st.lists(st.integers(0, 20), min_size=n_req, max_size=n_req))
    outs = data.draw(st.lists(st.integers(1, 12), min_size=n_req, max_size=n_req))
    n = data.draw(st.integers(1, min(outs)))
    cfg = PolicyConfig(kv_tokens=1024, page_size=ps, max_context_len=64, max_requests=8,
                       placement=placement)
    a, b = make_policy(name, cfg), make_policy(name, cfg)
    rids = list(range(n_req))
    for p in (a, b):
        for rid, (pl, ol) in enumerate(zip(prompts, outs, strict=True)):
            assert p.admit(rid, np.arange(pl, dtype=np.int64), pl + ol, ol) is not None
        assert p.extend(rids, prompts)
    profile = a.decode_steps(rids, n, 8)
    for _ in range(n):
        assert b.decode(rids)
    assert np.array_equal(profile[-1], b.breakdown(8).as_array())
    assert [a.written(r) for r in rids] == [b.written(r) for r in rids]
    assert a.page_table_entries() == b.page_table_entries()
    for r in rids:  # the written part of each row (the rest is never read)
        row, w = a._reqs[r].row, a.written(r)
        assert b._reqs[r].row == row
        assert np.array_equal(a.req_to_token_pool.read_at(row, slice(0, w)),
                              b.req_to_token_pool.read_at(row, slice(0, w)))
    a.check_invariants()  # the running sums against a recount
    a.release(0)
    a.check_invariants()


def _rows_equal(a, b, rids) -> bool:
    """The written part of each request's page-table row (the rest is never read)."""
    for r in rids:
        row, w = a._reqs[r].row, a.written(r)
        if b._reqs[r].row != row or not np.array_equal(
                a.req_to_token_pool.read_at(row, slice(0, w)),
                b.req_to_token_pool.read_at(row, slice(0, w))):
            return False
    return True


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(POLICIES), placement=st.sampled_from(["first-fit", "best-fit",
                                                                  "buddy"]),
       ps=st.sampled_from([1, 4, 16]), data=st.data())
def test_prefill_steps_equal_extends_and_decodes(name: str, placement: str, ps: int,
                                                 data) -> None:
    """n iterations of chunks (each prefill by its own room) and decode steps in one call:
    the same profile after every iteration, rows, entries and sums as the n `extend` +
    `decode` calls of `Reserving.prefill_steps`' reference form, on a twin policy."""
    n_pre = data.draw(st.integers(1, 2))
    n_dec = data.draw(st.integers(0, 3))
    n_req = n_pre + n_dec
    prompts = data.draw(st.lists(st.integers(1, 30), min_size=n_req, max_size=n_req))
    outs = data.draw(st.lists(st.integers(1, 12), min_size=n_req, max_size=n_req))
    written = [data.draw(st.integers(0, p - 1)) for p in prompts[:n_pre]]
    rooms = [data.draw(st.integers(1, max(1, (p - w) // 2)))
             for p, w in zip(prompts, written, strict=False)]
    top = min([(p - w) // m for p, w, m in zip(prompts, written, rooms, strict=False)]
              + outs[n_pre:])
    n = data.draw(st.integers(1, max(1, top)))
    cfg = PolicyConfig(kv_tokens=2048, page_size=ps, max_context_len=64, max_requests=8,
                       placement=placement)
    a, b = make_policy(name, cfg), make_policy(name, cfg)
    pre, dec = list(range(n_pre)), list(range(n_pre, n_req))
    for p in (a, b):
        for rid, (pl, ol) in enumerate(zip(prompts, outs, strict=True)):
            assert p.admit(rid, np.arange(pl, dtype=np.int64), pl + ol, ol) is not None
        assert p.extend(pre, written)
        if dec:
            assert p.extend(dec, prompts[n_pre:])
    head = data.draw(st.sampled_from([0, 8, 40]))
    got = a.prefill_steps(pre, rooms, dec, n, head)
    want = Reserving.prefill_steps(b, pre, rooms, dec, n, head)
    assert np.array_equal(got, want)
    assert got.shape == (n, 6)
    assert a.breakdown(head) == b.breakdown(head)
    assert [a.written(r) for r in range(n_req)] == [b.written(r) for r in range(n_req)]
    assert a.page_table_entries() == b.page_table_entries()
    assert _rows_equal(a, b, range(n_req))
    a.check_invariants()
    b.check_invariants()


def test_prefill_steps_refuses_what_it_cannot_do_in_one_write() -> None:
    """Bad calls name what and where: a repeated request, rooms not matching, a decode past
    its final length, no iterations, an empty room."""
    cfg = PolicyConfig(kv_tokens=1024, page_size=4, max_context_len=64, max_requests=8)
    p = make_policy("contiguous-max", cfg)
    assert p.admit(1, np.arange(20), 24, 4) is not None
    assert p.admit(2, np.arange(4), 6, 2) is not None
    assert p.extend([2], [4])
    with pytest.raises(ValueError, match="same request twice"):
        p.prefill_steps([1], [4], [1], 2, 0)
    with pytest.raises(ValueError, match="rooms differ in length: 1 != 2"):
        p.prefill_steps([1], [4, 4], [2], 2, 0)
    with pytest.raises(ValueError, match="decode of request 2 would pass its final length 6"):
        p.prefill_steps([1], [4], [2], 3, 0)
    with pytest.raises(ValueError, match="request 1 would write 28 tokens, past its final "
                                         "length 24"):
        p.prefill_steps([1], [4], [2], 7, 0)
    with pytest.raises(ValueError, match="n must be"):
        p.prefill_steps([1], [4], [2], 0, 0)
    with pytest.raises(ValueError, match="room of request 1"):
        p.prefill_steps([1], [0], [2], 2, 0)
    assert p.written(1) == 0 and p.written(2) == 4  # nothing written by a refused call
    assert p.prefill_steps([1], [4], [2], 2, 0)[-1].tolist()[0] == 8 + 6
