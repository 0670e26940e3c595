"""The full-attention group's growth and caching in one pass (kvcore/vllm/group_rules.py
`FullAttention.extend`): it reads a run's blocks from the array an `extend` just popped (and
hands that array itself over when the runs are exactly every request's new blocks) instead of
from the tables. It must leave the pool exactly as the general path of every kind of group
(`GroupRule.extend`: growth, then runs read from the tables) does: two managers, one with the
general path, driven by the same random prefill chunks (requests with and without their
table in the page-table row, chunks that stop short of the known ids or run past them,
prompts sharing prefixes), compared after every call."""

from __future__ import annotations

from functools import partial

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.policies import PolicyConfig, make_policy
from kvcore.vllm.group_rules import GroupRule
from kvcore.vllm.manager import VLLMManager
from tests.kvcore.vllm_views import blocks, heads


def _pair(ps: int) -> tuple[VLLMManager, VLLMManager]:
    fast, general = (make_policy("vllm", PolicyConfig(kv_tokens=96 * ps, page_size=ps,
                                                      max_context_len=64, max_requests=6))
                     for _ in range(2))
    assert isinstance(fast, VLLMManager) and isinstance(general, VLLMManager)
    rule = general.rules[0]
    rule.extend = partial(GroupRule.extend, rule)  # type: ignore[method-assign]
    return fast, general


def _state(pol: VLLMManager, live: list[int]) -> tuple:
    pool = pol.pool
    index = pool.indexes[0]
    return (pool.peek_free(pool.get_num_free_blocks()).tolist(),
            np.flatnonzero(pool.is_hashed).tolist(), pool.block_hash.tolist(),
            pool.parent_hash.tolist(), index.gen.tolist(), sorted(heads(pool).items()),
            [(blocks(pol, r), pol.requests[r].tables[0].hashed) for r in live])


@settings(max_examples=60, deadline=None)
@given(ps=st.sampled_from([1, 2, 4]), data=st.data())
def test_fresh_blocks_cache_as_the_tables_do(ps: int, data: st.DataObject) -> None:
    fast, general = _pair(ps)
    prompts = [np.concatenate([np.arange(data.draw(st.integers(0, 20), label="shared")),
                               500 * (k + 1) + np.arange(data.draw(st.integers(1, 20)))])
               for k in range(data.draw(st.integers(1, 5), label="requests"))]
    live = []
    for rid, ids in enumerate(prompts):
        ids = ids.astype(np.int64)
        for pol in (fast, general):
            assert pol.admit(rid, ids, len(ids) + 4, 5) is not None
        live.append(rid)
    for _ in range(data.draw(st.integers(1, 8), label="calls")):
        rids = data.draw(st.lists(st.sampled_from(live), unique=True, min_size=1))
        targets = [min(fast.written(r) + data.draw(st.integers(0, 12)), 64) for r in rids]
        assert fast.extend(rids, targets) == general.extend(rids, targets)
        for pol in (fast, general):
            pol.check_invariants()
        assert _state(fast, live) == _state(general, live)
