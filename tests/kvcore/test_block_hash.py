"""`ChainHasher.chain` (a whole sequence's block hashes in a few in-place passes) against the
block-by-block definition `block_hashes`, for any page size, parent hash and token ids."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.vllm.block_hash import ChainHasher, block_hashes

_IDS = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ps=st.integers(1, 5), parent=st.integers(0, 2**64 - 1), ids=_IDS)
def test_chain_equals_block_by_block(ps: int, parent: int, ids: list[int]) -> None:
    toks = np.array(ids, dtype=np.int64)
    got = ChainHasher(ps, 64).chain(parent, toks)
    want, h = [], parent
    for i in range(len(toks) // ps):
        h = int(block_hashes(np.array([h], dtype=np.uint64), toks[i * ps : (i + 1) * ps])[0])
        want.append(h)
    assert got.dtype == np.uint64 and got.tolist() == want
    assert toks.tolist() == ids  # the caller's ids are not written


@settings(max_examples=60, deadline=None)
@given(ps=st.integers(1, 5), parent=st.integers(0, 2**64 - 1), ids=_IDS)
def test_python_int_path_equals_vectorised(ps: int, parent: int, ids: list[int]) -> None:
    """A few tokens are hashed with Python ints (`ChainHasher.small`): both paths agree on
    every length, the Python one forced for all of them and the numpy one for all."""
    toks = np.array(ids, dtype=np.int64)
    ints, vec = ChainHasher(ps, 64), ChainHasher(ps, 64)
    ints.small, vec.small = 64, -1
    got, want = ints.chain(parent, toks), vec.chain(parent, toks)
    assert got.dtype == want.dtype == np.uint64 and got.tolist() == want.tolist()
