"""A request's state in the hybrid `vllm` policy, and the policy's invariants.

Kept apart from kvcore/policies/vllm_hybrid.py so each module has one job: the manager there,
the bookkeeping and the checks here (`check_hybrid_invariants`, called by the policy's
`check_invariants` after every step in tests and with `--check-invariants`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from kvcore.block_hash import NONE_HASH, ChainHasher
from kvcore.block_pool import BlockPool
from kvcore.breakdown import MemoryBreakdown
from kvcore.hybrid_groups import GroupSpec, HybridGroups
from kvcore.validation import InvariantError, cdiv


class HybridReq:
    """One admitted request: its row, the token ids known, its final length, the tokens
    written, the hash chain of its known full blocks, and per KV cache group the block table
    (0: null), how many leading positions were offered to the cache (`nhashed`) and, for a
    state group, the positions whose block received the state at its end boundary."""

    __slots__ = ("chain", "final_len", "ids", "nhashed", "row", "skip_at", "states", "tables",
                 "written")

    def __init__(self, row: int, ids: np.ndarray, final_len: int, groups: int) -> None:
        self.row = row
        self.ids = ids
        self.final_len = final_len
        self.written = 0
        self.skip_at = 0  # written tokens at the last remove_skipped_blocks
        self.chain = np.zeros(0, dtype=np.uint64)
        self.tables: list[list[int]] = [[] for _ in range(groups)]
        self.nhashed = [0] * groups
        self.states: list[set[int]] = [set() for _ in range(groups)]


def partial_tails(req: HybridReq, gspec: Sequence[int], specs: Sequence[GroupSpec],
                  block_size: int) -> tuple[int, int, int]:
    """The unwritten tails of a request's last attention blocks, one per attention group
    (a state block holds a state, not tokens): (slots past its written tokens, the part of
    them up to its final length = reserved, the part beyond = rounding)."""
    w = req.written
    empty = reserved = rounding = 0
    if not w % block_size:
        return 0, 0, 0
    for g, k in enumerate(gspec):
        t = req.tables[g]
        if specs[k].is_state or not t or not t[-1]:
            continue
        end = len(t) * block_size
        empty += end - w
        reserved += max(min(end, req.final_len) - w, 0)
        rounding += max(end - max(req.final_len, w), 0)
    return empty, reserved, rounding


class HybridView(Protocol):
    """What the checks read of the policy (kvcore/policies/vllm_hybrid.py)."""

    pool: BlockPool
    page_size: int
    groups: HybridGroups
    specs: tuple[GroupSpec, ...]
    gspec: list[int]
    group_of: np.ndarray
    hasher: ChainHasher
    mamba_cache_mode: str
    max_context_len: int

    @property
    def reqs(self) -> dict[int, HybridReq]: ...

    @property
    def holders(self) -> list[dict[int, list[int]]]: ...

    def breakdown(self, head_reservation: int) -> MemoryBreakdown: ...


def check_hybrid_invariants(p: HybridView) -> None:
    """The shared pool's equations (BlockPool.check_invariants), and:

    * ref_cnt[b] == the live block-table entries naming b; a block is in one group;
    * the index `holders` holds exactly the hashed blocks, each under its group and hash;
    * per request and attention group: one position per block of written tokens, every block
      the next token needs (from the kind's skip point on) real, nothing kept before the
      skip point of the last call; a full-attention group's table has no null;
    * per request and state group (modes align / all): one position per block, the running
      (last) block real, nothing real before the last call's skip point; mode none: exactly
      one block once anything is written;
    * the breakdown sums to the capacity."""
    pool, bs = p.pool, p.page_size
    pool.check_invariants()
    holders = np.zeros(p.groups.num_blocks + 1, dtype=np.int64)
    for rid, r in p.reqs.items():
        w = r.written
        if len(r.chain) and not np.array_equal(
                p.hasher.chain(NONE_HASH, r.ids[: len(r.chain) * bs]), r.chain):
            raise InvariantError(f"vllm hybrid: request {rid} keeps a wrong hash chain")
        for g, k in enumerate(p.gspec):
            spec, t = p.specs[k], r.tables[g]
            real = [b for b in t if b]
            if len(set(real)) != len(real):
                raise InvariantError(f"vllm hybrid: request {rid} holds a block twice")
            if any(p.group_of[b] != g for b in real):
                raise InvariantError(f"vllm hybrid: request {rid} group {g} holds another "
                                     "group's block")
            holders[real] += 1
            if spec.is_state and p.mamba_cache_mode == "none":
                if len(t) != (1 if w else 0):
                    raise InvariantError(f"vllm hybrid: request {rid} holds {len(t)} state "
                                         "blocks in mode none")
                continue
            if len(t) != cdiv(w, bs):
                raise InvariantError(f"vllm hybrid: request {rid} group {g} has {len(t)} "
                                     f"positions for {w} tokens")
            lo = spec.skipped_tokens(r.skip_at) // bs
            if any(t[:lo]):
                raise InvariantError(f"vllm hybrid: request {rid} group {g} keeps a block "
                                     "before its skip point")
            if spec.is_state:
                if w and not t[-1]:
                    raise InvariantError(f"vllm hybrid: request {rid} lost its running state")
            elif not all(t[spec.skipped_tokens(w) // bs:]):
                raise InvariantError(f"vllm hybrid: request {rid} group {g} freed a block "
                                     "its window still needs")
    for b in np.flatnonzero(pool.ref_cnt != holders).tolist():
        raise InvariantError(f"vllm hybrid: block {b} ref {pool.ref_cnt[b]} != holders "
                             f"{holders[b]}")
    indexed = sorted(b for index in p.holders for bl in index.values() for b in bl)
    if indexed != np.flatnonzero(pool.is_hashed).tolist():
        raise InvariantError("vllm hybrid: the (group, hash) index is out of sync with the pool")
    for g, index in enumerate(p.holders):
        for h, bl in index.items():
            for b in bl:
                if p.group_of[b] != g or int(pool.block_hash[b]) != h:
                    raise InvariantError(f"vllm hybrid: block {b} indexed under a wrong key")
    p.breakdown(p.max_context_len).check_invariants()
