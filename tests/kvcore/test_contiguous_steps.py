"""The contiguous policies' one-write decode stretch (`decode_steps`) against stepping, and
their running breakdown sums against a recount (`check_invariants`)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcore.policies.contiguous  # noqa: F401 - registers the policies
from kvcore.policies.base import PolicyConfig, make_policy

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
