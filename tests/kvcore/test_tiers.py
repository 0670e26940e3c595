"""Hierarchical KV cache (kvcore/contract/tiers.py, kvcore/sglang/hicache.py): worked examples, a
stateful test with every tier checking the invariants after every operation, and the host tier
against an independent LRU model over page-aligned prefix keys."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvcore.contract.capabilities import LowerTiers
from kvcore.contract.tiers import WRITE_POLICIES, TierConfig
from kvcore.sglang.policy import FullAttentionPolicy, TieredPolicy
from kvcore.sglang.tier_tree import TierTree
from kvcore.tiers.controller import TierController
from tests.kvcore.tier_machine import (
    TieredPolicyMachine,
    serve_against_lru,
    serve_alone,
    tiered_policy,
)

_policy = partial(tiered_policy, "paged")
_serve = serve_alone


def test_no_tier_is_the_plain_policy() -> None:
    p = _policy(4, 16, host=0)
    assert type(p) is FullAttentionPolicy and not isinstance(p, LowerTiers)
    assert p.tiers is None


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
        TierController(TierConfig(), TierTree, 4, 8)


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
    # prefetch gave nothing yet: no storage hit
    assert _serve(p, 10, prompts[0], allowance=0).storage_hit == 0
    res = _serve(p, 11, prompts[1], allowance=10**6)
    assert res.storage_hit > 0 and res.cached_len == 36


def test_host_page_granular_lru_eviction() -> None:
    """A full host tier gives up only the pages needed, deepest first, of its LRU leaf."""
    t = TierTree("host", 16, 4)
    t.store(np.arange(12))  # 3 pages
    t.store(np.arange(100, 104))  # 1 page: 4 of 4 used
    t.store(np.arange(200, 204))  # needs 1: the deepest page of the oldest leaf goes
    assert t.peek(np.arange(12))[0] == 8
    assert t.peek(np.arange(100, 104))[0] == 4
    t.check_invariants()


# -- stateful: every tier, invariants after every operation ---------------------------------------


class TierMachine(TieredPolicyMachine):
    """`paged` with HiCache's tiers (tests/kvcore/tier_machine.py has the rules)."""

    @precondition(lambda self: self.p is None)
    @rule(write=st.sampled_from(WRITE_POLICIES), host=st.integers(2, 12),
          storage=st.integers(0, 16))
    def build(self, write: str, host: int, storage: int) -> None:
        ps = self.PS
        p = _policy(ps, pages=14, host=host * ps, storage=storage * ps, write=write, ctx=16 * ps)
        assert isinstance(p, TieredPolicy)
        self.p = p

    def check_tiers(self) -> None:
        p, state = self.p, self.p.tier_state()
        host = p.tiers.host
        assert state.host_used + host.pool.available_size() == state.host_capacity
        # in flight: at most the admitted requests that loaded and have not finished prefill
        assert len(p.tiers.inflight) <= len(self.reqs)
        if p.tiers.storage is not None:
            assert p.tiers.storage.locked == 0


TestTierMachine = TierMachine.TestCase
TestTierMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow,
                                                           HealthCheck.filter_too_much])


# -- the host tier against an independent LRU model ------------------------------------------------


@pytest.mark.parametrize("ps,host_pages", [(1, 300), (4, 60), (16, 12)])
def test_host_tier_equals_an_lru_model(ps: int, host_pages: int) -> None:
    """Requests one at a time, write_through: the host tier holds exactly what an LRU over
    page-aligned prefixes with its capacity holds, so its hit past the device's is the
    model's hit past the device's, request by request."""
    p = _policy(ps, pages=max(300 // ps, 4), host=host_pages * ps, rows=2, ctx=1024)
    serve_against_lru(p, ps, host_pages, host_hit=lambda key: p.tiers.host.peek(key)[0],
                      device_hit=lambda key: p.tree.peek(key)[0])
