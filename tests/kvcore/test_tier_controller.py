"""The tier controller (kvcore/tiers/controller.py): one definition of "reused" for both tiered
policies (the worked example of docs/tiers.md), the loads in flight and the tier state, over
both stores (radix-path `TierTree`, block-hash `BlockTier`)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import numpy as np
import pytest

from kvcore.contract.tiers import TierConfig
from kvcore.contract.validation import InvariantError
from kvcore.sglang.tier_tree import TierTree
from kvcore.tiers.controller import TierController
from kvcore.vllm.block_tiers import BlockTier
from tests.kvcore.tier_machine import serve_alone, tiered_policy

PS = 4


def _next_turn(prompt: np.ndarray, rid: int, out: int) -> np.ndarray:
    """What serve_alone wrote for `rid` (prompt + out - 1 answer tokens): the next turn's
    prompt starts with it."""
    return np.concatenate([prompt, 10_000 + rid * 10 + np.arange(out)])[: len(prompt) + out - 1]


@pytest.mark.parametrize("name", ["paged", "vllm"])
def test_reused_is_per_page_for_both_policies(name: str) -> None:
    """docs/tiers.md's example: A's prompt pages and its answer's pages each count 1 when the
    device takes them; B (A's next turn) hits all five, each reaches SGLang's threshold 2 and
    is stored at B's admission. C (B's next turn) reuses them again (only touched: nothing
    new is written) and is the first reuse of B's own new page."""
    p = tiered_policy(name, PS, pages=32, host=64 * PS, write="write_through_selective",
                      ctx=256)
    a = np.arange(100, 112)
    serve_alone(p, 0, a, out=9)
    assert p.tier_state().host_used == 0  # created, never reused: nothing on the host
    b = np.concatenate([_next_turn(a, 0, 9), [7, 8, 9, 6, 5]])  # 25 tokens: 6 pages of key
    res = p.admit_prefetched(1, b, len(b) + 1, 2, 0)
    assert res is not None and res.cached_len == 20 and res.host_hit == 0
    state = p.tier_state()
    assert state.host_used == 20 and state.pages_d2h == 5  # p1..p5, at B's admission
    assert p.extend([1], [len(b)])
    p.cache_prefix(1, b)  # the device takes B's 6th page (count 1)
    p.finish(1, _next_turn(b, 1, 2)[: len(b) + 1])
    p.check_invariants()
    c = np.concatenate([b, [3, 3]])
    res = p.admit_prefetched(2, c, len(c) + 1, 2, 0)
    assert res is not None and res.cached_len == 24
    state = p.tier_state()
    assert state.host_used == 24 and state.pages_d2h == 6  # only B's page is new
    p.check_invariants()
    p.release(2)


@pytest.mark.parametrize("name", ["paged", "vllm"])
def test_a_recomputed_prefix_waits_for_its_reuse(name: str) -> None:
    """A prefix the device evicted before any reuse is not on the host; recomputed, it enters
    the device again with count 1 and is stored at its next reuse, not before."""
    p = tiered_policy(name, PS, pages=8, host=64 * PS, write="write_through_selective")
    a = np.arange(100, 100 + 3 * PS + 1)
    serve_alone(p, 0, a)
    for k in range(1, 4):  # three other prompts of 3 pages push `a` out of the device
        serve_alone(p, k, np.arange(1000 * k, 1000 * k + 3 * PS + 1))
    assert p.peek_tiers(a[:-1]).device == 0 and p.tier_state().host_used == 0
    serve_alone(p, 9, a)  # recomputed: count 1 again, not due
    assert p.tier_state().host_used == 0
    serve_alone(p, 10, a)  # its first reuse since: due
    assert p.tier_state().host_used == 3 * PS


@pytest.mark.parametrize("store", [TierTree, BlockTier])
def test_controller_bookkeeping(store: type) -> None:
    """Both stores under one controller: the storage allowance in whole pages (none without
    storage), one load in flight per request, the tier state a frozen record of it all."""
    cfg = TierConfig(host_tokens=8 * PS, storage_tokens=16 * PS,
                     write_policy="write_through_selective")
    t = TierController(cfg, store, PS, device_pages=10)
    assert t.host.capacity == 8 * PS and t.storage is not None and t.storage.capacity == 16 * PS
    assert t.counts_reuse and not t.write_on_insert and not t.write_on_evict
    assert (t.prefetch_pages(0), t.prefetch_pages(PS - 1), t.prefetch_pages(3 * PS + 1)) == (
        0, 0, 3)
    assert TierController(TierConfig(8 * PS), store, PS, 10).prefetch_pages(99) == 0
    pages = np.array([3, 4, 5])
    assert t.reused(pages).all()  # 1 on entering + this hit = 2
    t.forget(np.array([4]))  # the device evicts page 4: its count ends
    cached = np.ones(11, dtype=bool)
    cached[4] = False
    t.check_invariants(live=(), cached_pages=cached)
    cached[5] = False  # a page the device no longer holds must not keep a count
    with pytest.raises(InvariantError, match="reuse count"):
        t.check_invariants(live=(), cached_pages=cached)
    t.copied_up(2)
    state = t.state()
    assert (state.pages_s2h, state.pages_h2d, state.host_capacity) == (2, 0, 8 * PS)
    with pytest.raises(FrozenInstanceError):
        state.pages_h2d = 1  # type: ignore[misc]
    t.check_invariants(live=(), cached_pages=np.ones(11, dtype=bool))
    with pytest.raises(ValueError, match="write policy"):
        TierConfig(8, write_policy="never")


def test_same_total_hit_splits_differently_between_device_and_host() -> None:
    """docs/tiers.md's worked example of why the host hit rates differ: the radix tree evicts
    A's whole node (3 pages) to find room for C, the block pool only the blocks it needs
    (A's tail first), so A's prompt coming back is 3 host pages in `paged` and 1 device + 2
    host pages in `vllm`: the same total."""
    hits = {}
    for name in ("paged", "vllm"):
        p = tiered_policy(name, PS, pages=6, host=64 * PS, ctx=64)
        a = np.arange(100, 113)
        serve_alone(p, 0, a, out=1)
        serve_alone(p, 1, np.arange(200, 205), out=1)
        assert p.peek_tiers(a[:-1]).device == 3 * PS
        serve_alone(p, 2, np.arange(300, 309), out=1)
        hits[name] = tuple(p.peek_tiers(a))  # A's prompt + 1 token: its key is a
    assert hits["paged"] == (0, 3 * PS, 0)
    assert hits["vllm"] == (PS, 2 * PS, 0)
