"""The `vllm` policy's prefill growth at page size 1: one engine iteration's chunks written
into the requests' block tables and turned into the arguments of one
`BlockPool.cache_runs` call.

Why a loop of its own: at page size 1 a block is a token, and with
`--chunked-prefill-size 64` an iteration extends about eleven requests by a few dozen blocks
each (about 89 k request-chunks over the bench slice, 8 k calls), so what counts is the
Python work per request-chunk, not per block. The general loop (kvcore/policies/vllm_block.py
`extend`, any page size) made per chunk a checked page-table write, a read of the block
before the chunk from the table, a tuple of the run's parts and a second pass over them to
gather hashes and tokens. Here, at page size 1:

* a request's k new blocks are `new[at:at+k]`, in `new`'s order, and are its slots: one slice
  write into its page-table row (`_Req.put_tokens`; the bounds were checked by the caller's
  `check_extend_args`: positions below max_context_len, and the row is the request's own);
* the block before the chunk is the request's last block (`last`, an int), since a request
  at page size 1 holds exactly `written` blocks;
* the chunk's hashes and tokens are sliced once, where the run is made;
* when every chunk is newly full and cached from its first block (the usual case), the
  blocks to cache are `new` itself: no gather.

Exactly the general loop's caching: the same runs (length, parent hash, chain position,
block before) in request order, the same blocks, hashes and tokens
(tests/kvcore/test_vllm_grow.py compares the two on random streams).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kvcore.block_hash import NONE_HASH
from kvcore.policies.vllm_request import _Req
from kvcore.req_to_token_pool import ReqToTokenPool

#: (blocks, hashes, tokens (k, 1), runs): the arguments of `BlockPool.cache_runs`
CacheArgs = tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int, int, int]]]


def grow_tokens(reqs: Sequence[_Req], targets: Sequence[int], new: np.ndarray,
                hash_to: Callable[[_Req, int], None], table: ReqToTokenPool) -> CacheArgs | None:
    """Extend each of `reqs` to its target (plain ints, checked by the caller: written <=
    target <= max_context_len, requests distinct) with the blocks `new` (their number
    exactly the growth, popped in request order), mark the newly full blocks whose ids are
    known hashed (`hash_to` extends a request's chain), and return the caching arguments
    of those blocks (None: none to cache). Page size 1 only."""
    at = 0
    runs: list[tuple[int, int, int, int]] = []  # (length, parent, start, after) each
    blocks: list[np.ndarray] = []
    hashes: list[np.ndarray] = []
    tokens: list[np.ndarray] = []
    whole = True  # every run is its request's whole chunk: the blocks to cache are `new`
    for req, t in zip(reqs, targets, strict=True):
        w = req.written
        if t <= w:
            continue
        end = at + t - w
        got = new[at:end]
        at = end
        before = req.last  # block w - 1 (a request holds `written` blocks), if w > 0
        req.put_tokens(got, table)
        ids = req.ids
        full = len(ids) if t > len(ids) else t
        done = req.nhashed
        if full <= done:  # nothing newly full with known ids: `new` holds blocks not cached
            whole = False
            continue
        if len(req.chain) < full:
            hash_to(req, full)
        chain = req.chain
        if done == w:
            if full == t:
                blocks.append(got)
            else:
                blocks.append(got[: full - w])
                whole = False
            after = before if w else 0
        else:  # blocks written earlier with ids unknown then (learned since)
            blocks.append(req.block_slice(done, full))
            whole = False
            after = req.block_at(done - 1) if done else 0
        runs.append((full - done, chain.item(done - 1) if done else NONE_HASH, done, after))
        hashes.append(chain[done:full])
        tokens.append(ids[done:full])
        req.nhashed = full
    if not runs:
        return None
    if len(runs) == 1:
        every, hs, toks = blocks[0], hashes[0], tokens[0]
    else:
        every = new if whole and at == len(new) else np.concatenate(blocks)
        hs, toks = np.concatenate(hashes), np.concatenate(tokens)
    return every, hs, toks.reshape(-1, 1), runs
