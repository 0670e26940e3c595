"""A peek compares only the prompt prefix its answer rests on (kvcore/vllm/chain_memo.py
`ChainMemo.recall` / `confirm`): a remembered prompt buffer rewritten anywhere answers as a
fresh hashing of it does (a copy: another buffer), hashed again when the rewrite falls in the
hit or at its first miss, and not hashed when it falls after (the answer cannot depend on it).
About 1 s."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kvcore.test_chain_memo import count_hashings
from tests.kvcore.test_vllm_block import make


@settings(max_examples=25, deadline=None)
@given(ps=st.sampled_from([1, 4]), cached=st.integers(0, 12), where=st.integers(0, 23),
       rewrites=st.integers(1, 3))
def test_a_rewritten_buffer_answers_as_a_fresh_one(ps: int, cached: int, where: int,
                                                   rewrites: int) -> None:
    pol = make(4096, ps)
    other = np.arange(8 * ps, dtype=np.int64) + 5000  # keeps the index non-empty
    assert pol.admit(9, other, len(other) + 1, 1) is not None
    assert pol.extend([9], [len(other)])
    pol.finish(9, other)
    toks = np.arange(24 * ps + 1, dtype=np.int64) + 1000
    if cached:  # the first `cached` blocks of the prompt cached by an earlier request
        head = toks[: cached * ps].copy()
        assert pol.admit(0, head, len(head) + 1, 1) is not None
        assert pol.extend([0], [len(head)])
        pol.finish(0, head)
    key = toks[:-1]
    assert pol.peek_prefix(key) == cached * ps
    hashed = count_hashings(pol)
    for i in range(rewrites):
        hit_blocks = pol.peek_prefix(key) // ps
        hashed.clear()
        at = (where + 7 * i) % 24
        key[at * ps] += 100_000  # the same buffer, one token of block `at` rewritten
        got = pol.peek_prefix(key)
        assert bool(hashed) == (at <= hit_blocks)  # compared up to the first miss only
        assert got == pol.peek_prefix(key.copy())  # as a fresh hashing of the same tokens
        pol.check_invariants()
