"""SGLang's manager on full attention (`paged`, `paged-nocache`): worked examples, decode_steps
/ decode_profile against stepping, bad input, and a stateful test against a reference count of
slots."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

from kvcore.contract.breakdown import PARTS
from kvcore.policies import PolicyConfig, make_policy
from kvcore.sglang.policy import SGLangPolicy


def _policy(ps: int, pages: int = 32, cache: bool = True, rows: int = 8, ctx: int = 256):
    cfg = PolicyConfig(kv_tokens=pages * ps, page_size=ps, max_context_len=ctx,
                       max_requests=rows)
    return make_policy("paged" if cache else "paged-nocache", cfg)


def _parts(b) -> list[int]:
    return [b.parts()[p] for p in PARTS]


def test_worked_example_rounding() -> None:
    p = _policy(4)
    res = p.admit(1, np.arange(6), final_len=6, max_new_tokens=1)
    assert res is not None and res.cached_len == 0
    assert p.extend([1], [6])
    b = p.breakdown(4)
    assert b.rounding == 2 and b.reserved == 0 and b.token_states == 6  # 2 pages, 2 slots lost
    assert b.free == (32 - 2) * 4
    b.check_invariants()
    p.check_invariants()


def test_lengths_on_a_page_boundary_round_to_themselves() -> None:
    """0 and 8 tokens at page 4 end exactly on page ends: no rounding, no extra page (the
    running totals round each length up, and a boundary must not round a page further)."""
    p = _policy(4)
    p.admit(1, np.arange(8), final_len=8, max_new_tokens=0)
    assert p.extend([1], [8])
    b = p.breakdown(0)
    assert (b.token_states, b.rounding, b.reserved) == (8, 0, 0)
    assert b.free == (32 - 2) * 4
    p.check_invariants()


def test_reserved_then_rounding_while_decoding() -> None:
    p = _policy(4)
    p.admit(1, np.arange(5), final_len=7, max_new_tokens=3)
    assert p.extend([1], [5])
    b = p.breakdown(4)
    assert (b.token_states, b.reserved, b.rounding) == (5, 2, 1)
    free = p.free_tokens()
    assert p.decode([1]) and p.free_tokens() == free  # its own page serves the next tokens
    p.check_invariants()


def test_prefix_reuse_and_finish_caches() -> None:
    p = _policy(4)
    prompt = np.arange(10)
    p.admit(1, prompt, final_len=11, max_new_tokens=2)
    assert p.extend([1], [10]) and p.decode([1])
    toks = np.concatenate([prompt, [99]])
    p.finish(1, toks)
    assert p.evictable_tokens() == 8 and p.free_tokens() == (32 - 2) * 4
    res = p.admit(2, np.concatenate([prompt, [5, 6]]), final_len=13, max_new_tokens=2)
    assert res.cached_len == 8 and res.token_hit >= 8
    assert p.breakdown(4).token_states == 8  # locked cache counts as live token state
    p.check_invariants()
    p.release(2)
    assert p.available_tokens() == p.capacity
    p.check_invariants()


def test_nocache_reuses_nothing() -> None:
    p = _policy(4, cache=False)
    assert p.name == "paged-nocache"
    p.admit(1, np.arange(9), final_len=9, max_new_tokens=1)
    assert p.extend([1], [9])
    p.finish(1, np.arange(9))
    assert p.available_tokens() == p.free_tokens() == p.capacity
    assert p.admit(2, np.arange(9), final_len=9, max_new_tokens=1).cached_len == 0
    p.check_invariants()


def test_cache_prefix_moves_lock_and_shares() -> None:
    p = _policy(2)
    p.admit(1, np.arange(7), final_len=8, max_new_tokens=2)
    assert p.extend([1], [7])
    p.cache_prefix(1, np.arange(7))
    b = p.breakdown(2)
    assert p.tree.protected_size() == 6 and b.token_states == 7
    p.admit(2, np.arange(7), final_len=8, max_new_tokens=2)
    assert p.written(2) == 6
    p.check_invariants()


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="page_size must be a positive integer, got 0"):
        make_policy("paged", PolicyConfig(kv_tokens=16, page_size=0))
    with pytest.raises(ValueError, match="kv_tokens 3 is smaller than one page"):
        make_policy("paged", PolicyConfig(kv_tokens=3, page_size=4))
    with pytest.raises(ValueError, match="unknown eviction policy 'x'"):
        make_policy("paged", PolicyConfig(kv_tokens=16, page_size=4, eviction="x"))
    p = _policy(4, ctx=32)
    with pytest.raises(ValueError, match="final length 40 exceeds max_context_len 32"):
        p.admit(1, np.arange(8), final_len=40, max_new_tokens=1)
    p.admit(1, np.arange(8), final_len=20, max_new_tokens=1)
    with pytest.raises(ValueError, match="already admitted"):
        p.admit(1, np.arange(8), final_len=20, max_new_tokens=1)
    before = p.allocator.free_pages_view().tolist()
    with pytest.raises(ValueError, match="below written"):
        p.extend([1], [-1])
    with pytest.raises(ValueError, match="max_context_len"):
        p.extend([1], [33])
    with pytest.raises(ValueError, match="request 9 is not admitted"):
        p.decode([9])
    assert p.allocator.free_pages_view().tolist() == before
    p.check_invariants()


# -- decode_steps and decode_profile against stepping -------------------------------------------


@settings(max_examples=30, deadline=None)
@given(ps=st.sampled_from([1, 2, 16]), data=st.data())
def test_decode_steps_and_profile_equal_stepping(ps: int, data) -> None:
    n_req = data.draw(st.integers(1, 4))
    prompts = data.draw(st.lists(st.integers(1, 40), min_size=n_req, max_size=n_req))
    outs = data.draw(st.lists(st.integers(1, 30), min_size=n_req, max_size=n_req))
    n = data.draw(st.integers(1, min(outs)))
    a, b = _policy(ps, pages=512), _policy(ps, pages=512)
    rids = list(range(n_req))
    for p in (a, b):
        for rid, (pl, ol) in enumerate(zip(prompts, outs, strict=True)):
            assert p.admit(rid, np.arange(pl) + 1000 * rid, pl + ol, ol) is not None
        assert p.extend(rids, prompts)
    assert a.decode_cost(rids, n) <= a.free_tokens()
    profile = a.decode_profile(rids, n, ps)
    got = a.decode_steps(rids, n, ps)
    assert np.array_equal(got, profile)
    for step in range(n):
        assert b.decode(rids)
        assert _parts(b.breakdown(ps)) == profile[step].tolist()
    for rid in rids:  # the written part of each page-table row is identical
        ra, rb = a.row_of(rid), b.row_of(rid)
        w = a.written(rid)
        assert w == b.written(rid) == prompts[rid] + n
        assert np.array_equal(a.req_to_token_pool.read_at(ra, slice(0, w)),
                              b.req_to_token_pool.read_at(rb, slice(0, w)))
    assert a.breakdown(ps) == b.breakdown(ps)
    assert a.allocator.free_pages_view().tolist() == b.allocator.free_pages_view().tolist()
    a.check_invariants()


# -- stateful: the policy against a reference count ---------------------------------------------

N_PAGES = 10


class PolicyMachine(RuleBasedStateMachine):
    PS = 1
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        ps = self.PS
        self.p = _policy(ps, pages=N_PAGES, rows=4, ctx=8 * ps + 16)
        rng = np.random.default_rng(ps)
        self.bases = [rng.integers(0, 5, size=4 * ps + 4) for _ in range(2)]
        self.cache: set[tuple[int, ...]] = set()  # page prefixes the tree holds
        self.reqs: dict[int, dict] = {}
        self.next_id = 0

    def ref_match(self, key: np.ndarray) -> int:
        ps, k = self.PS, 0
        while (k + 1) * ps <= len(key) and tuple(key[: (k + 1) * ps].tolist()) in self.cache:
            k += 1
        return k * ps

    def locked(self) -> set[tuple[int, ...]]:
        out = set()
        for r in self.reqs.values():
            lk = tuple(r["tokens"][: r["cached"]].tolist())
            out |= {k for k in self.cache if lk[: len(k)] == k}
        return out

    def sync_evictions(self) -> None:
        """Drop reference prefixes the tree no longer holds; only unlocked ones may go."""
        locked = self.locked()
        gone = {k for k in self.cache if self.p.tree.peek(np.array(k))[0] < len(k)}
        assert not gone & locked
        self.cache -= gone

    def add_cached(self, tokens: np.ndarray, n: int) -> None:
        ps = self.PS
        self.cache |= {tuple(tokens[: (k + 1) * ps].tolist()) for k in range(n // ps)}

    @rule(target=requests, base=st.integers(0, 1), share=st.integers(0, 4),
          tail=st.integers(1, 8), out=st.integers(1, 6), data=st.data())
    def admit(self, base: int, share: int, tail: int, out: int, data) -> int:
        ps = self.PS
        prompt = np.concatenate([self.bases[base][: share * ps + data.draw(st.integers(0, 3))],
                                 np.full(tail, 7 + self.next_id)])
        tokens = np.concatenate([prompt, 100 + np.arange(out)])
        rid = self.next_id
        self.next_id += 1
        res = self.p.admit(rid, prompt, len(prompt) + out - 1, out)
        if res is None:
            assert len(self.reqs) == 4
            return -1
        assert res.cached_len == self.ref_match(prompt[:-1])
        self.reqs[rid] = {"tokens": tokens, "prompt": len(prompt), "final": len(prompt) + out - 1,
                          "cached": res.cached_len, "w": res.cached_len}
        return rid

    def need(self, rid: int, target: int) -> int:
        ps, w = self.PS, self.reqs[rid]["w"]
        return (-(-target // ps) - -(-w // ps)) * ps

    @rule(rids=st.lists(requests, min_size=1, max_size=3, unique=True), data=st.data())
    def extend(self, rids: list[int], data) -> None:
        rids = [r for r in rids if r in self.reqs and self.reqs[r]["w"] < self.reqs[r]["prompt"]]
        if not rids:
            return
        targets = [data.draw(st.integers(self.reqs[r]["w"], self.reqs[r]["prompt"]))
                   for r in rids]
        need = sum(self.need(r, t) for r, t in zip(rids, targets, strict=True))
        avail = self.p.available_tokens()
        ok = self.p.extend(rids, targets)
        assert ok == (need <= avail)
        self.sync_evictions()
        if ok:
            for r, t in zip(rids, targets, strict=True):
                self.reqs[r]["w"] = t

    def decodable(self, rids: list[int]) -> list[int]:
        return [r for r in rids if r in self.reqs
                and self.reqs[r]["prompt"] <= self.reqs[r]["w"] < self.reqs[r]["final"]]

    @rule(rids=st.lists(requests, min_size=1, max_size=3, unique=True))
    def decode(self, rids: list[int]) -> None:
        rids = self.decodable(rids)
        if not rids:
            return
        need = sum(self.need(r, self.reqs[r]["w"] + 1) for r in rids)
        avail = self.p.available_tokens()
        ok = self.p.decode(rids)
        assert ok == (need <= avail)
        self.sync_evictions()
        if ok:
            for r in rids:
                self.reqs[r]["w"] += 1

    @rule(rids=st.lists(requests, min_size=1, max_size=3, unique=True), n=st.integers(2, 5))
    def decode_steps(self, rids: list[int], n: int) -> None:
        rids = [r for r in self.decodable(rids)
                if self.reqs[r]["w"] + n <= self.reqs[r]["final"]]
        if not rids:
            return
        cost = sum(self.need(r, self.reqs[r]["w"] + n) for r in rids)
        assert self.p.decode_cost(rids, n) == cost
        if cost > self.p.available_tokens():
            cached = self.p.tree.total_size()
            with pytest.raises(ValueError, match="decode_cost"):
                self.p.decode_steps(rids, n, self.PS)
            assert self.p.tree.total_size() == cached  # refused before evicting anything
            return
        predicted = self.p.decode_profile(rids, n, self.PS)
        free_before = self.p.free_tokens()
        profile = self.p.decode_steps(rids, n, self.PS)
        if cost <= free_before:  # nothing to evict: exactly the predicted profile
            assert np.array_equal(profile, predicted)
        self.sync_evictions()
        for r in rids:
            self.reqs[r]["w"] += n
        assert _parts(self.p.breakdown(self.PS)) == profile[-1].tolist()
        assert profile.shape == (n, len(PARTS))
        assert (profile.sum(axis=1) == self.p.capacity).all()

    @rule(rid=requests)
    def cache_prefix(self, rid: int) -> None:
        if rid not in self.reqs:
            return
        r = self.reqs[rid]
        self.p.cache_prefix(rid, r["tokens"][: r["w"]])
        n = r["w"] - r["w"] % self.PS
        if n > r["cached"]:
            self.add_cached(r["tokens"], n)
            r["cached"] = n

    @rule(rid=consumes(requests))
    def finish(self, rid: int) -> None:
        if rid not in self.reqs:
            return
        r = self.reqs.pop(rid)
        self.p.finish(rid, r["tokens"][: r["w"]])
        self.add_cached(r["tokens"], r["w"] - r["w"] % self.PS)

    @rule(rid=consumes(requests))
    def release(self, rid: int) -> None:
        if rid in self.reqs:
            self.reqs.pop(rid)
            self.p.release(rid)

    @invariant()
    def consistent(self) -> None:
        ps, p = self.PS, self.p
        p.check_invariants()
        private = sum(-(-r["w"] // ps) * ps - r["cached"] for r in self.reqs.values())
        locked = self.locked()
        total = len(self.cache) * ps
        assert p.tree.total_size() == total
        assert p.evictable_tokens() == total - len(locked) * ps
        free = p.capacity - total - private
        assert p.free_tokens() == free
        assert p.available_tokens() == free + total - len(locked) * ps
        b = p.breakdown(ps)
        b.check_invariants()
        assert sum(b.parts().values()) == p.capacity
        assert b.token_states == len(locked) * ps + sum(
            r["w"] - r["cached"] for r in self.reqs.values())
        assert b.free == free and b.cached == p.evictable_tokens()
        assert p.page_table_entries() == sum(-(-r["w"] // ps) for r in self.reqs.values())


def test_refused_decode_steps_evict_nothing() -> None:
    """decode_steps beyond what is available raises before it evicts (it used to evict the
    cache and then refuse)."""
    p = _policy(1, pages=N_PAGES, rows=4, ctx=24)
    p.admit(0, np.array([7]), 1, 1)
    assert p.extend([0], [1])
    p.finish(0, np.array([7]))  # one cached token
    prompt = np.array([1, 2, 3, 8, 8, 8, 8])
    p.admit(1, prompt, 11, 5)
    assert p.extend([1], [7]) and p.decode([1]) and p.decode([1])  # 9 of 10 pages held
    with pytest.raises(ValueError, match="decode_cost"):
        p.decode_steps([1], 2, 1)
    assert p.tree.total_size() == 1
    p.check_invariants()


def force_device_paths(p: SGLangPolicy) -> None:
    """Make a CPU policy take the code paths a CUDA policy takes (torch indexing of the page
    table, the allocator's tensor stack, tensor frees in eviction) instead of the numpy views
    that CPU runs use, so those paths are tested on machines without a GPU."""
    p.req_to_token_pool.host = None
    p.allocator._stack_np = p.allocator._is_free_np = None
    p.tree._on_cpu = False


@pytest.mark.parametrize("ps", [1, 2, 16, 64])
def test_policy_stateful(ps: int) -> None:
    m = type(f"PolicyMachinePs{ps}", (PolicyMachine,), {"PS": ps})
    run_state_machine_as_test(m, settings=settings(
        max_examples=20, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


@pytest.mark.parametrize("ps", [1, 16])
def test_policy_stateful_device_paths(ps: int) -> None:
    def init(self) -> None:
        PolicyMachine.__init__(self)
        force_device_paths(self.p)

    m = type(f"PolicyMachineDevicePs{ps}", (PolicyMachine,), {"PS": ps, "__init__": init})
    run_state_machine_as_test(m, settings=settings(
        max_examples=15, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_device_paths_give_the_same_page_tables() -> None:
    """The same operations through the numpy views and through the tensor (device) paths
    leave identical page tables, free stacks and breakdowns."""
    policies = [_policy(4, pages=24, rows=4, ctx=64) for _ in range(2)]
    force_device_paths(policies[1])
    prompts = {r: np.arange(6 + 3 * r) + 100 * (r % 2) for r in range(6)}
    for p in policies:
        for r in (0, 1, 2):
            p.admit(r, prompts[r], len(prompts[r]) + 8, 9)
        assert p.extend([0, 1], [len(prompts[0]), len(prompts[1])])
        assert p.extend([2], [len(prompts[2])])
        p.cache_prefix(0, prompts[0])
        assert p.decode([0, 1, 2])
        p.decode_steps((0, 1, 2), 3, 4)  # a tuple: no memo, same answer
        p.finish(1, np.concatenate([prompts[1], np.arange(4)]))
        p.admit(3, prompts[3], len(prompts[3]) + 8, 9)
        assert p.extend([3], [len(prompts[3])])
        p.decode_steps(np.array([0, 2, 3]), 2, 4)
        p.release(2)
        p.check_invariants()
    a, b = policies
    assert a._row_of == b._row_of
    for r, row in a._row_of.items():  # entries past a row's length are never written
        ta, tb = a.req_to_token_pool.req_to_token, b.req_to_token_pool.req_to_token
        assert torch.equal(ta[row, : a.written(r)], tb[row, : b.written(r)])
    assert a.allocator.free_pages_view().tolist() == b.allocator.free_pages_view().tolist()
    assert a.breakdown(4) == b.breakdown(4)
