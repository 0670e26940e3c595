"""The shared lower tier (kvcore/tiers/shared.py): one store several replicas' tier controllers
use as their storage level, written through from each host.

* the store alone, driven through its views by random writes of random replicas (hypothesis
  stateful, both store kinds): capacity never exceeded, exactly an LRU over page-aligned
  prefixes (tests/kvcore/tier_machine.py's model), a page readable only after some replica
  wrote it, the views' writes adding up to the store's;
* the policies over one shared store (hypothesis stateful, `paged` and `vllm`): requests
  served on random replicas, every invariant after every step, a storage hit only on what
  some replica served;
* worked examples: what one replica served is a storage hit on another, whose own host
  never held it; the host writes through; the errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvcore.contract.validation import InvariantError
from kvcore.sglang.tier_tree import TierTree
from kvcore.tiers.shared import SharedTier
from kvcore.vllm.block_hash import NONE_HASH, block_hash
from kvcore.vllm.block_tiers import BlockTier
from tests.kvcore.tier_machine import PageLRU, serve_alone, tiered_policy

PS = 4


def _chain(ids: np.ndarray, ps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hashes, parents, tokens) of the full blocks of `ids`."""
    n = len(ids) // ps
    tokens = np.ascontiguousarray(ids[: n * ps], dtype=np.int64).reshape(n, ps)
    hashes, parents, parent = [], [], NONE_HASH
    for k in range(n):
        parents.append(parent)
        parent = block_hash(parent, tokens[k].tobytes())
        hashes.append(parent)
    return (np.array(hashes, dtype=np.uint64), np.array(parents, dtype=np.uint64), tokens)


class Store:
    """A store of either kind behind the same three calls (write a prefix, its hit, the
    page-prefix keys it holds)."""

    def __init__(self, kind: str, pages: int) -> None:
        self.kind = kind
        self.store: Any = (TierTree("shared", pages * PS, PS) if kind == "tree"
                           else BlockTier("shared", pages * PS, PS))

    def write(self, target: Any, ids: np.ndarray) -> None:
        if self.kind == "tree":
            target.store(ids)
        else:
            h, p, t = _chain(ids, PS)
            target.store(h[::-1], p[::-1], t[::-1])  # the chain's head most recent

    def hit(self, ids: np.ndarray) -> int:
        if self.kind == "tree":
            return int(self.store.peek(ids)[0])
        h, _, _ = _chain(ids, PS)
        return len(self.store.lookup(h, ids, 0)) * PS


class SharedStoreMachine(RuleBasedStateMachine):
    """Random replicas write random prefixes of four bases into one store through their
    views; the store is checked against an LRU model after every write."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(1)
        self.bases = [rng.integers(0, 4, size=48) for _ in range(4)]
        self.s: Store | None = None
        self.views: list[Any] = []
        self.model: PageLRU | None = None
        self.written: set[bytes] = set()  # every page-prefix key some replica wrote

    @precondition(lambda self: self.s is None)
    @rule(kind=st.sampled_from(["tree", "block"]), pages=st.integers(1, 20),
          replicas=st.integers(2, 4))
    def build(self, kind: str, pages: int, replicas: int) -> None:
        self.s = Store(kind, pages)
        shared = SharedTier(self.s.store)
        self.shared = shared
        from kvcore.tiers.shared import SharedView

        self.views = [SharedView(self.s.store, i) for i in range(replicas)]
        shared.views = self.views
        self.model = PageLRU(pages, PS)

    @precondition(lambda self: self.s is not None)
    @rule(data=st.data(), base=st.integers(0, 3), length=st.integers(0, 48))
    def write(self, data: Any, base: int, length: int) -> None:
        assert self.s is not None and self.model is not None
        i = data.draw(st.integers(0, len(self.views) - 1))
        ids = self.bases[base][:length]
        self.s.write(self.views[i], ids)
        self.model.access(ids, add=True)
        self.written.update(self.model.keys(ids))

    @invariant()
    def like_an_lru(self) -> None:
        if self.s is None:
            return
        assert self.model is not None
        store = self.s.store
        assert store.used <= store.capacity  # capacity never exceeded
        self.shared.check_invariants()  # store's own; nothing held; views add up
        for b in self.bases:
            for n in range(0, 49, PS):
                ids = b[:n]
                hit = self.s.hit(ids)
                assert hit == self.model.hit(ids), (self.s.kind, n)
                # readable only after written: every page of the hit was written
                assert all(k in self.written for k in self.model.keys(ids[:hit]))
        assert store.used == len(self.model.lru) * PS


TestSharedStoreMachine = SharedStoreMachine.TestCase
TestSharedStoreMachine.settings = settings(max_examples=60, stateful_step_count=30,
                                           deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])


class SharedPoliciesMachine(RuleBasedStateMachine):
    """2-3 tiered policies of one kind over one shared store: requests over three prompt
    bases served whole on a random replica with a random storage allowance; every replica's
    invariants and the shared store's after every step."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(2)
        self.bases = [rng.integers(0, 3, size=40) for _ in range(3)]
        self.ps: list[Any] = []
        self.shared: SharedTier | None = None
        self.served: set[bytes] = set()  # page-prefix keys of every sequence served
        self.rid = 0

    @precondition(lambda self: self.shared is None)
    @rule(policy=st.sampled_from(["paged", "vllm"]), replicas=st.integers(2, 3),
          host=st.integers(2, 10), shared=st.integers(1, 30),
          write=st.sampled_from(["write_through", "write_back", "write_through_selective"]))
    def build(self, policy: str, replicas: int, host: int, shared: int, write: str) -> None:
        # 16 device pages: the longest request (47 prompt + 3 decoded tokens) fits alone
        self.ps = [tiered_policy(policy, PS, 16, host * PS, shared * PS, write=write, ctx=64)
                   for _ in range(replicas)]
        first = self.ps[0].tiers.storage
        self.shared = SharedTier(first)
        for p in self.ps:
            self.shared.attach(p.tiers)

    def _keys(self, ids: np.ndarray) -> list[bytes]:
        return [ids[: (k + 1) * PS].tobytes() for k in range(len(ids) // PS)]

    @precondition(lambda self: self.shared is not None)
    @rule(data=st.data(), base=st.integers(0, 2), share=st.integers(0, 40),
          tail=st.integers(1, 7), out=st.integers(1, 4), allowance=st.integers(0, 64))
    def serve(self, data: Any, base: int, share: int, tail: int, out: int,
              allowance: int) -> None:
        i = data.draw(st.integers(0, len(self.ps) - 1))
        rid = self.rid
        self.rid += 1
        prompt = np.concatenate([self.bases[base][:share], 50 + rid * 8 + np.arange(tail)])
        res = serve_alone(self.ps[i], rid, prompt, out=out, allowance=allowance)
        if res.storage_hit:  # read from the shared store: some replica served it before
            start = res.cached_len - res.storage_hit
            assert all(k in self.served for k in self._keys(prompt[: res.cached_len])[
                start // PS:])
        ids = np.concatenate([prompt, 10_000 + rid * 10 + np.arange(out)])
        self.served.update(self._keys(prompt))
        self.served.update(self._keys(ids[: len(prompt) + out - 1]))

    @invariant()
    def consistent(self) -> None:
        if self.shared is None:
            return
        self.shared.check_invariants()
        assert self.shared.used <= self.shared.capacity
        for p in self.ps:
            p.check_invariants()
            assert p.tiers.storage.shared is self.shared.store


TestSharedPoliciesMachine = SharedPoliciesMachine.TestCase
TestSharedPoliciesMachine.settings = settings(max_examples=40, stateful_step_count=25,
                                              deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])


# -- worked examples ------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["paged", "vllm"])
def test_what_one_replica_served_is_a_storage_hit_on_another(policy: str) -> None:
    a, b = (tiered_policy(policy, PS, 24, 80, 800) for _ in range(2))
    shared = SharedTier(a.tiers.storage)
    va, vb = shared.attach(a.tiers), shared.attach(b.tiers)
    prompt = np.arange(41) + 7
    serve_alone(a, 0, prompt)
    assert va.pages_in > 0 and vb.pages_in == 0  # a's host wrote through into the store
    assert b.tiers.host.used == 0  # b's own host never held it
    assert b.peek_tiers(prompt[:-1]).storage == 40
    res = serve_alone(b, 1, prompt, allowance=10**6)
    assert res.storage_hit == 40 and res.cached_len == 40 and res.host_hit == 0
    assert b.tier_state().pages_s2h == 10  # copied store -> b's host
    shared.check_invariants()
    # without the prefetch allowance nothing arrives from the store
    c = tiered_policy(policy, PS, 24, 80, 800)
    shared.attach(c.tiers)
    assert serve_alone(c, 2, prompt, allowance=0).storage_hit == 0


@pytest.mark.parametrize("policy", ["paged", "vllm"])
def test_host_evictions_still_spill_into_the_store(policy: str) -> None:
    """A page the store evicted while a host still held it comes back when that host
    evicts it."""
    a, b = (tiered_policy(policy, PS, 24, 40, 80) for _ in range(2))
    shared = SharedTier(a.tiers.storage)
    shared.attach(a.tiers)
    shared.attach(b.tiers)
    first = np.arange(41) + 7
    serve_alone(a, 0, first)  # 10 pages: in a's host and in the store
    serve_alone(b, 1, np.arange(41) + 500)
    serve_alone(b, 2, np.arange(41) + 600)  # the store (20 pages) evicted `first`
    assert b.peek_tiers(first[:-1]).storage == 0 and a.tiers.host.peek(first)[0] == 40 \
        if policy == "paged" else b.peek_tiers(first[:-1]).storage == 0
    serve_alone(a, 3, np.arange(41) + 900)  # a's host evicts `first`: spilled into the store
    shared.check_invariants()
    assert b.peek_tiers(first[:-1]).storage == 40


def test_attach_errors() -> None:
    a = tiered_policy("paged", PS, 24, 40, 40)
    no_storage = tiered_policy("paged", PS, 24, 40, 0)
    shared = SharedTier(a.tiers.storage)
    with pytest.raises(ValueError, match="storage_tokens > 0"):
        shared.attach(no_storage.tiers)
    with pytest.raises(ValueError, match="lowest tier"):
        SharedTier(a.tiers.host)  # the host spills into storage: not the lowest
    other = tiered_policy("paged", 8, 24, 80, 80)
    with pytest.raises(ValueError, match="pages of 4 tokens"):
        shared.attach(other.tiers)


def test_check_finds_a_write_the_views_did_not_count() -> None:
    t = TierTree("shared", 40, PS)
    shared = SharedTier(t)
    t.store(np.arange(8))  # written past every view
    with pytest.raises(InvariantError, match="the replicas wrote 0 pages"):
        shared.check_invariants()
