"""`VLLMBlockPolicy.check_invariants` (kvcore/policies/vllm_block.py), kept apart so the
manager stays under the size limit: what must hold between the block pool, the requests'
block tables and hash chains, and the page table."""

from __future__ import annotations

import numpy as np
import torch

from kvcore.block_hash import NONE_HASH, ChainHasher
from kvcore.block_pool import BlockPool
from kvcore.policies.vllm_request import _Req, _RowReq
from kvcore.req_to_token_pool import ReqToTokenPool
from kvcore.validation import InvariantError, cdiv


def check_block_policy(pool: BlockPool, reqs: dict[int, _Req], hasher: ChainHasher,
                       req_to_token_pool: ReqToTokenPool) -> None:
    """The pool's equations, plus: ref_cnt[b] == #live requests holding b; a request
    holds ceil(written / ps) distinct non-null blocks and its hashed blocks keep their
    hashes; its page-table row matches its block table, and a block table kept in the page
    table (`_RowReq`, page size 1) is the request's own row."""
    ps = pool.page_size
    req_to_token_pool.check_invariants()
    pool.check_invariants()
    host = req_to_token_pool.host
    holders = np.zeros(pool.num_blocks + 1, dtype=np.int64)
    for rid, r in reqs.items():
        if isinstance(r, _RowReq) and (host is None or ps != 1 or not np.shares_memory(
                r._row, host[r.row]) or r._row.ctypes.data != host[r.row].ctypes.data):
            raise InvariantError(f"vllm: request {rid} keeps its blocks outside its own row")
        bt = r.blocks
        if len(np.unique(bt)) != len(bt) or (bt == 0).any():
            raise InvariantError(f"vllm: request {rid} holds a block twice or the null block")
        if len(bt) != cdiv(r.written, ps) or (len(bt) and r.last != bt[-1]):
            raise InvariantError(f"vllm: request {rid} has blocks beyond its written tokens")
        if r.nhashed > r.written // ps or r.nhashed > len(r.chain):
            raise InvariantError(f"vllm: request {rid} hashed a partial block")
        if len(r.chain) and not np.array_equal(
                hasher.chain(NONE_HASH, r.ids[: len(r.chain) * ps]), r.chain):
            raise InvariantError(f"vllm: request {rid} keeps a wrong hash chain")
        holders[bt] += 1
        hb = bt[: r.nhashed]
        if not (pool.is_hashed[hb].all()
                and np.array_equal(pool.block_hash[hb], r.chain[: r.nhashed])):
            raise InvariantError(f"vllm: request {rid} has a block that lost its hash")
    for b in np.flatnonzero(pool.ref_cnt != holders).tolist():
        raise InvariantError(f"vllm: block {b} ref {pool.ref_cnt[b]} != holders {holders[b]}")
    table = req_to_token_pool.req_to_token
    for rid, r in reqs.items():
        pos = torch.arange(r.written)
        tb = torch.from_numpy(r.blocks.copy())
        want = (tb[pos // ps] * ps + pos % ps).to(torch.int32) if r.written else pos.int()
        if not torch.equal(table[r.row, : r.written].cpu(), want):
            raise InvariantError(f"vllm: page-table row of request {rid} is wrong")


def check_admit_hits(pool: BlockPool, reqs: dict[int, _Req],
                     admit_hits: dict[int, tuple[int, int]]) -> None:
    """The admission hits a release hands to the prompt memo (`VLLMBlockPolicy.release`):
    one per admitted request, each the first blocks of its table, hashed with its chain,
    still indexed (held blocks are never popped), and a miss position no newer than the
    index's newest caching."""
    if admit_hits.keys() != reqs.keys():
        raise InvariantError("vllm: admission hits kept for other requests than the admitted")
    for rid, (m, at) in admit_hits.items():
        r = reqs[rid]
        hb = r.blocks[:m]
        if not 0 <= m <= r.nhashed or at > pool.index.newest or not (pool.gen[hb] > 0).all():
            raise InvariantError(f"vllm: request {rid}'s admission hit is out of sync")
