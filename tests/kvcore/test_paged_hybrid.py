"""SGLang's manager on hybrid layouts (`paged` with side pools: kvcore/sglang/pools.py,
sliding_window.py, mamba_state.py): worked examples by hand, the sizes against the planner, the
running-request cap, the dispatch and its errors, a differential test against full-attention
`paged`, and a stateful machine over the policy (and so the radix cache with its side pools'
data, the SWA pool and the state pool) checking every invariant after every step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvcore.contract.capabilities import PoolKinds, PrefixCache
from kvcore.model.hybrid_plan import sglang_plan
from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.layers import CHUNKED, FULL, LINEAR, SLIDING, HybridLayout, LayerGroup
from kvcore.policies import PolicyConfig, make_policy
from kvcore.sglang.mamba_state import MambaStates
from kvcore.sglang.policy import FullAttentionPolicy, PoolKindsPolicy, SGLangPolicy
from kvcore.sglang.sliding_window import SlidingWindow
from tests.kvcore.draws import draw_extend

GIB10 = 10 * 2**30


def swa_layout(window: int, kind: str = SLIDING) -> HybridLayout:
    """One windowed and one full layer of 1 KV head x 1: 4 bytes per token each in bf16."""
    w = {"window": window} if kind == SLIDING else {"chunk": window}
    return HybridLayout((LayerGroup(kind, 1, kv_heads=1, head_dim=1, **w),
                         LayerGroup(FULL, 1, kv_heads=1, head_dim=1)))


#: one gated-delta-net layer: conv 1 x (2*2 + 2) x 2 B + recurrent 1 x 2 x 2 x 2 B = 20 B
GDN = HybridLayout((LayerGroup(LINEAR, 1, num_k_heads=1, num_v_heads=1, k_head_dim=2,
                               v_head_dim=2, conv_kernel=2),
                    LayerGroup(FULL, 1, kv_heads=1, head_dim=1)))


def window(pol: SGLangPolicy) -> SlidingWindow | None:
    return next((k for k in pol.kinds if isinstance(k, SlidingWindow)), None)


def states(pol: SGLangPolicy) -> MambaStates | None:
    return next((k for k in pol.kinds if isinstance(k, MambaStates)), None)


def cfg(layout: HybridLayout, kv_bytes: int, page_size: int = 1, **kw) -> PolicyConfig:
    base = {"max_context_len": 64, "max_requests": 8}
    return PolicyConfig(kv_tokens=0, page_size=page_size, layout=layout, kv_bytes=kv_bytes,
                        **{**base, **kw})


def ids(*runs: tuple[int, int]) -> np.ndarray:
    return np.concatenate([np.arange(a, a + n) for a, n in runs]).astype(np.int64)


# -- sizes, worked examples --------------------------------------------------------------------
def test_pools_sized_by_hand() -> None:
    # 4 B/token in each layer; budget 560 B, ratio 0.75: 560 // (4 + 0.75 x 4) = 80 full
    # tokens, 60 SWA tokens; pages of 4: 20 full and 15 SWA pages
    pol = make_policy("paged", cfg(swa_layout(8), 560, page_size=4, swa_full_tokens_ratio=0.75))
    assert isinstance(pol, PoolKindsPolicy) and isinstance(pol, PrefixCache | PoolKinds)
    assert (pol.capacity, pol.allocator.num_pages, pol.allocator.swa.num_pages) == (80, 20, 15)
    use = pol.pool_usage()
    assert use["full"].capacity_bytes == 320 and use["swa"].capacity_bytes == 240
    # GDN: 20 B of state; 400 B, ratio 0.9: 400 x 0.9 / 1.9 = 189.47 -> 9 slots (180 B), the
    # other 220 B hold 55 full tokens; with the cache a request needs 3 slots: 3 run at once
    g = make_policy("paged", cfg(GDN, 400))
    assert (g.capacity, states(g).pool.size, g.max_running) == (55, 9, 3)
    assert make_policy("paged-nocache", cfg(GDN, 400)).max_running == 8  # 9 // 1, rows 8


@pytest.mark.parametrize("model", ["gemma-2-9b", "gpt-oss-20b", "llama-4-scout",
                                   "qwen3.5-4b", "nemotron-nano-9b-v2"])
def test_pool_sizes_equal_the_planners(model: str) -> None:
    layout = LAYOUTS[model]
    ps = 1 if layout.state_groups() else 16
    c = cfg(layout, GIB10, page_size=ps, max_context_len=8192, max_requests=64)
    pol = make_policy("paged", c)
    plan = sglang_plan(layout, GIB10, 8192, page_size=ps)
    assert pol.capacity == plan.kv_cache_tokens
    for p in plan.pools:
        if p.note == "state slots":
            assert states(pol).pool.size == p.pages
        elif p.kind == FULL:
            assert pol.allocator.num_pages == p.pages
        else:
            assert pol.allocator.swa.num_pages * ps == p.tokens
    if layout.state_groups():  # the running cap: slots // 3 (SGLang v0.5, radix cache)
        assert pol.max_running == min(64, plan.running_request_cap)  # plan and policy agree


def test_decode_frees_swa_out_of_window_by_hand() -> None:
    # window 8, pages of 4, no cache: a 20-token prompt (5 pages), then decode. The chunk
    # frees nothing (written was 0 before it); decode step 1 frees below 20 - 8 = 12 (pages
    # 0..2) and writes token 20 on a 6th page: 3 SWA pages. Steps 2..8 write tokens 21..27
    # (a 7th page): 4. Step 9 (decodes % 8 == 1) frees below 28 - 8 = 20 (pages 3, 4) and
    # writes token 28 on an 8th page: 3.
    pol = make_policy("paged-nocache", cfg(swa_layout(8), 576, page_size=4))
    toks = ids((100, 40))
    pol.admit(1, toks[:20], 40, 21)
    assert pol.extend([1], [20])
    assert pol.allocator.swa_used_pages() == 5
    assert pol.decode([1])
    assert pol.allocator.swa_used_pages() == 6 - 3 and window(pol).evicted[pol.row_of(1)] == 12
    for _ in range(7):
        assert pol.decode([1])
    assert window(pol).evicted[pol.row_of(1)] == 12 and pol.allocator.swa_used_pages() == 4
    assert pol.decode([1])  # the 9th step: written 28 before it
    assert window(pol).evicted[pol.row_of(1)] == 20 and pol.allocator.swa_used_pages() == 3
    pol.check_invariants()
    assert pol.allocator.num_pages - pol.allocator.free_page_count() == 8  # full KV stays
    pol.finish(1, toks[:29])
    assert pol.allocator.swa_used_pages() == 0 and pol.allocator.free_page_count() == 19


def test_tombstone_match_needs_the_last_window() -> None:
    # window 8, pages of 4. Cache A (24 tokens) and B = A[:8] + other 16: the shared node
    # [0, 8) is inner. Requests 3 and 4 hit all of A and B: full KV locked on both paths, SWA
    # KV on their last window only (the 16-token leaves), so SWA eviction can take only the
    # inner node, which becomes a tombstone. Then a match of 16 tokens of B has 8 tokens
    # since the tombstone (>= window) and is kept; 12 tokens of B, or A[:8], end too close
    # to (or on) the tombstone and give 0.
    pol = make_policy("paged", cfg(swa_layout(8), 576, page_size=4))
    a, b = ids((100, 24)), np.concatenate([ids((100, 8)), ids((500, 16))])
    for rid, t in ((1, a), (2, b)):
        pol.admit(rid, t, 24, 1)
        assert pol.extend([rid], [24])
        pol.finish(rid, t)
    assert pol.peek_prefix(b[:16]) == 16 and pol.peek_prefix(a[:8]) == 8
    for rid, t in ((3, a), (4, b)):
        assert pol.admit(rid, np.append(t, 7), 25, 1).cached_len == 24
    assert window(pol).sizes() == (8, 32)
    assert window(pol).evict(1) == 2  # the inner node [0, 8): two pages
    pol.check_invariants()
    assert window(pol).sizes() == (0, 32) and pol.allocator.swa_used_pages() == 8
    assert pol.peek_prefix(b[:16]) == 16 and pol.peek_prefix(b[:12]) == 0
    assert pol.peek_prefix(a[:8]) == 0 and pol.peek_prefix(a) == 24
    # a hit on B[:16] splits B's leaf and locks SWA over [8, 16) only
    res = pol.admit(5, np.concatenate([b[:16], ids((900, 5))]), 25, 5)
    assert res is not None and res.cached_len == 16
    pol.check_invariants()
    for rid in (3, 4, 5):
        pol.release(rid)
    assert window(pol).sizes() == (32, 0)
    pol.check_invariants()


def test_full_eviction_deletes_the_tombstone_it_leaves_as_a_leaf() -> None:
    # the tombstoned inner node [0, 8) of the example above, its two 16-token leaves unlocked:
    # evicting 32 tokens takes both leaves and stops; the tombstone is then a leaf no match
    # can use and goes too (SGLang `_iteratively_delete_tombstone_leaf`): 40 tokens, nothing
    # left, every full and SWA page free
    pol = make_policy("paged", cfg(swa_layout(8), 576, page_size=4))
    a, b = ids((100, 24)), np.concatenate([ids((100, 8)), ids((500, 16))])
    for rid, t in ((1, a), (2, b)):
        pol.admit(rid, t, 24, 1)
        assert pol.extend([rid], [24])
        pol.finish(rid, t)
    for rid, t in ((3, a), (4, b)):
        assert pol.admit(rid, np.append(t, 7), 25, 1).cached_len == 24
    sw = window(pol)
    assert sw is not None and sw.evict(1) == 2 and sw.tomb_tokens == 8
    for rid in (3, 4):
        pol.release(rid)
    assert pol.tree.evict(32) == 40 and not pol.tree.nodes() and not sw.tombs
    assert pol.allocator.free_page_count() == pol.allocator.num_pages
    assert pol.allocator.swa_used_pages() == 0
    pol.check_invariants()


def test_mamba_hit_copies_the_state_and_caps_running() -> None:
    pol = make_policy("paged", cfg(GDN, 400))  # 9 slots, 3 running
    t = ids((100, 12))
    assert pol.admit(1, t[:10], 12, 3) is not None and pol.extend([1], [10])
    pol.cache_prefix(1, t[:10])  # forks a slot for the tree: 2 in use
    assert states(pol).pool.used_size() == 2 and states(pol).pool.copies == 1
    for _ in range(2):
        assert pol.decode([1])
    pol.finish(1, t)  # its own slot goes to the tree at 12 tokens
    assert states(pol).pool.used_size() == 2 and sorted(states(pol).sizes()) == [0, 2]
    res = pol.admit(2, np.concatenate([t, ids((700, 2))]), 15, 2)
    assert res is not None and res.cached_len == 12 and states(pol).pool.copies == 2
    assert pol.admit(3, t, 13, 2) is not None and pol.admit(4, t, 13, 2) is not None
    assert pol.admit(5, t, 13, 2) is None  # 9 // 3 = 3 running
    pol.check_invariants()


def test_the_match_rules_cuts_by_hand() -> None:
    """AdmitResult names what each rule refused (issue 38, item 4): full-attention KV the
    tree holds but no state ends at is the state-boundary rule; a state the pool evicted is
    capacity (in neither field); a tombstoned window is the window rule."""
    pol = make_policy("paged", cfg(GDN, 400, max_mamba_cache_size=9))
    t = ids((100, 12))
    assert pol.admit(1, t[:10], 12, 3) is not None and pol.extend([1], [10])
    pol.cache_prefix(1, t[:10])  # a state at 10
    for _ in range(2):
        assert pol.decode([1])
    pol.finish(1, t)  # and one at 12: node [0, 10) then [10, 12)
    res = pol.admit(2, np.concatenate([t[:8], ids((700, 3))]), 12, 1)  # 8 cached, no state
    assert (res.cached_len, res.window_lost, res.state_lost, res.token_hit) == (0, 0, 8, 0)
    pol.release(2)
    assert states(pol).evict(1) == 1  # the older state, at 10 (an inner node)
    pol.check_invariants()
    assert states(pol).evicted and pol.tree.rule_cuts(t[:11]) == (11, 10)
    res = pol.admit(3, np.concatenate([t[:10], ids((800, 3))]), 13, 1)
    assert (res.cached_len, res.window_lost, res.state_lost) == (0, 0, 0)  # capacity
    pol.release(3)
    res = pol.admit(4, np.concatenate([t, ids((900, 2))]), 14, 1)
    assert (res.cached_len, res.window_lost, res.state_lost) == (12, 0, 0)
    # a window: the tombstone example below, the inner node [0, 8) tombstoned
    pol = make_policy("paged", cfg(swa_layout(8), 576, page_size=4))
    a, b = ids((100, 24)), np.concatenate([ids((100, 8)), ids((500, 16))])
    for rid, tok in ((1, a), (2, b)):
        pol.admit(rid, tok, 24, 1)
        assert pol.extend([rid], [24])
        pol.finish(rid, tok)
    for rid, tok in ((3, a), (4, b)):
        pol.admit(rid, np.append(tok, 7), 25, 1)
    assert window(pol).evict(1) == 2
    res = pol.admit(5, np.concatenate([b[:12], ids((900, 5))]), 25, 5)
    assert (res.cached_len, res.window_lost, res.state_lost, res.token_hit) == (0, 12, 0, 0)


def test_dispatch_and_errors() -> None:
    assert type(make_policy("paged-nocache", cfg(swa_layout(8), 576))) is PoolKindsPolicy
    for name in ("contiguous-max", "contiguous-pow2"):  # vllm has its own hybrid form
        with pytest.raises(ValueError, match=f"policy '{name}' does not support hybrid"):
            make_policy(name, cfg(swa_layout(8), 576))
    with pytest.raises(ValueError, match="host tier"):
        make_policy("paged", cfg(swa_layout(8), 576, host_tokens=64))
    with pytest.raises(ValueError, match="kv_bytes must be > 0"):
        make_policy("paged", cfg(swa_layout(8), 0))
    with pytest.raises(ValueError, match="needs page size 1"):
        make_policy("paged", cfg(GDN, 400, page_size=2))
    with pytest.raises(ValueError, match="run no request"):
        make_policy("paged", cfg(GDN, 400, max_mamba_cache_size=2))
    # a layout with no layer other than full attention is today's path, unchanged
    full = HybridLayout((LayerGroup(FULL, 2, kv_heads=1, head_dim=1),))
    plain = PolicyConfig(kv_tokens=64, page_size=4, layout=full)
    assert type(make_policy("paged", plain)) is FullAttentionPolicy


# -- differential: a window no request outgrows is full attention --------------------------------
@settings(max_examples=20, deadline=None)
@given(ps=st.sampled_from([1, 4]), pages=st.integers(4, 24), chunked=st.booleans(),
       ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 20),
                              st.integers(1, 8)), min_size=1, max_size=40))
def test_window_longer_than_every_request_is_full_attention(ps, pages, chunked, ops) -> None:
    """Window >= max_context_len, SWA pool as large as the full pool (ratio 1): every
    admission, allocation, eviction and breakdown equals full-attention `paged`'s."""
    tokens = pages * ps
    layout = swa_layout(64, CHUNKED if chunked else SLIDING)
    hyb = make_policy("paged", cfg(layout, 8 * tokens, page_size=ps, swa_full_tokens_ratio=1.0))
    ref = make_policy("paged", PolicyConfig(kv_tokens=tokens, page_size=ps, max_context_len=64,
                                            max_requests=8))
    assert hyb.capacity == ref.capacity == tokens
    live: dict[int, tuple[np.ndarray, int]] = {}
    for rid, (op, prefix, own, out) in enumerate(ops):
        if op <= 1 or not live:  # admit and prefill
            toks = np.concatenate([ids((1000 * prefix, 12)), ids((50_000 + rid, own))])
            fin = len(toks) + out - 1
            r1, r2 = (p.admit(rid, toks, fin, out) for p in (hyb, ref))
            assert r1 == r2
            if r1 is not None:
                live[rid] = (np.concatenate([toks, ids((90_000 + rid * 10, out))]), fin)
                ok = [p.extend([rid], [len(toks)]) for p in (hyb, ref)]
                assert ok[0] == ok[1]
                if ok[0]:
                    for p in (hyb, ref):
                        p.cache_prefix(rid, toks)
                else:
                    for p in (hyb, ref):
                        p.release(rid)
                    del live[rid]
        elif op <= 3:  # decode everyone who can
            rids = [r for r, (_, fin) in sorted(live.items()) if ref.written(r) < fin]
            if rids:
                assert hyb.decode(rids) == ref.decode(rids)
        else:  # finish (or preempt) the oldest
            r = min(live)
            toks, _ = live.pop(r)
            for p in (hyb, ref):
                if op == 4:
                    p.finish(r, toks[: p.written(r)])
                else:
                    p.release(r)
        assert hyb.breakdown(8) == ref.breakdown(8)
        assert hyb.available_tokens() == ref.available_tokens()
        assert hyb.page_table_entries() == ref.page_table_entries()
    hyb.check_invariants()
    full = hyb.allocator
    assert full.swa_used_pages() == full.num_pages - full.free_page_count()


# -- the stateful machine ------------------------------------------------------------------------
def held_prefix(tree, key: np.ndarray) -> int:
    """The page-aligned prefix of `key` whose full-attention KV the tree holds, from every
    node's path (no walk, no rule)."""
    best = 0
    for node in tree.nodes():
        path = np.concatenate([n.key for n in reversed(list(node.path_to_root()))])
        n = min(len(path), len(key))
        m = int(np.argmax(path[:n] != key[:n])) if (path[:n] != key[:n]).any() else n
        best = max(best, m - m % tree.page_size)
    return best


def out_ids(rid: int, a: int, b: int) -> np.ndarray:
    return np.arange(a, b, dtype=np.int64) * 7 + 70_000 + rid * 1000


class HybridMachine(RuleBasedStateMachine):
    """Random admit / extend / decode / cache / finish / release / SWA and state eviction over
    shared prefixes, on an SWA or a Mamba layout, with and without the cache."""

    def __init__(self) -> None:
        super().__init__()
        self.pol: SGLangPolicy | None = None
        self.live: dict[int, tuple[np.ndarray, int]] = {}
        self.next_rid = 0
        self.slot_token: dict[int, tuple[int, int]] = {}  # full slot -> (position, token)
        self.states_evicted = False  # some state left its pool: a cut may be capacity

    def all_ids(self, rid: int) -> np.ndarray:
        p, fin = self.live[rid]
        return np.concatenate([p, out_ids(rid, len(p), fin)])

    def record(self, rid: int) -> None:
        row, w = self.pol.row_of(rid), self.pol.written(rid)
        toks = self.all_ids(rid)
        for pos, slot in enumerate(self.pol.req_to_token_pool.read_at(row, slice(0, w))):
            self.slot_token[int(slot)] = (pos, int(toks[pos]))

    @initialize(kind=st.sampled_from(["swa", "swa", "chunked", "mamba"]),
                ps=st.sampled_from([1, 2, 4]), budget=st.integers(12, 60),
                window=st.integers(1, 12), ratio=st.sampled_from([0.3, 0.8, 1.0]),
                cache=st.booleans())
    def create(self, kind, ps, budget, window, ratio, cache) -> None:
        if kind == "mamba":
            c = cfg(GDN, budget * 4 + 20 * 9, page_size=ps if not cache else 1,
                    max_context_len=40, max_requests=5, max_mamba_cache_size=9)
        else:
            c = cfg(swa_layout(window, SLIDING if kind == "swa" else CHUNKED),
                    budget * ps * 8, page_size=ps, max_context_len=40, max_requests=5,
                    swa_full_tokens_ratio=ratio)
        self.pol = make_policy("paged" if cache else "paged-nocache", c)

    @rule(prefix=st.sampled_from([0, 0, 1, 2]), shared=st.integers(0, 16),
          own=st.integers(0, 6), out=st.integers(1, 10))
    def admit(self, prefix, shared, own, out) -> None:
        rid = self.next_rid
        self.next_rid += 1
        toks = np.concatenate([np.arange(shared) + 1000 * prefix,
                               np.arange(own) + 50_000 + rid]).astype(np.int64)
        if len(toks) == 0:
            toks = np.array([7], dtype=np.int64)
        fin = len(toks) + out - 1
        peek = self.pol.peek_prefix(toks[:-1])
        st = states(self.pol)
        self.states_evicted |= st is not None and bool(st.evicted)  # by an admission too
        res = self.pol.admit(rid, toks, fin, out)
        if res is None:
            assert len(self.live) == self.pol.max_running or states(self.pol) is not None
            return
        assert res.cached_len == peek and res.cached_len % self.pol.page_size == 0
        event(f"hit={res.cached_len > 0}")
        # the rules' cuts: within the full-attention KV the tree held (a state evicted from
        # its pool is the rest: capacity), each only for a layout with that kind of layer
        held = 0 if self.pol.tree.disable else held_prefix(self.pol.tree, toks[:-1])
        lost = res.cached_len + res.window_lost + res.state_lost
        assert res.window_lost >= 0 and res.state_lost >= 0 and lost <= held
        assert lost == held or self.states_evicted
        assert res.window_lost == 0 or window(self.pol) is not None
        assert res.state_lost == 0 or states(self.pol) is not None
        event(f"cut={res.window_lost + res.state_lost > 0}")
        self.live[rid] = (toks, fin)
        for pos, slot in enumerate(self.pol.req_to_token_pool.read_at(
                res.row, slice(0, res.cached_len))):
            assert self.slot_token[int(slot)] == (pos, int(toks[pos]))

    @rule(data=st.data())
    def extend(self, data) -> None:
        if not self.live:
            return
        prompts = {r: len(p) for r, (p, _) in self.live.items()}
        rids, targets = draw_extend(data, self.pol.written, prompts)
        before = [self.pol.written(r) for r in rids]
        ok = self.pol.extend(rids, targets)
        event(f"extend ok={ok}")
        assert [self.pol.written(r) for r in rids] == (targets if ok else before)
        for r in rids:
            self.record(r)

    @rule(data=st.data())
    def decode(self, data) -> None:
        ready = [r for r, (p, fin) in self.live.items() if len(p) <= self.pol.written(r) < fin]
        if not ready:
            return
        rids = data.draw(st.lists(st.sampled_from(sorted(ready)), unique=True, min_size=1))
        before = [self.pol.written(r) for r in rids]
        ok = self.pol.decode(rids)
        assert [self.pol.written(r) for r in rids] == [w + ok for w in before]
        for r in rids:
            self.record(r)

    @rule(data=st.data(), how=st.sampled_from(["finish", "release", "cache"]))
    def end(self, data, how) -> None:
        if not self.live:
            return
        rid = data.draw(st.sampled_from(sorted(self.live)))
        toks = self.all_ids(rid)[: self.pol.written(rid)]
        if how == "cache":
            self.pol.cache_prefix(rid, toks)
            self.record(rid)
            return
        if how == "finish":
            self.pol.finish(rid, toks)
        else:
            self.pol.release(rid)
        del self.live[rid]

    @rule(prefix=st.sampled_from([0, 1]), shared=st.integers(1, 16), own=st.integers(0, 6),
          cache=st.booleans())
    def served(self, prefix, shared, own, cache) -> None:
        """A request admitted, prefilled whole and finished (or its prefix cached) in one
        step: later admissions of the same prefix then meet the tree's data and its rules."""
        rid = self.next_rid
        self.admit(prefix, shared, own, 1)
        if rid not in self.live:
            return
        toks = self.live[rid][0]
        if not self.pol.extend([rid], [len(toks)]):
            return
        self.record(rid)
        if cache:
            self.pol.cache_prefix(rid, toks)
            self.record(rid)
        else:
            self.pol.finish(rid, toks)
            del self.live[rid]

    @rule(n=st.integers(1, 6))
    def evict_swa_or_states(self, n) -> None:
        freed = 0
        for kind in self.pol.kinds:  # type: ignore[attr-defined]
            got = kind.evict(n)
            freed += got
            self.states_evicted |= got > 0 and kind is states(self.pol)
        event(f"evicted={freed > 0}")
        event(f"tombstones={bool(window(self.pol) and window(self.pol).tombs)}")

    @invariant()
    def invariants(self) -> None:
        if self.pol is None:
            return
        pol = self.pol
        pol.check_invariants()  # pages in use + free = capacity per pool, windows, slots, locks
        bd = pol.breakdown(16)
        assert bd.cached == pol.evictable_tokens()
        assert pol.available_tokens() == bd.cached + bd.free
        use = pol.pool_usage()
        for u in use.values():
            assert 0 <= u.cached_bytes <= u.used_bytes <= u.capacity_bytes
        st = states(pol)
        if st is not None:
            assert use["mamba"].used_bytes == st.pool.state_bytes * (
                len(self.live) + len(st.slots))


TestHybridMachine = HybridMachine.TestCase
TestHybridMachine.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)


def test_admission_budget_is_the_smaller_pool() -> None:
    """SGLang v0.5's PrefillAdder budgets an SWA model on min(full, SWA) available tokens: with
    the 80-token full and 60-token SWA pools above, an empty policy shows 80 available, of
    which 20 only the full pool has (`other_pools`); a 70-token prompt that the full pool
    alone would take is refused by the sglang admission (it would fail on the SWA pool)."""
    import simpy

    from simulator.admission import AdmissionParams, make_admission
    from simulator.request import SimRequest
    from workloads.request import PromptSpec, Request

    pol = make_policy("paged", cfg(swa_layout(64), 560, page_size=4, swa_full_tokens_ratio=0.75,
                                   max_context_len=128))
    peek = pol.peek_admission(ids((1, 10)))
    assert pol.available_tokens() == 80 and peek.other_pools == 20
    adm = make_admission("sglang", pol, AdmissionParams())
    big = SimRequest(Request(0, 0.0, PromptSpec((("unique", 5, 70, 0),)), 1, 1, seed=1), 128,
                     simpy.Environment())
    small = SimRequest(Request(1, 0.0, PromptSpec((("unique", 5, 50, 0),)), 1, 1, seed=1), 128,
                       simpy.Environment())
    assert not adm.admissible(big, pol.peek_admission(big.prefill_key()), 0, [], [])
    assert adm.admissible(small, pol.peek_admission(small.prefill_key()), 0, [], [])
    # the full pool alone would take the big one, the SWA pool cannot
    assert pol.admit(0, big.seq_ids(70), 71, 1) is not None and not pol.extend([0], [70])
    pol.release(0)
    pol.check_invariants()
