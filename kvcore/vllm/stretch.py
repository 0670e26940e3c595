"""The `vllm` manager's decode stretch: n decode steps planned in one pass and applied with the
pool calls of n `decode` calls, so block tables, the free queue's order, lazy evictions and the
breakdown after each step are those of stepping.

What one decode step of a request with w tokens written does (kvcore/vllm/manager.py `decode`,
vLLM's `remove_skipped_blocks` then `allocate_slots`), per KV cache group:

* a new block at position w // block_size when w is a multiple of the block size, in every
  allocating group (kvcore/vllm/group_rules.py; a Mamba group in mode `none` holds its one
  block from the first token), popped step by step, request by request, group by group;
* in a group that frees blocks, those the next token no longer needs, positions descending:
  at the stretch's first step those between the request's last skip point and
  `skipped_tokens(w)` (a prefill may have moved it far), at every later step the block
  ending where `skipped_tokens` crosses a block boundary (`GroupRule.stretch_frees`).

Stepping frees first and then pops new blocks off the free queue's head. Here every pop is made
first and every free after, in stepping's order: the same result as long as no pop reaches a
block freed inside the stretch, which is guaranteed when the stretch's new blocks fit in the
free blocks at its start (`decode_cost` <= `available_tokens`, which the engine checks), since
freed blocks join the queue's tail behind all of those.

A block that goes back to the free queue during a stretch raises the free memory admission
sees (a stretch assumes decoding only takes memory): `release_step` names the first such step,
and the fast-forward ends a stretch there while a request waits (`steps_before_release`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from kvcore.contract.breakdown import PARTS
from kvcore.contract.validation import non_negative_int
from kvcore.vllm.block_pool import BlockPool
from kvcore.vllm.block_table import PageTable
from kvcore.vllm.group_rules import Free, GroupRule, MambaState
from kvcore.vllm.kv_cache_groups import KVCacheGroups
from kvcore.vllm.request import Request

_TOKENS, _CACHED, _RESERVED, _INTERNAL, _FREE = (
    PARTS.index(p) for p in ("token_states", "cached", "reserved", "internal", "free"))


class Manager(Protocol):
    """What a stretch reads of the manager (kvcore/vllm/manager.py `VLLMManager`)."""

    page_size: int
    capacity: int
    slot_groups: int
    attention_groups: int
    rules: list[GroupRule]
    pool: BlockPool
    groups: KVCacheGroups
    page_table: PageTable
    requests: dict[int, Request]

    def tails(self, req: Request) -> tuple[int, int, int]: ...


class Stretch:
    """The pool operations of n decode steps of `reqs` (read-only until `apply`): a new block
    at every (step, request) where the request's position is a multiple of the block size
    (`starts`, in row-major order the pop order), one per allocating group, and the frees of
    the groups that free blocks (`frees`, in stepping's order)."""

    def __init__(self, m: Manager, reqs: list[Request], n: int) -> None:
        self.m, self.reqs, self.n = m, reqs, n
        bs = m.page_size
        self.w0 = np.fromiter((r.written for r in reqs), dtype=np.int64, count=len(reqs))
        self.pos = self.w0[None, :] + np.arange(n, dtype=np.int64)[:, None]  # (step, request)
        self.starts = self.pos % bs == 0
        self.allocating = [rule for rule in m.rules if rule.allocates]
        self.need = int(np.count_nonzero(self.starts)) * len(self.allocating)
        frees: list[Free] = []
        for rule in m.rules:
            if rule.skips:
                for ri, req in enumerate(reqs):
                    frees += rule.stretch_frees(req.tables[rule.gid], req.written, req.skip_at,
                                                n, ri)
        frees.sort()
        self.frees = frees

    def idle_events(self) -> list[tuple[int, bool, int]]:
        """(step, hashed, group) of each free that leaves its block with no holder, in free
        order: a shared block (a prefix hit held by several requests) goes idle at its last
        holder's free. A block the stretch allocates is unhashed (a pop drops the hash); a
        held one keeps its hash through the stretch (nothing is cached while decoding: the
        ids come at the end)."""
        pool = self.m.pool
        ref: dict[int, int] = {}
        out = []
        for j, _ri, g, _pos, b in self.frees:
            if b < 0:
                out.append((j, False, g))
                continue
            left = ref.get(b, int(pool.ref_cnt[b])) - 1
            ref[b] = left
            if not left:
                out.append((j, bool(pool.is_hashed[b]), g))
        return out

    def release_step(self) -> int:
        """The first step (1-based) after which a block is back in the free queue; n + 1:
        none."""
        idle = self.idle_events() if self.frees else []
        return idle[0][0] + 1 if idle else self.n + 1

    def popped(self) -> np.ndarray:
        """Blocks popped through each step (1-based: entry j - 1 after step j)."""
        return np.cumsum(np.count_nonzero(self.starts, axis=1)) * len(self.allocating)

    def profile(self, head_reservation: int) -> np.ndarray:
        """The breakdown (PARTS columns) after each step, as `breakdown` would give it then.
        New blocks come off the free-queue head in order; a hashed one popped there is a lazy
        eviction, so `cached` (not `free`) shrinks by that block."""
        m, n, bs, pool = self.m, self.n, self.m.page_size, self.m.pool
        non_negative_int("head_reservation", head_reservation)
        popped = self.popped()
        evicted = pool.cached_among_next(int(popped[-1]) if n else 0)[popped]
        idle = np.zeros(n, dtype=np.int64)
        idle_hashed = np.zeros(n, dtype=np.int64)
        for j, hashed, _g in self.idle_events() if self.frees else ():
            idle[j] += 1
            idle_hashed[j] += hashed
        free = pool.get_num_free_blocks() - popped + np.cumsum(idle)
        cached = pool.num_cached_free - evicted + np.cumsum(idle_hashed)
        tokens = (m.groups.num_blocks - free) * bs
        a = m.attention_groups  # each holds the unwritten tail of its last block
        w = self.pos + 1
        end = -(-w // bs) * bs
        final = np.fromiter((r.final_len for r in self.reqs), dtype=np.int64,
                            count=len(self.reqs))[None, :]
        tokens -= (end - w).sum(axis=1) * a
        reserved = np.maximum(np.minimum(end, final) - w, 0).sum(axis=1) * a
        rounding = np.maximum(end - np.maximum(final, w), 0).sum(axis=1) * a
        # requests outside the stretch (none in the engine's stretches: the stretch's
        # requests are distinct and as many as the live ones) keep their tails
        if len(m.requests) != len(self.reqs):
            inside = {id(r) for r in self.reqs}
            for other in m.requests.values():
                if id(other) not in inside:
                    empty, res, rnd = m.tails(other)
                    tokens, reserved, rounding = tokens - empty, reserved + res, rounding + rnd
        g = m.slot_groups
        out = np.zeros((n, len(PARTS)), dtype=np.int64)
        out[:, _TOKENS] = tokens // g
        out[:, _CACHED] = cached * bs // g
        out[:, _RESERVED] = reserved // g
        out[:, _INTERNAL] = rounding // g
        out[:, _FREE] = m.capacity - out.sum(axis=1)
        return out

    def pops(self) -> tuple[np.ndarray, np.ndarray]:
        """(step, group) of each block popped, in pop order."""
        steps = np.nonzero(self.starts)[0]
        gids = np.array([rule.gid for rule in self.allocating], dtype=np.int64)
        return np.repeat(steps, len(gids)), np.tile(gids, len(steps))

    def apply(self) -> None:
        """Make the plan's pool calls: all pops, then all frees in stepping's order (see the
        module notes for why that is stepping's result), and update the requests."""
        m, n, reqs, pool = self.m, self.n, self.reqs, self.m.pool
        new = pool.get_new_blocks(self.need)
        if self.allocating:
            per_event = new.reshape(-1, len(self.allocating))
            first = self.allocating[0].gid
            last = np.fromiter((r.tables[first].last for r in reqs), dtype=np.int64,
                               count=len(reqs))
            # the events (step, request) in row-major order, regrouped request by request
            _, owners = np.nonzero(self.starts)
            order = np.argsort(owners, kind="stable")
            ends = np.cumsum(np.bincount(owners, minlength=len(reqs))).tolist()
            for a, rule in enumerate(self.allocating):
                col, start = per_event[order, a], 0
                for req, end in zip(reqs, ends, strict=True):
                    if end > start:
                        req.tables[rule.gid].append(col[start:end])
                    start = end
            m.page_table.write_grid(reqs, self.pos, per_event[:, 0], last)
        bs = m.page_size
        for state in m.rules:  # a state group's blocks receive the states of the steps
            if isinstance(state, MambaState):  # that end on a block boundary
                for req, w in zip(reqs, self.w0.tolist(), strict=True):
                    req.tables[state.gid].states.update(range(w // bs, (w + n) // bs))
        self._free()
        for req in reqs:
            req.written += n
            req.skip_at = req.written - 1

    def _free(self) -> None:
        """The planned frees: each position nulled, its block (a stretch's own: read from
        the table) back to the pool, one call per step and request as stepping makes them."""
        if not self.frees:
            return
        freed = []
        for _j, ri, g, neg, b in self.frees:
            table = self.reqs[ri].tables[g]
            freed.append(table.block_at(-neg) if b < 0 else b)
            table.put(-neg, 0)
        arr = np.array(freed, dtype=np.int64)
        pool = self.m.pool
        if len(np.unique(arr)) == len(arr):  # distinct: one call is stepping's calls
            pool.free_blocks(arr)
            return
        at = 0  # a shared block freed twice: stepping's calls, one per step and request
        while at < len(arr):
            key = self.frees[at][:2]
            nxt = at
            while nxt < len(arr) and self.frees[nxt][:2] == key:
                nxt += 1
            pool.free_blocks(arr[at:nxt])
            at = nxt


__all__ = ["Stretch"]
