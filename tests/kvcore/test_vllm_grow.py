"""The `vllm` policy's page-1 prefill growth (kvcore/policies/vllm_grow.py, issue 28 item 2,
seventh round): `grow_tokens` must leave every request, its page-table row and the caching
arguments exactly as the general per-request loop (the `extend` loop before that round,
written out here as the model) does, on random batches: requests with and without their
block table in the row, chunks that stop short of the known ids or run past them, requests
whose chain is already hashed further (a memoised prompt), and requests holding written
blocks whose ids were not known when written (`nhashed` < `written`)."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvcore.block_hash import NONE_HASH, ChainHasher
from kvcore.policies.vllm_grow import grow_tokens
from kvcore.policies.vllm_request import _Req, _RowReq
from kvcore.req_to_token_pool import ReqToTokenPool

_MAX = 48
_HASHER = ChainHasher(1, _MAX)


def _hash_to(req: _Req, full: int) -> None:
    """VLLMBlockPolicy._hash_to at page size 1."""
    have = len(req.chain)
    if have < full:
        parent = int(req.chain[-1]) if have else NONE_HASH
        req.chain = np.concatenate([req.chain, _HASHER.chain(parent, req.ids[have:full])])


def _model(reqs: list[_Req], targets: list[int], new: np.ndarray, table: ReqToTokenPool
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int, int, int]]] | None:
    """The general loop of `VLLMBlockPolicy.extend` at page size 1, request by request."""
    at = 0
    runs, parts = [], []
    for req, t in zip(reqs, targets, strict=True):
        w = req.written
        if t <= w:
            continue
        k = t - req.nblocks
        got = new[at : at + k]
        req.add_blocks(got)
        if not isinstance(req, _RowReq):
            table.write_range(req.row, w, got)
        at += k
        req.written = t
        full = min(t, len(req.ids))
        done = req.nhashed
        if full > done:
            _hash_to(req, full)
            runs.append((full - done, int(req.chain[done - 1]) if done else NONE_HASH, done,
                         req.block_at(done - 1) if done else 0))
            parts.append((req, done, full))
            req.nhashed = full
    if not runs:
        return None
    every = np.concatenate([r.block_slice(d, f) for r, d, f in parts])
    hashes = np.concatenate([r.chain[d:f] for r, d, f in parts])
    tokens = np.concatenate([r.ids[d:f] for r, d, f in parts])
    return every, hashes, tokens.reshape(-1, 1), runs


# per request: prompt length, written, hashed (a share of what could be, in quarters: mostly
# all of it, as in a prefill), chain hashed beyond (a share of the rest of the ids), chunk
# length; a batch mixes requests whose whole chunk is cached with ones that cache none of it
_REQ = st.tuples(st.integers(1, 20), st.integers(0, 24), st.sampled_from([4, 4, 4, 0, 1, 2, 3]),
                 st.integers(0, 4), st.integers(0, 12))


def _build(spec: list[tuple[int, int, int, int, int]], rows: bool, seed: int
           ) -> tuple[list[_Req], ReqToTokenPool, list[int]]:
    table = ReqToTokenPool(len(spec) + 1, _MAX, "cpu")
    rng = np.random.default_rng(seed)
    reqs: list[_Req] = []
    block = 1
    targets = []
    for n_ids, written, hashed, beyond, chunk in spec:
        ids = rng.integers(0, 5, n_ids).astype(np.int64)  # few token values: equal blocks
        row = table.alloc_row()
        assert row is not None
        req = _RowReq(row, ids, _MAX, table) if rows else _Req(row, ids, _MAX, 1)
        if written:
            got = np.arange(block, block + written, dtype=np.int64)
            block += written
            req.add_blocks(got)
            if not rows:
                table.write_range(row, 0, got)
            req.written = written
        top = min(written, n_ids)  # blocks hashed so far: some share of the known ones
        req.nhashed = top * hashed // 4
        _hash_to(req, req.nhashed + (n_ids - req.nhashed) * beyond // 4)
        reqs.append(req)
        targets.append(min(written + chunk, _MAX))
    return reqs, table, targets


def _state(reqs: list[_Req], table: ReqToTokenPool) -> list[tuple]:
    assert table.host is not None
    return [(r.written, r.nblocks, r.last if r.nblocks else None, r.nhashed,
             r.blocks.tolist(), r.chain[: r.nhashed].tolist(),
             table.host[r.row, : r.written].tolist()) for r in reqs]


@settings(max_examples=300, deadline=None)
@given(st.lists(_REQ, min_size=1, max_size=5), st.booleans(), st.integers(0, 2**16))
# two whole chunks and one past its known ids (nothing to cache): `new` is not the blocks
@example([(10, 2, 4, 0, 3), (10, 2, 4, 0, 3), (3, 5, 4, 0, 2)], True, 1)
def test_grow_tokens_equals_the_general_loop(spec: list[tuple[int, int, int, int, int]],
                                             rows: bool, seed: int) -> None:
    got_reqs, got_table, targets = _build(spec, rows, seed)
    want_reqs, want_table, _ = _build(spec, rows, seed)
    need = sum(t - r.written for r, t in zip(got_reqs, targets, strict=True))
    new = np.arange(1000, 1000 + need, dtype=np.int64)[::-1].copy()  # fresh, any order
    got = grow_tokens(got_reqs, targets, new, _hash_to, got_table)
    want = _model(want_reqs, targets, new, want_table)
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        for a, b in zip(got[:3], want[:3], strict=True):
            assert a.tolist() == b.tolist()
        assert got[3] == want[3]
        assert got[2].shape == want[2].shape
    assert _state(got_reqs, got_table) == _state(want_reqs, want_table)
