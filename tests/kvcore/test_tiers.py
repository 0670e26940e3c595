"""Hierarchical KV cache (kvcore/tiers.py, kvcore/policies/paged_tiers.py): worked examples, a
stateful test with every tier checking the invariants after every operation, and the host tier
against an independent LRU model over page-aligned prefix keys."""

from __future__ import annotations

from collections import OrderedDict
from functools import partial

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvcore.allocator import PagedAllocator
from kvcore.policies.paged import PagedPolicy
from kvcore.policies.paged_tiers import TieredPagedPolicy
from kvcore.radix_cache import RadixCache
from kvcore.tiers import WRITE_POLICIES, HierarchicalCache, TierConfig, TierTree
from tests.kvcore.tier_machine import TieredPolicyMachine, serve_alone, tiered_policy

_policy = partial(tiered_policy, "paged")
_serve = serve_alone


def test_no_tier_is_the_plain_policy() -> None:
    p = _policy(4, 16, host=0)
    assert type(p) is PagedPolicy and p.tier_state() is None


def test_bad_tier_config() -> None:
    with pytest.raises(ValueError, match="write policy"):
        TierConfig(64, write_policy="sometimes")
    with pytest.raises(ValueError, match="host_tokens"):
        TierConfig(-1)
    with pytest.raises(ValueError, match="needs a host tier"):
        TierConfig(0, storage_tokens=64)
    with pytest.raises(ValueError, match="smaller than one page"):
        TierTree("host", 3, 4)
    with pytest.raises(ValueError, match="host_tokens > 0"):
        HierarchicalCache(RadixCache(4, PagedAllocator(8, 4)), TierConfig())
    with pytest.raises(ValueError, match="needs its allocator"):
        HierarchicalCache(RadixCache(4, None), TierConfig(64))


def test_host_hit_is_loaded_not_prefilled() -> None:
    """Device holds 2 prompts; the first comes back after two others evicted it: a host hit,
    loaded into new device pages, counted in cached_len (not prefilled)."""
    ps = 4
    p = _policy(ps, pages=24, host=400)
    a, b, c = (np.arange(40) + 1000 * k for k in range(3))
    assert _serve(p, 0, a).cached_len == 0
    _serve(p, 1, b)
    _serve(p, 2, c)
    assert p.tree.peek(a[:-1])[0] < 36  # evicted from the device (at least partly)
    res = _serve(p, 3, a)
    assert res.cached_len == 36  # all of it: device part + host part, none prefilled
    assert res.host_hit > 0 and res.storage_hit == 0
    st_ = p.tier_state()
    assert st_.pages_h2d * ps >= res.host_hit and st_.pages_d2h > 0


def test_write_back_only_on_device_eviction() -> None:
    ps = 4
    p = _policy(ps, pages=24, host=400, write="write_back")
    a, b, c = (np.arange(40) + 1000 * k for k in range(3))
    _serve(p, 0, a)
    assert p.tier_state().pages_d2h == 0  # nothing evicted yet: nothing written back
    _serve(p, 1, b)
    _serve(p, 2, c)
    assert p.tier_state().pages_d2h > 0
    assert _serve(p, 3, a).host_hit > 0


def test_selective_backs_up_after_threshold_hits() -> None:
    ps = 4
    p = _policy(ps, pages=64, host=400, write="write_through_selective")
    a = np.arange(40)
    _serve(p, 0, a)
    assert p.tier_state().pages_d2h == 0
    # the inserting request's own re-match counted one hit (as SGLang's after an insert):
    # the first reuse reaches the default threshold of 2 and backs the prefix up
    assert p.tree.nodes()[0].hit_count == 1
    _serve(p, 1, a)
    assert p.tier_state().pages_d2h == 9
    _serve(p, 2, a)  # already on the host: nothing more moves
    assert p.tier_state().pages_d2h == 9


def test_storage_tier_catches_host_evictions() -> None:
    ps = 4
    p = _policy(ps, pages=24, host=80, storage=800)
    prompts = [np.arange(40) + 1000 * k for k in range(6)]
    for i, pr in enumerate(prompts):
        _serve(p, i, pr)
    st_ = p.tier_state()
    assert st_.pages_h2s > 0 and st_.storage_used > 0
    p.storage_allowance = 0  # prefetch gave nothing yet: no storage hit
    assert _serve(p, 10, prompts[0]).storage_hit == 0
    p.storage_allowance = 10**6
    res = _serve(p, 11, prompts[1])
    assert res.storage_hit > 0 and res.cached_len == 36


def test_host_page_granular_lru_eviction() -> None:
    """A full host tier gives up only the pages needed, deepest first, of its LRU leaf."""
    t = TierTree("host", 16, 4)
    t.store(np.arange(12))  # 3 pages
    t.store(np.arange(100, 104))  # 1 page: 4 of 4 used
    t.store(np.arange(200, 204))  # needs 1: the deepest page of the oldest leaf goes
    assert t.peek(np.arange(12))[0] == 8
    assert t.peek(np.arange(100, 104))[0] == 4
    t.check_tier()


# -- stateful: every tier, invariants after every operation ---------------------------------------


class TierMachine(TieredPolicyMachine):
    """`paged` with HiCache's tiers (tests/kvcore/tier_machine.py has the rules)."""

    @precondition(lambda self: self.p is None)
    @rule(write=st.sampled_from(WRITE_POLICIES), host=st.integers(2, 12),
          storage=st.integers(0, 16))
    def build(self, write: str, host: int, storage: int) -> None:
        ps = self.PS
        p = _policy(ps, pages=14, host=host * ps, storage=storage * ps, write=write, ctx=16 * ps)
        assert isinstance(p, TieredPagedPolicy)
        self.p = p

    def check_tiers(self) -> None:
        p, state = self.p, self.p.tier_state()
        host = p.tiers.host
        assert state.host_used + host.pool.available_size() == state.host_capacity
        # in flight: at most the admitted requests that loaded and have not finished prefill
        assert len(p.tiers.inflight) <= len(self.reqs)
        if p.tiers.storage is not None:
            assert p.tiers.storage.protected_size() == 0


TestTierMachine = TierMachine.TestCase
TestTierMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow,
                                                           HealthCheck.filter_too_much])


# -- the host tier against an independent LRU model ------------------------------------------------


class PageLRU:
    """An LRU over page-aligned prefix keys (key i = the first (i+1) pages), `capacity` pages.
    Touching a path makes its shallowest page the most recent, so that among pages touched
    together the deepest goes first (a prefix never outlives its extension's parent)."""

    def __init__(self, capacity: int, ps: int) -> None:
        self.capacity, self.ps = capacity, ps
        self.lru: OrderedDict[bytes, None] = OrderedDict()

    def keys(self, ids: np.ndarray) -> list[bytes]:
        n = len(ids) // self.ps
        return [ids[: (i + 1) * self.ps].tobytes() for i in range(n)]

    def hit(self, ids: np.ndarray) -> int:
        k = 0
        for key in self.keys(ids):
            if key not in self.lru:
                break
            k += 1
        return k * self.ps

    def access(self, ids: np.ndarray, add: bool) -> None:
        keys = self.keys(ids)
        if not add:
            keys = keys[: self.hit(ids) // self.ps]
        for key in reversed(keys):
            self.lru[key] = None
            self.lru.move_to_end(key)
        while len(self.lru) > self.capacity:
            self.lru.popitem(last=False)


@pytest.mark.parametrize("ps,host_pages", [(1, 300), (4, 60), (16, 12)])
def test_host_tier_equals_an_lru_model(ps: int, host_pages: int) -> None:
    """Requests one at a time, write_through: the host tier holds exactly what an LRU over
    page-aligned prefixes with its capacity holds, so its hit past the device's is the
    model's hit past the device's, request by request."""
    rng = np.random.default_rng(ps)
    bases = [rng.integers(0, 50, size=300) for _ in range(12)]
    p = _policy(ps, pages=max(300 // ps, 4), host=host_pages * ps, rows=2, ctx=1024)
    model = PageLRU(host_pages, ps)
    total = host = prompt_tokens = 0
    for rid in range(120):
        b = bases[int(rng.zipf(1.5)) % len(bases)]
        share = int(rng.integers(0, 200))
        prompt = np.concatenate([b[:share], 100 + rng.integers(0, 1000, size=int(
            rng.integers(1, 60)))])
        key = prompt[:-1]
        want = model.hit(key)
        out = int(rng.integers(1, 5))
        assert p.tiers.host.peek(key)[0] == want  # before: the host holds what the model does
        device = p.tree.peek(key)[0]
        res = _serve(p, rid, prompt, out=out)
        assert res.host_hit == max(want - device, 0), f"request {rid}"
        assert res.cached_len == max(want, device)
        model.access(key, add=False)  # admission's match
        model.access(prompt, add=True)  # cache_prefix's write_through
        written = np.concatenate([prompt, 10_000 + rid * 10 + np.arange(out)])
        model.access(written[: len(prompt) + out - 1], add=True)  # finish's
        total += res.cached_len
        host += res.host_hit
        prompt_tokens += len(prompt)
    assert host > 0 and total > host  # both tiers served something
