"""Property and stateful tests of the routers' structures: SGLang's approximate tree, llm-d's
LRU index, the consistent-hash ring and the KV event index, each against a plain reference
model, `check_invariants` after every step."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from simulator.fleet.approx_tree import ApproxTree, shared_prefix
from simulator.fleet.hash_ring import HashRing, load_ok
from simulator.fleet.kv_index import KVEventIndex
from simulator.fleet.lru_index import LRUIndex

TENANTS = 3
seqs = st.lists(st.integers(0, 3), min_size=0, max_size=12).map(
    lambda x: np.array(x, dtype=np.int64))


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = 0
    for x, y in zip(a.tolist(), b.tolist(), strict=False):
        if x != y:
            break
        n += 1
    return n


# -- SGLang's approximate tree --------------------------------------------------------------
class ApproxTreeMachine(RuleBasedStateMachine):
    """Model: each tenant's inserted sequences. Until an eviction the tree holds exactly
    their prefixes; after one, never more than them, and each evicted tenant fits."""

    def __init__(self) -> None:
        super().__init__()
        self.tree = ApproxTree()
        for t in range(TENANTS):
            self.tree.add_tenant(t)
        self.model: dict[int, list[np.ndarray]] = {t: [] for t in range(TENANTS)}
        self.evicted = False

    def best(self, q: np.ndarray, t: int) -> int:
        return max((lcp(q, s) for s in self.model[t]), default=0)

    @rule(s=seqs, t=st.integers(0, TENANTS - 1))
    def insert(self, s: np.ndarray, t: int) -> None:
        self.tree.insert(s, t)
        self.model[t].append(s)
        assert self.tree.matched_by(s, t) == len(s)

    @rule(q=seqs)
    def match(self, q: np.ndarray) -> None:
        got = self.tree.prefix_match(q)
        held = [self.tree.matched_by(q, t) for t in range(TENANTS)]
        assert got.matched == max(held)
        if got.matched:
            assert got.tenant is not None and held[got.tenant] == got.matched
        for t in range(TENANTS):
            if self.evicted:
                assert held[t] <= self.best(q, t)
            else:
                assert held[t] == self.best(q, t)

    @rule(limit=st.integers(0, 20))
    def evict(self, limit: int) -> None:
        before = dict(self.tree.size)
        self.tree.evict_tenant_by_size(limit)
        self.evicted = True
        for t, size in self.tree.size.items():
            assert size <= min(limit, before[t]) or size == before[t] <= limit

    @invariant()
    def consistent(self) -> None:
        self.tree.check_invariants()


TestApproxTree = ApproxTreeMachine.TestCase
TestApproxTree.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@given(a=seqs, b=seqs)
def test_shared_prefix_is_the_common_prefix(a: np.ndarray, b: np.ndarray) -> None:
    assert shared_prefix(a, b) == lcp(a, b)


# -- llm-d's approximate LRU index ----------------------------------------------------------
hashes = st.lists(st.integers(0, 9), min_size=0, max_size=8)


class LRUIndexMachine(RuleBasedStateMachine):
    """Model: per server an ordered list of hashes (oldest first), capacity 4."""

    def __init__(self) -> None:
        super().__init__()
        self.index = LRUIndex(4)
        self.model: dict[int, OrderedDict[int, None]] = {}

    @rule(hs=hashes, server=st.integers(0, 2))
    def add(self, hs: list[int], server: int) -> None:
        self.index.add(hs, server)
        lru = self.model.setdefault(server, OrderedDict())
        for h in hs:
            lru.pop(h, None)
            lru[h] = None
            while len(lru) > 4:
                lru.popitem(last=False)

    @rule(hs=hashes)
    def match(self, hs: list[int]) -> None:
        want: dict[int, int] = {}
        for h in hs:
            holders = [s for s, lru in self.model.items() if h in lru]
            if not holders:
                break
            for s in holders:
                want[s] = want.get(s, 0) + 1
        assert self.index.match(hs) == want

    @invariant()
    def same_as_model(self) -> None:
        self.index.check_invariants()
        assert {s: list(lru) for s, lru in self.index.lru.items()} == \
            {s: list(lru) for s, lru in self.model.items()}


TestLRUIndex = LRUIndexMachine.TestCase
TestLRUIndex.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# -- the consistent-hash ring with bounded loads --------------------------------------------
@settings(max_examples=80, deadline=None)
@given(replicas=st.integers(1, 6), points=st.integers(1, 20), key=st.integers(0, 2**64 - 1),
       loads=st.lists(st.integers(0, 20), min_size=6, max_size=6),
       factor=st.floats(1.0, 3.0))
def test_bounded_lookup_takes_the_first_replica_that_fits(replicas, points, key, loads,
                                                          factor) -> None:
    ring = HashRing(replicas, points)
    ring.check_invariants()
    total = sum(loads[:replicas])

    def ok(r: int) -> bool:
        return load_ok(loads[r], total, replicas, factor)

    got, fits = ring.bounded(key, ok)
    owner = ring.lookup(key)
    # walk the ring by hand from the key's point
    i = next((j for j, h in enumerate(ring.hashes) if h >= key), 0)
    order = [ring.owners[(i + s) % len(ring.owners)] for s in range(len(ring.owners))]
    first_ok = next((r for r in order if ok(r)), None)
    assert fits == (first_ok is not None)
    assert got == (first_ok if first_ok is not None else owner)
    if ok(owner):
        assert got == owner


def test_load_ok_is_kubeais_rule() -> None:
    assert load_ok(0, 0, 4, 1.25)  # an idle fleet takes anything
    assert load_ok(1, 8, 4, 1.25)  # 2 <= 9 / 4 * 1.25 = 2.81
    assert not load_ok(2, 8, 4, 1.25)  # 3 > 2.81


# -- the KV event index ---------------------------------------------------------------------
class KVIndexMachine(RuleBasedStateMachine):
    """Model: the events, applied in order once `time + delay <= now`, as multisets."""

    def __init__(self) -> None:
        super().__init__()
        self.delay = 0.5
        self.index = KVEventIndex(3, self.delay)
        self.events: list[tuple[float, int, bool, list[int]]] = []
        self.now = 0.0

    def model(self) -> dict[int, dict[int, int]]:
        held: dict[int, dict[int, int]] = {}
        for t, r, stored, hs in self.events:
            if t + self.delay > self.now:
                break
            for h in hs:
                per = held.setdefault(h, {})
                if stored:
                    per[r] = per.get(r, 0) + 1
                elif per.get(r, 0) > 0:
                    per[r] -= 1
                if not per.get(r, 1):
                    del per[r]
                if not per:
                    del held[h]
        return held

    @rule(dt=st.floats(0, 0.4), r=st.integers(0, 2), stored=st.booleans(), hs=hashes)
    def emit(self, dt: float, r: int, stored: bool, hs: list[int]) -> None:
        self.now += dt
        self.index.emit(self.now, r, stored, np.array(hs, dtype=np.uint64))
        if hs:
            self.events.append((self.now, r, stored, hs))

    @precondition(lambda self: self.events)
    @rule(q=hashes)
    def score(self, q: list[int]) -> None:
        self.index.advance(self.now)
        held = self.model()
        want = {}
        for r in range(3):
            n = 0
            for h in q:
                if r not in held.get(h, {}):
                    break
                n += 1
            if n:
                want[r] = n
        assert self.index.longest_prefix(q) == want

    @invariant()
    def same_as_model(self) -> None:
        self.index.advance(self.now)
        self.index.check_invariants()
        got: dict[int, dict[int, int]] = {}
        for h, r, c in self.index.entries():
            got.setdefault(h, {})[r] = c
        assert got == self.model()


TestKVIndex = KVIndexMachine.TestCase
TestKVIndex.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# -- Dynamo's active blocks -------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=10), min_size=1, max_size=6),
       st.lists(st.integers(0, 2), min_size=0, max_size=10))
def test_dynamo_shared_blocks_are_the_set_count(active, prompt) -> None:
    """`shared_blocks` (a bisection over the chain) counts what a set intersection would, for any
    requests active on a worker (whole chains from block 0) and a new prompt."""
    from collections import Counter

    from kvcore.vllm.block_hash import NONE_HASH, ChainHasher
    from simulator.fleet.dynamo_router import shared_blocks

    hasher = ChainHasher(2, 64)

    def chain(tokens: list[int]) -> list[int]:
        return [int(h) for h in hasher.chain(NONE_HASH, np.repeat(tokens, 2))]

    blocks: Counter[int] = Counter()
    for a in active:
        blocks.update(chain(a))
    hashes = chain(prompt)
    assert shared_blocks(hashes, blocks) == len(set(hashes) & set(blocks))
