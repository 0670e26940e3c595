"""The `vllm` manager on hybrid layouts (kvcore/vllm/manager.py, group_rules.py,
kv_cache_groups.py, coordinator.py, stretch.py).

Worked examples a reader can redo by hand on a three-group toy layout, the per-kind hit finders,
the sizes against the planner (`vllm_plan`), a differential test against the full-attention
`vllm` policy, and a hypothesis state machine checking the invariants after every step.
Cost: about 10 s in all on a loaded 2-core machine (the state machine, whose `stretch` rule
checks `decode_steps` against a stepped copy, about 8 s; the differential test 2 s).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcore.contract.capabilities import PoolKinds, PrefixCache
from kvcore.model.hybrid_plan import vllm_plan
from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.layers import HybridLayout, LayerGroup
from kvcore.model.vllm_rules import vllm_rules
from kvcore.policies import PolicyConfig, make_policy
from kvcore.vllm.block_hash import NONE_HASH
from kvcore.vllm.kv_cache_groups import (
    GroupSpec,
    chunked_hit,
    full_hit,
    longest_hit,
    sliding_hit,
    state_hit,
)
from kvcore.vllm.manager import VLLMManager
from kvcore.vllm.pool_kinds import PooledVLLMManager
from tests.kvcore.vllm_views import blocks, tables

# one token in one attention layer: 2 x 1 head x 8 x 2 B = 32 B. The linear layer's state:
# conv (2 - 1) x (2 x 4 + 4) x 2 B = 24 B, recurrent 1 x 4 x 4 x 2 B = 32 B: 56 B, so vLLM's
# block is 16 x cdiv(56, 16 x 32) = 16 tokens and one page is 16 x 32 = 512 B.
FULL1 = LayerGroup("full", 1, kv_heads=1, head_dim=8)
SWA1 = LayerGroup("sliding", 1, kv_heads=1, head_dim=8, window=32)
LIN1 = LayerGroup("linear", 1, num_k_heads=1, num_v_heads=1, k_head_dim=4, v_head_dim=4,
                  conv_kernel=2)
TOY = HybridLayout((FULL1, SWA1, LIN1))
PAGE = 512


def toy(mode: str = "align", blocks: int = 30, layout: HybridLayout = TOY,
        page_size: int = 16, ctx: int = 256) -> PooledVLLMManager:
    cfg = PolicyConfig(kv_tokens=0, page_size=page_size, max_context_len=ctx, max_requests=8,
                       layout=layout, kv_bytes=blocks * PAGE, mamba_cache_mode=mode)
    pol = make_policy("vllm", cfg)
    assert isinstance(pol, PooledVLLMManager)
    return pol


def run_prompt(p: PooledVLLMManager, rid: int, ids: np.ndarray, out: int = 2,
               chunk: int = 1000) -> int:
    """Admit, prefill in `chunk`-token steps, decode `out` - 1 tokens, finish: the hit."""
    res = p.admit(rid, ids, len(ids) + out - 1, out)
    assert res is not None
    w = res.cached_len
    while w < len(ids):
        w = min(w + chunk, len(ids))
        assert p.extend([rid], [w])
        p.check_invariants()
    for _ in range(out - 1):
        assert p.decode([rid])
    p.check_invariants()
    p.finish(rid, np.concatenate([ids, 900_000 + np.arange(out)]))
    p.check_invariants()
    return res.cached_len


# -- worked examples ---------------------------------------------------------------------------

def test_toy_layout_groups_blocks_and_a_prefill_by_hand() -> None:
    p = toy()
    g = p.groups
    # three kinds of one layer each: groups of 1 layer, 3 groups; 30 x 512 B = 30 blocks of 16
    assert (g.block_size, g.page_bytes, g.group_size, g.num_blocks) == (16, 512, 1, 30)
    assert [(s.kind, s.count) for s in g.specs] == [("full", 1), ("sliding", 1), ("linear", 1)]
    # slots: 30 blocks x 16 tokens over the 2 attention groups (full, sliding); the linear
    # group's state blocks come on top of a request's tokens
    assert p.slot_groups == 2 and p.capacity == 30 * 16 // 2
    assert isinstance(p, PrefixCache) and isinstance(p, PoolKinds)
    ids = np.arange(50)
    assert p.admit(0, ids, 51, 2) is not None
    assert p.extend([0], [50])
    t = tables(p, 0)
    # full: cdiv(50, 16) = 4 blocks; sliding: 4 (all of the chunk's tokens are computed);
    # linear (align): the running state at position 3 and the state at 48 (position 2)
    assert [len([b for b in x if b]) for x in t] == [4, 4, 2]
    assert t[2][:2] == [0, 0] and all(t[2][2:])
    assert p.available_tokens() == (30 - 10) * 16 // 2  # slots over the 2 attention groups
    assert p.decode([0])  # 51 tokens; the next token needs 51 - 32 + 1 = 20 on: block 1 on
    t = tables(p, 0)
    assert t[1][0] == 0 and all(t[1][1:])  # the sliding group freed block 0
    assert t[2] == [0, 0, 0, t[2][3]]  # the state at 48 was freed (cached), the running kept
    # cached now: full 0-2, sliding 0-2 (block 0 freed but hashed), linear position 2
    assert p.evictable_tokens() == 2 * 16 // 2  # slots: blocks x 16 over 2 attention groups
    p.finish(0, np.arange(52))
    p.check_invariants()
    assert p.available_tokens() == 30 * 16 // 2 and p.evictable_tokens() == 7 * 16 // 2


@pytest.mark.parametrize(("mode", "hit"), [("align", 0), ("all", 32), ("none", 0)])
def test_mamba_mode_decides_the_hit_of_a_shorter_shared_prefix(mode: str, hit: int) -> None:
    """A's 50-token prompt caches full and sliding blocks 0-2 and states at 48 (align) or at
    16, 32, 48 (all); B shares A's first 40 tokens: full attention and the sliding window
    (2 blocks from the right) accept 32 tokens, the linear layers only a cached state at or
    below 32: none in align (the cliff), the one at 32 in all; mode none caches nothing."""
    p = toy(mode)
    run_prompt(p, 0, np.arange(50))
    b = np.concatenate([np.arange(40), 5000 + np.arange(20)])
    assert p.peek_prefix(b[:-1]) == hit
    assert run_prompt(p, 1, b) == hit


@pytest.mark.parametrize(("mode", "lost"), [("align", 32), ("all", 0), ("none", 0)])
def test_admission_names_the_state_rules_cut(mode: str, lost: int) -> None:
    """The shorter shared prefix above (issue 38, item 4): full attention and the window hold
    32 tokens of B; align keeps no state there, so the 32 are lost to the state-boundary
    rule; all keeps one (hit); none caches nothing, which the policy says as a whole."""
    p = toy(mode)
    run_prompt(p, 0, np.arange(50))
    b = np.concatenate([np.arange(40), 5000 + np.arange(20)])
    res = p.admit(1, b, 61, 2)
    assert (res.window_lost, res.state_lost) == (0, lost)
    assert res.cached_len + res.state_lost == (0 if mode == "none" else 32)
    assert p.caches_no_prefix() == (mode == "none")


def indexed_hashes(p: PooledVLLMManager, gid: int) -> set[int]:
    """The hashes group `gid`'s index holds."""
    return set(p.pool.block_hash[p.pool.indexes[gid].gen > 0].tolist())


def test_a_state_block_the_pool_evicted_is_capacity_not_the_state_rule() -> None:
    """A (64 tokens, states kept at 20, 40, 60's boundaries) then B fill a 16-block pool: the
    LRU queue evicts A's state blocks (freed first) while its full and sliding blocks stay.
    A again finds its KV but no state: the pool's eviction, so neither rule's cut."""
    p = toy("align", blocks=16)
    run_prompt(p, 0, np.arange(64), chunk=20)
    run_prompt(p, 1, 5000 + np.arange(40), chunk=40)
    assert p.state_evictions is not None
    gone = p.state_evictions.gone[2]
    assert gone and not indexed_hashes(p, 2) & gone
    p.check_invariants()
    res = p.admit(2, np.concatenate([np.arange(64), [1, 2, 3]]), 70, 2)
    assert (res.cached_len, res.window_lost, res.state_lost) == (0, 0, 0)
    # full and window alone: held
    assert p.coordinator.peek(np.arange(66), 66).alone[:2] == [64, 64]


def test_a_state_cached_twice_loses_nothing_while_one_copy_stays() -> None:
    """Two requests with one 48-token prompt run side by side: each caches its own state
    block at 48 (vLLM keeps duplicates: both computed it). C's 24 new tokens make the pool
    evict one copy; the other still serves the hit, so no state is recorded as evicted."""
    p = toy("align", blocks=20)
    ids = np.arange(48)
    for rid in (0, 1):
        assert p.admit(rid, ids, 50, 2) is not None
    assert p.extend([0, 1], [48, 48]) and p.decode([0, 1])
    for rid in (0, 1):
        p.finish(rid, np.concatenate([ids, 900_000 + np.arange(2)]))
    a = p.hasher.chain(NONE_HASH, ids).tolist()
    states = [h for h in p.pool.block_hash[p.pool.indexes[2].gen > 0].tolist() if h in a]
    assert len(states) == 2 and len(set(states)) == 1  # one hash, two blocks
    run_prompt(p, 2, 5000 + np.arange(24))
    states = [h for h in p.pool.block_hash[p.pool.indexes[2].gen > 0].tolist() if h in a]
    assert len(states) == 1  # one copy evicted, one kept
    assert p.state_evictions is not None and not p.state_evictions.gone[2]
    p.check_invariants()
    assert p.peek_prefix(np.concatenate([ids, [1]])) == 48


def test_an_evicted_state_is_forgotten_with_its_full_attention_kv() -> None:
    """After the case above, C (40 new tokens) makes the pool evict A's full-attention blocks
    too: no content is left for the evicted states to stand beside, so their record goes
    (it stays within the cached full-attention blocks; `check_invariants` checks it)."""
    p = toy("align", blocks=16)
    run_prompt(p, 0, np.arange(64), chunk=20)
    run_prompt(p, 1, 5000 + np.arange(40), chunk=40)
    assert p.state_evictions is not None and p.state_evictions.gone[2]
    run_prompt(p, 2, 9000 + np.arange(40), chunk=40)
    a = set(p.hasher.chain(NONE_HASH, np.arange(64)).tolist())
    assert not indexed_hashes(p, 0) & a
    assert not p.state_evictions.gone[2]


def test_align_hits_at_the_cached_boundary_and_counts_per_kind() -> None:
    p = toy("align")
    run_prompt(p, 0, np.arange(50))
    b = np.concatenate([np.arange(48), 7000 + np.arange(12)])  # shares 48 = 3 blocks
    assert run_prompt(p, 1, b) == 48
    u = p.pool_usage()
    # queried: 49 + 59 prompt tokens (the last one is always recomputed); alone, full
    # attention and the sliding window accept 48 of B, the linear state 48 too
    assert {k: (v.hit_tokens, v.queried_tokens) for k, v in u.items()} == {
        "full": (48, 108), "swa": (48, 108), "mamba": (48, 108)}
    # both requests finished: the full group's 3 hashed blocks stay as cache (used = cache)
    assert u["full"].capacity_bytes == 30 * 512
    assert u["full"].used_bytes == u["full"].cached_bytes == 3 * 512


def test_a_prompt_within_one_block_never_hits() -> None:
    """Block granularity: 16 tokens, the last recomputed, leave 15 to match: 0 blocks."""
    p = toy("all", layout=HybridLayout((FULL1, SWA1)))
    run_prompt(p, 0, np.arange(16))
    assert run_prompt(p, 1, np.arange(16)) == 0
    assert run_prompt(p, 2, np.arange(17)) == 16


def test_freed_sliding_blocks_still_hit_until_reused() -> None:
    """Blocks that left the window go to the free queue hashed: a later identical prompt
    finds them; once allocations pop them (eviction), the full group's hit ends there."""
    p = toy("all", layout=HybridLayout((FULL1, SWA1)), blocks=20)
    run_prompt(p, 0, np.arange(100), out=30)  # 7 full + 7 sliding + 1 decode block, freed
    assert run_prompt(p, 1, np.arange(100)) == 96
    run_prompt(p, 2, 50_000 + np.arange(150))  # 10 + 10 blocks: evicts every cached block
    assert p.peek_prefix(np.arange(99)) == 0


# -- the finders -------------------------------------------------------------------------------

def _has(blocks: set[int], n: int = 8) -> np.ndarray:
    """The finders' `cached`: n block positions, those in `blocks` cached."""
    return np.isin(np.arange(n), sorted(blocks))


# the finders as vLLM writes them (single_type_kv_cache_manager.py): one position at a time
def _full_loop(c: np.ndarray, max_len: int, bs: int) -> tuple[int, int]:
    n = 0
    while n < max_len // bs and n < len(c) and c[n]:
        n += 1
    return n * bs, 0


def _sliding_loop(c: np.ndarray, max_len: int, bs: int, window: int) -> tuple[int, int]:
    need, run = -(-(window - 1) // bs), 0
    for i in range(min(max_len // bs, len(c)) - 1, -1, -1):
        if c[i]:
            run += 1
            if run >= need:
                return (i + run) * bs, i
        else:
            run = 0
    return run * bs, 0


def _chunked_loop(c: np.ndarray, max_len: int, bs: int, chunk: int) -> tuple[int, int]:
    first = max_len // chunk * chunk // bs
    n = first
    while n < max_len // bs and n < len(c) and c[n]:
        n += 1
    return n * bs, first


def _state_loop(c: np.ndarray, max_len: int, bs: int) -> tuple[int, int]:
    for i in range(min(max_len // bs, len(c)) - 1, -1, -1):
        if c[i]:
            return (i + 1) * bs, i
    return 0, 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), max_size=24), st.integers(0, 120), st.sampled_from([1, 4, 16]),
       st.integers(1, 70), st.sampled_from([1, 2, 4]))
def test_finders_equal_the_block_by_block_scan(cached: list[bool], max_len: int, bs: int,
                                               window: int, chunks: int) -> None:
    """Each finder (whole arrays at once) answers as vLLM's scan, one position at a time."""
    c = np.array(cached, dtype=bool)
    assert full_hit(c, max_len, bs) == _full_loop(c, max_len, bs)
    assert sliding_hit(c, max_len, bs, window) == _sliding_loop(c, max_len, bs, window)
    assert chunked_hit(c, max_len, bs, chunks * bs) == _chunked_loop(c, max_len, bs,
                                                                     chunks * bs)
    assert state_hit(c, max_len, bs) == _state_loop(c, max_len, bs)


def test_finders_by_hand() -> None:
    # block 4 tokens, max 24 tokens = 6 blocks
    assert full_hit(_has({0, 1, 3}), 24, 4) == (8, 0)
    # window 9 needs cdiv(8, 4) = 2 cached blocks in a row, found from the right
    assert sliding_hit(_has({0, 1, 3, 4, 5}), 24, 4, 9) == (24, 4)
    assert sliding_hit(_has({0, 1, 2, 4}), 24, 4, 9) == (12, 1)
    assert sliding_hit(_has({0, 2, 4}), 24, 4, 9) == (4, 0)  # no run: the run from block 0
    # chunk 8: the candidate's chunk starts at 16 (block 4); blocks 4.. from there
    assert chunked_hit(_has({4}), 20, 4, 8) == (20, 4)
    assert chunked_hit(_has(set()), 16, 4, 8) == (16, 4)  # aligned: nothing to look up
    assert state_hit(_has({0, 2}), 24, 4) == (12, 2)
    assert state_hit(_has({5}), 20, 4) == (0, 0)  # block 5 ends at 24 > 20


def test_fixed_point_shrinks_until_every_kind_accepts() -> None:
    """full accepts 24; the state finder then 16 (cached state at block 3); the sliding
    window at 16 needs blocks 2-3, missing block 2: the run from block 0 is blocks 0-1, 8;
    the state at 8 (block 1) is cached: 8 is the fixed point."""
    specs = (GroupSpec("full", 0, 0, 1, 1), GroupSpec("sliding", 9, 0, 1, 1),
             GroupSpec("mamba", 0, 0, 1, 1))
    cached = [_has({0, 1, 2, 3, 4, 5}), _has({0, 1, 3, 4, 5}), _has({1, 3})]
    hit, first = longest_hit(specs, cached, 24, 4)
    assert hit == 8 and first[2] == 1


# -- sizes agree with the planner ---------------------------------------------------------------

@pytest.mark.parametrize("model", ["gpt-oss-120b", "qwen3.5-4b", "nemotron-nano-9b-v2",
                                   "llama-4-scout", "qwen3-next-80b-a3b", "gemma-3-27b"])
def test_pool_sizes_equal_the_planners(model: str) -> None:
    layout, budget, ctx = LAYOUTS[model], 10 * 2**30, 32_768
    p = make_policy("vllm", PolicyConfig(kv_tokens=0, page_size=16, max_context_len=ctx,
                                         layout=layout, kv_bytes=budget))
    assert isinstance(p, PooledVLLMManager)
    mode = p.mamba_cache_mode if layout.state_groups() else None
    plan = vllm_plan(layout, budget, ctx, block_size=16, mamba_cache_mode=mode)
    assert p.page_size == plan.block_size and plan.num_blocks == p.groups.num_blocks
    assert all(pool.pages == p.groups.num_blocks for pool in plan.pools)
    # the report's token figure by the v0.11 - v0.20.0 rule is blocks // groups x block
    legacy = vllm_plan(layout, budget, ctx, block_size=16, rules=vllm_rules("0.19.0"),
                       mamba_cache_mode=mode)
    assert legacy.kv_cache_tokens == p.groups.num_blocks // p.groups.num_groups * p.page_size
    assert p.capacity == p.groups.num_blocks * p.page_size // p.slot_groups


def test_block_size_rules_and_errors() -> None:
    base = dict(kv_tokens=0, max_context_len=4096, layout=LAYOUTS["qwen3.5-4b"],
                kv_bytes=2**30)
    assert make_policy("vllm", PolicyConfig(page_size=16, **base)).page_size == 528  # raised
    assert make_policy("vllm", PolicyConfig(page_size=1056, **base)).page_size == 1056  # kept
    with pytest.raises(ValueError, match="mamba_cache_mode must be one of none, align, all"):
        make_policy("vllm", PolicyConfig(page_size=16, mamba_cache_mode="some", **base))
    with pytest.raises(ValueError, match="kv_bytes must be > 0"):
        make_policy("vllm", PolicyConfig(page_size=16, **{**base, "kv_bytes": 0}))
    with pytest.raises(ValueError, match="no host tier on a hybrid layout"):
        make_policy("vllm", PolicyConfig(page_size=16, host_tokens=4096, **base))
    with pytest.raises(ValueError, match="does not divide by the block size"):
        make_policy("vllm", PolicyConfig(page_size=48, **{**base,
                                                          "layout": LAYOUTS["llama-4-scout"]}))
    # a layout that is not hybrid keeps today's policy
    full = HybridLayout((LayerGroup("full", 2, kv_heads=1, head_dim=8),))
    assert type(make_policy("vllm", PolicyConfig(kv_tokens=64, page_size=16,
                                                       layout=full))) is VLLMManager


# -- differential: a window longer than every request is full attention -------------------------

@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 60), st.integers(1, 20)),
                min_size=1, max_size=12),
       st.sampled_from([1, 4, 16]))
def test_a_window_longer_than_every_request_is_full_attention(
        reqs: list[tuple[int, int, int]], bs: int) -> None:
    """Same requests, ample memory (the hybrid's two layers get twice the one-layer reference's
    bytes, so both have the same slots): the hybrid policy with a full and a sliding layer whose
    window exceeds the context gives every request the hits of the full-attention `vllm`
    policy and, in each group, exactly the blocks it holds there (the window frees none)."""
    ctx = 128
    swa = LayerGroup("sliding", 1, kv_heads=1, head_dim=8, window=ctx + 1)
    hyb = make_policy("vllm", PolicyConfig(kv_tokens=0, page_size=bs, max_context_len=ctx,
                                           max_requests=16, kv_bytes=2 * 4096 * 32 * bs,
                                           layout=HybridLayout((FULL1, swa))))
    ref = make_policy("vllm", PolicyConfig(kv_tokens=4096 * bs, page_size=bs,
                                           max_context_len=ctx, max_requests=16))
    assert isinstance(hyb, PooledVLLMManager) and type(ref) is VLLMManager
    for rid, (prefix, extra, out) in enumerate(reqs):
        ids = np.concatenate([np.arange(prefix * 20), 10_000 * (rid + 1) + np.arange(extra)])
        final = len(ids) + out - 1
        a, b = hyb.admit(rid, ids, final, out), ref.admit(rid, ids, final, out)
        assert a is not None and b is not None and a.cached_len == b.cached_len
        for pol in (hyb, ref):
            assert pol.extend([rid], [len(ids)])
            for _ in range(out - 1):
                assert pol.decode([rid])
        full, window = tables(hyb, rid)
        assert len(full) == len(window) == len(blocks(ref, rid)) and all(window)
        hyb.check_invariants()
        for pol in (hyb, ref):
            pol.finish(rid, np.concatenate([ids, 77 + np.arange(out)]))
    assert hyb.available_tokens() == ref.available_tokens()


# -- the state machine ------------------------------------------------------------------------

PREFIXES = [np.arange(64), 1000 + np.arange(64)]


class HybridMachine(RuleBasedStateMachine):
    """Random admit / prefill chunk / decode / finish / release on the toy layout (full,
    sliding window 32, linear attention) in a pool small enough to evict; after every step the
    policy's own checks and these, each computed here from the tables and the pool:
    blocks in use + free = the pool; every block a live table names is held; no sliding block
    the next token needs is freed; each running request holds its running state block (mode
    none: exactly one), and held state blocks = those the live tables name."""

    @initialize(mode=st.sampled_from(["align", "all", "none"]), blocks=st.integers(12, 40))
    def start(self, mode: str, blocks: int) -> None:
        self.p = toy(mode, blocks=blocks)
        self.live: dict[int, tuple[np.ndarray, int]] = {}
        self.next = 0

    @rule(which=st.integers(0, 1), cut=st.integers(1, 64), extra=st.integers(0, 40),
          out=st.integers(1, 40))
    def admit(self, which: int, cut: int, extra: int, out: int) -> None:
        ids = np.concatenate([PREFIXES[which][:cut], 50_000 + 100 * self.next + np.arange(extra)])
        rid, self.next = self.next, self.next + 1
        held = self.p.coordinator.peek(ids, len(ids) - 1).alone[0]  # full attention alone
        gone = self.p.state_evictions is not None and self.p.state_evictions.any()
        res = self.p.admit(rid, ids, len(ids) + out - 1, out)
        if res is not None:
            self.live[rid] = (ids, len(ids) + out - 1)
            # the rules' cuts lie within the full attention KV held; the rest of it is a
            # state block the pool evicted (capacity)
            lost = res.cached_len + res.window_lost + res.state_lost
            assert min(res.window_lost, res.state_lost) >= 0 and lost <= held
            assert lost == held or gone
            event(f"state evicted, content kept={gone}")
            event(f"cut={res.window_lost + res.state_lost > 0}")

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), step=st.integers(1, 48))
    def grow(self, pick: int, step: int) -> None:
        rid = sorted(self.live)[pick % len(self.live)]
        ids, final = self.live[rid]
        w = self.p.written(rid)
        if w < len(ids):
            self.p.extend([rid], [min(w + step, len(ids))])
        elif w < final:
            self.p.decode([rid])

    @precondition(lambda self: self.live)
    @rule(first=st.integers(0, 100), width=st.integers(1, 4), n=st.integers(1, 80))
    def stretch(self, first: int, width: int, n: int) -> None:
        """`decode_steps` on up to `width` decoding requests against a copy stepped n times:
        the breakdown and pool bytes after each step, then the tables, the free queue in
        order, the ref counts and the hashes all equal (the decode stretch's contract)."""
        p = self.p
        ready = sorted(r for r, (ids, final) in self.live.items()
                       if len(ids) <= p.written(r) < final)
        rids = ready[first % len(ready):][:width] if ready else []
        if not rids:
            return
        n = min(n, *(self.live[r][1] - p.written(r) for r in rids))
        if p.decode_cost(rids, n) > p.available_tokens():
            return
        twin = copy.deepcopy(p)
        releases = p.steps_before_release(rids, n)
        profile = p.decode_steps(rids, n, 7)
        pools = p.stretch_pool_usage()
        released = n
        for j in range(n):
            free = twin.pool.get_num_free_blocks()
            assert twin.decode(rids)
            allocating = sum(rule.allocates for rule in twin.rules)
            if twin.pool.get_num_free_blocks() > free - allocating * sum(
                    (twin.written(r) - 1) % twin.page_size == 0 for r in rids):
                released = min(released, j + 1)
            assert np.array_equal(profile[j], twin.breakdown(7).as_array()), j
            for kind, u in twin.pool_usage().items():
                assert tuple(pools[kind][j]) == (u.used_bytes, u.cached_bytes), (kind, j)
        assert releases == released
        for r in rids:
            assert tables(p, r) == tables(twin, r)
        nfree = p.pool.get_num_free_blocks()
        assert np.array_equal(p.pool.peek_free(nfree), twin.pool.peek_free(nfree))
        assert np.array_equal(p.pool.ref_cnt, twin.pool.ref_cnt)
        assert np.array_equal(p.pool.is_hashed, twin.pool.is_hashed)
        assert p.page_table_entries() == twin.page_table_entries()

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100), finish=st.booleans())
    def end(self, pick: int, finish: bool) -> None:
        rid = sorted(self.live)[pick % len(self.live)]
        ids, _ = self.live.pop(rid)
        if finish:
            w = self.p.written(rid)
            self.p.finish(rid, np.concatenate([ids, 3 + np.arange(max(w - len(ids), 0))]))
        else:
            self.p.release(rid)

    @invariant()
    def holds(self) -> None:
        p = self.p
        p.check_invariants()
        pool, bs, nb = p.pool, p.page_size, p.groups.num_blocks
        assert int(np.count_nonzero(pool.ref_cnt[1:] > 0)) + pool.get_num_free_blocks() == nb
        state_named: set[int] = set()
        for rid in self.live:
            w = p.written(rid)
            full, window, state = tables(p, rid)
            assert all(pool.ref_cnt[b] > 0 for t in (full, window, state) for b in t if b)
            assert all(window[max(w - 32 + 1, 0) // bs:])
            if p.mamba_cache_mode == "none":
                assert len(state) == (1 if w else 0)
            elif w:
                assert state[-1]
            state_named.update(b for b in state if b)
        named = {b for rid in self.live for t in tables(p, rid) for b in t if b}
        assert set(np.flatnonzero(pool.ref_cnt > 0).tolist()) == named  # nothing held astray
        assert state_named <= named


TestHybridMachine = HybridMachine.TestCase
TestHybridMachine.settings = settings(max_examples=12, stateful_step_count=25, deadline=None,
                                      suppress_health_check=list(HealthCheck))


def test_chunked_local_frees_past_chunks_and_hits_from_the_chunk_start() -> None:
    """Chunk 32, blocks of 16. A prefills 50 tokens (4 blocks per group) and decodes one:
    at 50 tokens its current chunk starts at 32, so blocks 0-1 go back to the free queue
    (hashed). B repeats A's 50 tokens and adds 10: capped at 59, whole blocks 0-2; full
    attention accepts 48; the candidate's chunk starts at 32 (block 2), which is cached:
    the hit is 48 and B takes no chunked block before block 2."""
    chunked = LayerGroup("chunked", 1, kv_heads=1, head_dim=8, chunk=32)
    p = toy(layout=HybridLayout((FULL1, chunked)))
    ids = np.arange(50)
    assert p.admit(0, ids, 51, 2) is not None and p.extend([0], [50])
    assert [len(t) for t in tables(p, 0)] == [4, 4]
    assert p.decode([0])
    assert tables(p, 0)[1][:2] == [0, 0] and all(tables(p, 0)[1][2:])
    p.finish(0, np.arange(52))
    b = np.concatenate([ids, 3000 + np.arange(10)])
    assert p.admit(1, b, 61, 2) is not None
    full, local = tables(p, 1)
    assert p.written(1) == 48 and len(full) == 3 and local[:2] == [0, 0] and local[2]
    p.check_invariants()


def test_bad_arguments_are_one_line_errors_and_change_nothing() -> None:
    p = toy(ctx=64)
    assert p.admit(0, np.arange(20), 30, 11) is not None and p.extend([0], [20])
    before = tables(p, 0)
    with pytest.raises(ValueError, match="already admitted"):
        p.admit(0, np.arange(5), 6, 2)
    with pytest.raises(ValueError, match="below written 20"):
        p.extend([0], [10])
    with pytest.raises(ValueError, match="exceeds max_context_len 64"):
        p.extend([0], [65])
    with pytest.raises(ValueError, match="not admitted"):
        p.decode([7])
    with pytest.raises(ValueError, match="same request twice"):
        p.decode([0, 0])
    assert tables(p, 0) == before and p.written(0) == 20
    # memory short, all or nothing: 30 blocks; request 0 holds 2 + 2 + 2, a 64-token prefill
    # takes 4 full + 4 sliding + 1 state block (the running one, at the boundary 64): 9
    for rid in (1, 2, 3):
        assert p.admit(rid, 100 * rid + np.arange(64), 64, 1) is not None
    assert p.extend([1], [64]) and p.extend([2], [64])  # 6 + 9 + 9 = 24
    assert not p.extend([3], [64])  # 9 > 6 free
    assert not p.extend([0, 3], [21, 64])  # nor batched with one that would fit
    assert p.written(3) == 0 and tables(p, 3) == [[], [], []] and p.written(0) == 20
    # 7 free: the failed call still removed request 0's skipped block (its state at 16, now
    # cached), as vLLM removes skipped blocks before it allocates
    assert p.available_tokens() == 7 * 16 // 2 and tables(p, 0)[2] == [0, before[2][1]]
    p.check_invariants()


@pytest.mark.parametrize(("mode", "columns"), [("align", 3 * 16), ("none", 2 * 16 + 1)])
def test_block_tables_are_sized_as_vllms(mode: str, columns: int) -> None:
    """vLLM's block tables (vllm/v1/worker/block_table.py, one per KV cache group): int32,
    max_num_reqs x cdiv(max_model_len, block_size) each; a Mamba group in mode none has block
    size max_model_len, so one column. Toy: 8 requests, 256 tokens, blocks of 16, three
    groups: 8 x 48 x 4 = 1,536 B in align, 8 x 33 x 4 = 1,056 B in none."""
    p = toy(mode)
    assert p.page_table_nbytes == 8 * columns * 4
    assert p.page_table_bytes() == p.page_table_nbytes
