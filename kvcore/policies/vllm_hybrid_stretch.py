"""The hybrid `vllm` policy's decode stretch: n decode steps planned in one pass and applied
with the pool calls of n `decode` calls, so block tables, the free queue's order, lazy
evictions and the breakdown after each step are those of stepping.

What one decode step of a request with w tokens written does (kvcore/policies/vllm_hybrid.py,
vLLM's `remove_skipped_blocks` then `allocate_slots`), per KV cache group:

* a new block at position w // block_size when w is a multiple of the block size (every
  group but a Mamba group in mode `none`, which holds its one block from the first token);
* the blocks the next token no longer needs are freed, positions descending: at the stretch's
  first step those between the request's last skip point and `skipped_tokens(w)` (a prefill
  may have moved it far), at every later step the block ending where `skipped_tokens` crosses
  a block boundary (`GroupSpec.first_skipping` names the step).

Stepping frees first and then pops new blocks off the free queue's head, step by step, request
by request. Here every pop is made first and every free after, in stepping's order: the same
result as long as no pop reaches a block freed inside the stretch, which is guaranteed when the
stretch's new blocks fit in the free blocks at its start (`decode_cost` <= `available_tokens`,
which the engine checks), since freed blocks join the queue's tail behind all of those.

A block that goes back to the free queue during a stretch raises the free memory admission
sees (a stretch assumes decoding only takes memory): `release_step` names the first such step,
and the fast-forward ends a stretch there while a request waits (`steps_before_release`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from kvcore.breakdown import MemoryBreakdown
from kvcore.policies.capabilities import DecodeStretch, PoolUsage
from kvcore.policies.vllm_hybrid_state import HybridReq, HybridView, partial_tails
from kvcore.validation import cdiv


class StretchView(HybridView, Protocol):
    """What the stretch reads of the policy (kvcore/policies/vllm_hybrid.py), beyond the
    invariant checks' view."""

    capacity: int
    slot_groups: int
    alloc_groups: int

    def pool_usage(self) -> dict[str, PoolUsage]: ...
    def available_tokens(self) -> int: ...
    def _req(self, rid: int) -> HybridReq: ...
    def _slots(self, blocks: int) -> int: ...


@dataclass
class StretchPlan:
    """The pool operations of n decode steps of `reqs`, in stepping's order.

    alloc: (step, request index, group, position) of each new block, in pop order;
    frees: (step, request index, group, -position, block) of each freed block, in free order
    (block -1: one the stretch itself allocates at that position)."""

    n: int
    reqs: list[HybridReq]
    alloc: list[tuple[int, int, int, int]]
    frees: list[tuple[int, int, int, int, int]]


def plan_stretch(p: StretchView, reqs: list[HybridReq], n: int) -> StretchPlan:
    """Every block the n steps allocate and free (read-only)."""
    bs, mode = p.page_size, p.mamba_cache_mode
    alloc: list[tuple[int, int, int, int]] = []
    frees: list[tuple[int, int, int, int, int]] = []
    for ri, req in enumerate(reqs):
        w0 = req.written
        for g, k in enumerate(p.gspec):
            spec = p.specs[k]
            if spec.is_state and mode == "none":
                continue  # one state block from the first token on, nothing skipped
            t = req.tables[g]
            alloc.extend((j, ri, g, (w0 + j) // bs) for j in range((-w0) % bs, n, bs))
            skip0 = spec.skipped_tokens(w0) // bs
            hi = min(skip0, len(t))
            if spec.is_state:  # from the last call's skip point, passing over nulls
                lo = spec.skipped_tokens(req.skip_at) // bs
                frees.extend((0, ri, g, -i, t[i]) for i in range(hi - 1, lo - 1, -1) if t[i])
            else:  # down to the first null: everything before it was freed already
                for i in range(hi - 1, -1, -1):
                    if not t[i]:
                        break
                    frees.append((0, ri, g, -i, t[i]))
            # later steps: every position from the first step's skip point on is real (the
            # invariants), one block freed as the skip point passes its end
            for pos in range(skip0, spec.skipped_tokens(w0 + n - 1) // bs):
                j = spec.first_skipping((pos + 1) * bs) - w0
                frees.append((j, ri, g, -pos, t[pos] if pos < len(t) else -1))
    alloc.sort()
    frees.sort()
    return StretchPlan(n, reqs, alloc, frees)


def _idle_events(p: StretchView, plan: StretchPlan) -> list[tuple[int, bool, int]]:
    """(step, hashed, group) of each free that leaves its block with no holder, in free order: a
    shared block (a prefix hit held by several requests) goes idle at its last holder's free.
    A block the stretch allocates is unhashed (a pop drops the hash); a held one keeps its
    hash through the stretch (nothing is cached while decoding: the ids come at the end)."""
    ref: dict[int, int] = {}
    out = []
    for j, _ri, g, _pos, b in plan.frees:
        if b < 0:
            out.append((j, False, g))
            continue
        left = ref.get(b, int(p.pool.ref_cnt[b])) - 1
        ref[b] = left
        if not left:
            out.append((j, bool(p.pool.is_hashed[b]), g))
    return out


def release_step(p: StretchView, plan: StretchPlan) -> int:
    """The first step (1-based) after which a block is back in the free queue; n + 1: none."""
    idle = _idle_events(p, plan)
    return idle[0][0] + 1 if idle else plan.n + 1


def stretch_profile(p: StretchView, plan: StretchPlan, head_reservation: int) -> np.ndarray:
    """The breakdown (PARTS columns) after each of the plan's steps, as `breakdown` would
    give it then (read-only)."""
    n, bs, pool = plan.n, p.page_size, p.pool
    pops = np.zeros(n, dtype=np.int64)
    np.add.at(pops, [a[0] for a in plan.alloc], 1)
    popped = np.cumsum(pops)
    evicted = pool.cached_among_next(int(popped[-1]) if n else 0)[popped]
    idle = np.zeros(n, dtype=np.int64)
    idle_hashed = np.zeros(n, dtype=np.int64)
    for j, hashed, _g in _idle_events(p, plan):
        idle[j] += 1
        idle_hashed[j] += hashed
    free = pool.get_num_free_blocks() - popped + np.cumsum(idle)
    cached = pool.num_cached_free - evicted + np.cumsum(idle_hashed)
    tokens = (p.groups.num_blocks - free) * bs
    reserved = np.zeros(n, dtype=np.int64)
    rounding = np.zeros(n, dtype=np.int64)
    # an attention group's running block is real while decoding (the next token's own KV is
    # in its window or chunk), so each attention group has the unwritten tail of its last
    # block; a state block holds a state, not tokens
    attn = sum(p.specs[k].count for k in range(len(p.specs)) if not p.specs[k].is_state)
    steps = np.arange(1, n + 1, dtype=np.int64)
    for req in plan.reqs:
        w = req.written + steps
        end = -(-w // bs) * bs
        part = (w % bs != 0) * attn
        tokens -= (end - w) * part
        reserved += np.maximum(np.minimum(end, req.final_len) - w, 0) * part
        rounding += np.maximum(end - np.maximum(req.final_len, w), 0) * part
    # requests outside the stretch (none in the engine's stretches) keep their tails
    inside = {id(r) for r in plan.reqs}
    for other in p.reqs.values():
        if id(other) not in inside:
            empty, res, rnd = partial_tails(other, p.gspec, p.specs, bs)
            tokens, reserved, rounding = tokens - empty, reserved + res, rounding + rnd
    g = p.slot_groups
    out = np.empty((n, 6), dtype=np.int64)
    for j in range(n):
        t, c, r, o = (int(tokens[j]) // g, int(cached[j]) * bs // g, int(reserved[j]) // g,
                      int(rounding[j]) // g)
        out[j] = MemoryBreakdown.for_pages(p.capacity, t, c, r, o,
                                           p.capacity - t - c - r - o).as_array()
    return out


def stretch_pools(p: StretchView, plan: StretchPlan) -> dict[str, np.ndarray]:
    """Per pool kind, its (used, cached) bytes after each of the plan's steps, as
    `pool_usage` would give them then ((steps, 2), read-only): a pop adds a used block to its
    group's kind and, when it evicts, takes a used and cached one from the evicted block's
    kind; a block left with no holder stays used as cache when hashed, else leaves."""
    n, bb = plan.n, p.groups.block_bytes
    kinds = [p.specs[k].pool_kind for k in p.gspec]
    names = list(p.pool_usage())
    col = {kind: i for i, kind in enumerate(names)}
    d = np.zeros((len(names), n, 2), dtype=np.int64)
    popped = p.pool.peek_free(len(plan.alloc)).tolist() if plan.alloc else []
    for (j, _ri, g, _pos), b in zip(plan.alloc, popped, strict=True):
        d[col[kinds[g]], j, 0] += 1
        if p.pool.is_hashed[b]:
            d[col[kinds[int(p.group_of[b])]], j] -= 1
    for j, hashed, g in _idle_events(p, plan):
        d[col[kinds[g]], j, 1 if hashed else 0] += 1 if hashed else -1
    now = p.pool_usage()
    return {kind: np.array([now[kind].used_bytes, now[kind].cached_bytes], dtype=np.int64)
            + np.cumsum(d[col[kind]], axis=0) * bb for kind in names}


def apply_stretch(p: StretchView, plan: StretchPlan) -> None:
    """Make the plan's pool calls: all pops, then all frees in stepping's order (see the
    module notes for why that is stepping's result), and update the requests."""
    bs, n, pool = p.page_size, plan.n, p.pool
    new = pool.get_new_blocks(len(plan.alloc)).tolist() if plan.alloc else []
    made: dict[tuple[int, int, int], int] = {}
    for (_j, ri, g, pos), b in zip(plan.alloc, new, strict=True):
        made[ri, g, pos] = b
        p.group_of[b] = g
    for req in plan.reqs:
        end = cdiv(req.written + n, bs)
        for g, k in enumerate(p.gspec):
            spec = p.specs[k]
            if spec.is_state and p.mamba_cache_mode == "none":
                continue
            t = req.tables[g]
            t.extend([0] * (end - len(t)))
            if spec.is_state:  # the blocks receiving a boundary state: each one filled
                w0 = req.written
                req.states[g].update(range(cdiv(w0 + 1, bs) - 1, (w0 + n) // bs))
    for (_j, ri, g, pos), b in zip(plan.alloc, new, strict=True):
        plan.reqs[ri].tables[g][pos] = b
    freed = []
    for _j, ri, g, neg, b in plan.frees:
        block = made[ri, g, -neg] if b < 0 else b
        plan.reqs[ri].tables[g][-neg] = 0
        freed.append(block)
    if freed:
        arr = np.array(freed, dtype=np.int64)
        if len(np.unique(arr)) == len(arr):  # distinct: one call is stepping's calls
            pool.free_blocks(arr)
        else:  # a shared block freed twice: stepping's calls, one per step and request
            at = 0
            while at < len(arr):
                key = plan.frees[at][:2]
                nxt = at
                while nxt < len(arr) and plan.frees[nxt][:2] == key:
                    nxt += 1
                pool.free_blocks(arr[at:nxt])
                at = nxt
    for req in plan.reqs:
        req.written += n
        req.skip_at = req.written - 1


class HybridDecodeStretch(DecodeStretch):
    """The DecodeStretch capability of `VLLMHybridPolicy` (kvcore/policies/vllm_hybrid.py),
    which derives from it."""

    def _me(self) -> StretchView:
        return cast(StretchView, self)

    def _stretch(self, rids: Sequence[int], n: int) -> StretchPlan | None:
        """The plan of n decode steps; None while a request knows ids beyond its written
        tokens (stepping would hash blocks as they fill: such a stretch is stepped)."""
        p = self._me()
        reqs = [p._req(r) for r in rids]
        return None if any(len(r.ids) > r.written for r in reqs) else plan_stretch(p, reqs, n)

    def decode_cost(self, rids: Sequence[int], n: int) -> int:
        """The new blocks of n steps (one per allocating group each time a request reaches
        a new block) as slots, rounded up: fitting in `available_tokens` means fitting in
        the free blocks, which the batched pops need (see the module notes)."""
        p = self._me()
        reqs = [p._req(r) for r in rids]
        if any(len(r.ids) > r.written for r in reqs):
            return p.capacity + 1  # stepped: see _stretch
        bs = p.page_size
        blocks = sum(cdiv(r.written + n, bs) - cdiv(r.written, bs) for r in reqs)
        return cdiv(blocks * p.alloc_groups * bs, p.slot_groups)

    def fresh_tokens(self) -> int:
        p = self._me()
        return p._slots(p.pool.fresh_blocks())

    def steps_before_release(self, rids: Sequence[int], n: int) -> int:
        plan = self._stretch(rids, n)
        return n if plan is None else min(n, release_step(self._me(), plan))

    def decode_profile(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        plan = self._stretch(rids, n)
        if plan is None:
            raise ValueError("decode_profile: a request knows ids beyond its written tokens")
        return stretch_profile(self._me(), plan, head_reservation)

    def decode_steps(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """n decode steps with the pool calls of n `decode` calls (see the module notes)."""
        p = self._me()
        self.check_distinct("decode", rids)
        reqs = [p._req(r) for r in rids]
        self.check_decode_args(rids, [r.written for r in reqs], p.max_context_len, steps=n)
        if self.decode_cost(rids, n) > p.available_tokens():
            raise ValueError("decode_steps needs decode_cost <= available_tokens")
        plan = plan_stretch(p, reqs, n)
        profile = stretch_profile(p, plan, head_reservation)
        self._stretch_pools = stretch_pools(p, plan)
        apply_stretch(p, plan)
        return profile

    def stretch_pool_usage(self) -> dict[str, np.ndarray]:
        """Per pool kind, (used, cached) bytes after each step of the last `decode_steps`
        ((steps, 2)): the Recorder integrates them step by step, as stepping does."""
        return getattr(self, "_stretch_pools", {})
