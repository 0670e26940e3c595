"""RadixCache: unit tests, bad input, and a stateful test that drives PagedAllocator + RadixCache
the way SGLang's scheduler does, against a brute-force reference model of plain sets and dicts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvcore.sglang.node import partial_page_hit
from kvcore.sglang.radix_cache import RadixCache
from tests.kvcore.sglang_api import SGLangPagedAllocator as PagedAllocator

CUDA = torch.cuda.is_available()


def _tree(ps: int, pages: int = 64, device: str = "cpu", **kw) -> tuple[PagedAllocator, RadixCache]:
    alloc = PagedAllocator(pages, ps, device)
    return alloc, RadixCache(ps, alloc, **kw)


def _insert_fresh(alloc: PagedAllocator, tree: RadixCache, key: list[int]) -> torch.Tensor:
    """Insert `key` (page-aligned length) with freshly allocated slots; free duplicates."""
    slots = alloc.alloc(len(key))
    assert slots is not None
    already = tree.insert(key, slots)[0]
    if already:
        alloc.free(slots[:already])
    return slots


# -- unit tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("ps", [1, 4])
def test_insert_match_split(ps: int, device: str) -> None:
    if device == "cuda" and not CUDA:
        pytest.skip("no CUDA device")
    alloc, tree = _tree(ps, device=device)
    a = list(range(4 * ps))
    b = a[: 2 * ps] + [99] * (2 * ps)
    sa = _insert_fresh(alloc, tree, a)
    assert tree.total_size() == 4 * ps == tree.evictable_size()
    m = tree.match_prefix(b)
    assert len(m.indices) == 2 * ps  # the match ends inside a's node: it is split there
    assert torch.equal(m.indices.cpu(), sa[: 2 * ps].cpu())
    assert len(tree.nodes()) == 2 and tree.total_size() == 4 * ps
    sb = alloc.alloc(4 * ps)
    assert tree.insert(b, sb)[0] == 2 * ps  # b's first two pages were cached already
    alloc.free(sb[: 2 * ps])
    tree.check_invariants()
    # a key shorter than a page matches nothing; a partial last page is rounded down
    assert len(tree.match_prefix(a[: ps - 1] if ps > 1 else []).indices) == 0
    assert len(tree.match_prefix(a + [7] * (ps - 1)).indices) == 4 * ps


def test_insert_returns_cached_length_and_is_idempotent() -> None:
    alloc, tree = _tree(4)
    key = list(range(12))
    _insert_fresh(alloc, tree, key)
    before = (tree.total_size(), tree.evictable_size(), alloc.available_size())
    dup = alloc.alloc(12)
    assert tree.insert(key, dup)[0] == 12
    alloc.free(dup)
    assert (tree.total_size(), tree.evictable_size(), alloc.available_size()) == before
    # a 14-token key: only the whole pages are inserted
    slots = alloc.alloc(16)
    assert tree.insert([*key, 50, 51], slots[:14])[0] == 12
    assert tree.total_size() == 12
    assert len(tree.match_prefix([*key, 50, 51, 52, 53]).indices) == 12
    tree.check_invariants()


def test_locks_protect_and_restore_sizes() -> None:
    alloc, tree = _tree(2)
    _insert_fresh(alloc, tree, [1, 2, 3, 4, 5, 6])
    _insert_fresh(alloc, tree, [1, 2, 3, 4, 9, 9])
    m = tree.match_prefix([1, 2, 3, 4, 5, 6])
    tree.inc_lock_ref(m.last_node)
    assert tree.protected_size() == 6 and tree.evictable_size() == 2
    assert tree.evict(100) == 2  # only the unlocked [9, 9] leaf can go
    assert tree.evictable_size() == 0
    tree.check_invariants()
    tree.dec_lock_ref(m.last_node)
    assert tree.protected_size() == 0 and tree.evictable_size() == 6
    with pytest.raises(ValueError, match="holds no lock"):
        tree.dec_lock_ref(m.last_node)
    tree.check_invariants()


def test_evict_lru_order_and_overshoot() -> None:
    alloc, tree = _tree(1)
    for first in (10, 20, 30):
        _insert_fresh(alloc, tree, [first, 1, 2])
    tree.match_prefix([10, 1, 2])  # touch the oldest: 20.. is now least recently used
    freed_before = alloc.available_size()
    assert tree.evict(1) == 3  # a whole leaf goes
    assert alloc.available_size() == freed_before + 3
    assert len(tree.match_prefix([20, 1, 2]).indices) == 0
    assert len(tree.match_prefix([10, 1, 2]).indices) == 3
    assert len(tree.match_prefix([30, 1, 2]).indices) == 3


@pytest.mark.parametrize("eviction", ["lfu", "fifo"])
def test_other_eviction_policies(eviction: str) -> None:
    alloc, tree = _tree(1, eviction=eviction)
    _insert_fresh(alloc, tree, [1, 1])
    _insert_fresh(alloc, tree, [2, 2])
    for _ in range(3):
        tree.match_prefix([1, 1])
    tree.match_prefix([2, 2])
    tree.evict(1)
    # LFU drops the rarely hit [2, 2]; FIFO the first inserted [1, 1]
    survivor = [1, 1] if eviction == "lfu" else [2, 2]
    assert len(tree.match_prefix(survivor).indices) == 2
    assert tree.total_size() == 2


def test_disabled_cache_holds_nothing() -> None:
    alloc, tree = _tree(1, disable=True)
    slots = alloc.alloc(3)
    assert tree.insert([1, 2, 3], slots)[0] == 0
    m = tree.match_prefix([1, 2, 3])
    assert len(m.indices) == 0 and m.last_node is tree.root
    assert tree.total_size() == 0 and tree.evict(10) == 0


def test_peek_is_read_only_and_counts_token_hits() -> None:
    alloc, tree = _tree(4)
    _insert_fresh(alloc, tree, list(range(8)))
    n_nodes = len(tree.nodes())
    assert tree.peek([*range(6), 77, 78]) == (4, 6)
    assert tree.peek(list(range(8))) == (8, 8)
    assert len(tree.nodes()) == n_nodes


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_bad_page_size(bad: object) -> None:
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(bad)  # type: ignore[arg-type]


def test_bad_eviction_policy_and_value_length() -> None:
    with pytest.raises(ValueError, match="eviction policy 'mru'"):
        RadixCache(1, eviction="mru")
    with pytest.raises(ValueError, match="page_size 2 differs"):
        RadixCache(2, PagedAllocator(4, 1))
    _, tree = _tree(1)
    with pytest.raises(ValueError, match="value has 1 slots for 2 tokens"):
        tree.insert([1, 2], torch.tensor([5]))
    assert tree.total_size() == 0
    with pytest.raises(ValueError, match="1-D"):
        tree.match_prefix([[1, 2]])


# -- stateful test: allocator + radix, as a scheduler drives them --------------------------------

N_PAGES = 8
BASES = 2


class RawMachine(RuleBasedStateMachine):
    """Requests share prefixes drawn from a few base sequences; every answer of the allocator and
    the tree is compared with a reference of plain sets and dicts."""

    PS = 1
    DEVICE = "cpu"
    requests = Bundle("requests")
    locks = Bundle("locks")

    def __init__(self) -> None:
        super().__init__()
        ps = self.PS
        self.alloc = PagedAllocator(N_PAGES, ps, self.DEVICE)
        self.tree = RadixCache(ps, self.alloc)
        rng = np.random.default_rng(ps)
        self.bases = [rng.integers(0, 5, size=4 * ps + 4).tolist() for _ in range(BASES)]
        # reference model
        self.free: set[int] = set(range(1, N_PAGES + 1))
        self.cache: dict[tuple[int, ...], tuple[int, ...]] = {}  # page prefix -> its slots
        self.reqs: dict[int, dict] = {}
        self.probe_locks: dict[int, tuple] = {}
        self.next_id = 0

    # reference helpers
    def ref_match(self, key: list[int]) -> list[int]:
        ps, out, k = self.PS, [], 0
        while (k + 1) * ps <= len(key) and tuple(key[: (k + 1) * ps]) in self.cache:
            out.extend(self.cache[tuple(key[: (k + 1) * ps])])
            k += 1
        return out

    def locked_prefixes(self) -> list[tuple[int, ...]]:
        out = [tuple(r["tokens"][: r["cached"]]) for r in self.reqs.values()]
        out += [p for p, _ in self.probe_locks.values()]
        return [p for p in out if p]

    def ref_protected(self) -> set[tuple[int, ...]]:
        return {k for k in self.cache for p in self.locked_prefixes() if p[: len(k)] == k}

    def private_pages(self) -> set[int]:
        ps, out = self.PS, set()
        for r in self.reqs.values():
            out.update(s // ps for s in r["slots"][r["cached"] :])
        return out

    def slots_t(self, xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.int64, device=self.DEVICE)

    # rules
    @rule(target=requests, base=st.integers(0, BASES - 1), share=st.integers(0, 4),
          extra=st.integers(1, 6), data=st.data())
    def new_request(self, base: int, share: int, extra: int, data) -> int:
        ps = self.PS
        shared = self.bases[base][: share * ps + data.draw(st.integers(0, 4))]
        tail = data.draw(st.lists(st.integers(0, 4), min_size=extra, max_size=extra + ps))
        tokens = shared + tail
        prompt = tokens[: max(len(tokens) - 1, 0)]
        m = self.tree.match_prefix(prompt)
        ref = self.ref_match(prompt)
        assert m.indices.tolist() == ref
        event("request hit" if ref else "request miss")
        self.tree.inc_lock_ref(m.last_node)
        rid = self.next_id
        self.next_id += 1
        self.reqs[rid] = {"tokens": tokens, "cached": len(ref), "slots": list(ref),
                          "node": m.last_node}
        return rid

    @rule(rids=st.lists(requests, min_size=1, max_size=3, unique=True), data=st.data())
    def extend(self, rids: list[int], data) -> None:
        rids = [r for r in rids if r in self.reqs]
        if not rids:
            return
        seq = [data.draw(st.integers(len(self.reqs[r]["slots"]), len(self.reqs[r]["tokens"])))
               for r in rids]
        self._extend(rids, seq)

    def _extend(self, rids: list[int], seq: list[int]) -> bool:
        ps = self.PS
        pre = [len(self.reqs[r]["slots"]) for r in rids]
        last = [self.reqs[r]["slots"][-1] if w else -1 for r, w in zip(rids, pre, strict=True)]
        need = sum(-(-s // ps) - -(-p // ps) for p, s in zip(pre, seq, strict=True))
        before = self.alloc.free_pages_view().clone()
        out = self.alloc.alloc_extend(pre, seq, last)
        if need > len(self.free):
            event("extend refused")
            assert out is None
            assert torch.equal(self.alloc.free_pages_view(), before)
            return False
        assert out is not None
        out = out.tolist()
        assert len(out) == sum(seq) - sum(pre)
        new_pages: set[int] = set()
        i = 0
        for rid, p, s, lst in zip(rids, pre, seq, last, strict=True):
            mine = out[i : i + s - p]
            i += s - p
            for j, slot in enumerate(mine):
                pos = p + j
                assert slot % ps == pos % ps
                if pos < -(-p // ps) * ps:
                    assert slot == lst + 1 + j  # the partial last page is filled first
                else:
                    new_pages.add(slot // ps)
            self.reqs[rid]["slots"].extend(mine)
        assert len(new_pages) == need and new_pages <= self.free
        self.free -= new_pages
        return True

    @rule(rid=consumes(requests))
    def complete(self, rid: int) -> None:
        """Prefill the rest of the request at once, then finish it (caches its pages)."""
        if rid in self.reqs:
            r = self.reqs[rid]
            if self._extend([rid], [len(r["tokens"])]):
                self._drop(rid, insert=True)
            else:
                self._drop(rid, insert=False)

    @rule(rids=st.lists(requests, min_size=1, max_size=4, unique=True))
    def decode(self, rids: list[int]) -> None:
        rids = [r for r in rids if r in self.reqs
                and len(self.reqs[r]["slots"]) < len(self.reqs[r]["tokens"])]
        if not rids:
            return
        ps = self.PS
        ws = [len(self.reqs[r]["slots"]) for r in rids]
        last = [self.reqs[r]["slots"][-1] if w else -1 for r, w in zip(rids, ws, strict=True)]
        need = sum(w % ps == 0 for w in ws)
        out = self.alloc.alloc_decode([w + 1 for w in ws], last)
        if need > len(self.free):
            assert out is None
            return
        assert out is not None
        for rid, w, lst, slot in zip(rids, ws, last, out.tolist(), strict=True):
            assert slot % ps == w % ps
            if w % ps:
                assert slot == lst + 1  # own partial page first
            else:
                assert slot // ps in self.free
                self.free.discard(slot // ps)
            self.reqs[rid]["slots"].append(slot)

    def _drop(self, rid: int, insert: bool) -> None:
        ps = self.PS
        r = self.reqs.pop(rid)
        slots, cached = r["slots"], r["cached"]
        w = len(slots)
        if insert:
            n = w - w % ps
            key = r["tokens"][:n]
            ref_already = len(self.ref_match(key))
            already = self.tree.insert(key, self.slots_t(slots[:n]) if n else self.slots_t([]))[0]
            assert already == ref_already
            event("insert found cached" if already else "insert new")
            for k in range(already // ps, n // ps):
                self.cache[tuple(key[: (k + 1) * ps])] = tuple(slots[k * ps : (k + 1) * ps])
            to_free = slots[cached:already] + slots[n:]  # duplicates, then the partial page
        else:
            to_free = slots[cached:]
        self.tree.dec_lock_ref(r["node"])
        if to_free:
            avail = self.alloc.available_size()
            self.alloc.free(self.slots_t(to_free))
            pages = {s // ps for s in to_free}
            assert self.alloc.available_size() == avail + len(pages) * ps
            self.free |= pages

    @rule(rid=consumes(requests))
    def finish(self, rid: int) -> None:
        if rid in self.reqs:
            self._drop(rid, insert=True)

    @rule(rid=consumes(requests))
    def release(self, rid: int) -> None:
        if rid in self.reqs:
            self._drop(rid, insert=False)

    @rule(base=st.integers(0, BASES - 1), n=st.integers(0, 40), data=st.data())
    def match(self, base: int, n: int, data) -> None:
        key = self.bases[base][:n] + data.draw(st.lists(st.integers(0, 4), max_size=3))
        before = (self.tree.total_size(), self.tree.evictable_size(), self.tree.protected_size())
        assert self.tree.match_prefix(key).indices.tolist() == self.ref_match(key)
        after = (self.tree.total_size(), self.tree.evictable_size(), self.tree.protected_size())
        assert before == after  # a split changes no size

    @rule(target=locks, base=st.integers(0, BASES - 1), n=st.integers(1, 40))
    def lock(self, base: int, n: int) -> int:
        key = self.bases[base][:n]
        m = self.tree.match_prefix(key)
        self.tree.inc_lock_ref(m.last_node)
        lid = self.next_id
        self.next_id += 1
        self.probe_locks[lid] = (tuple(key[: len(m.indices)]), m.last_node)
        return lid

    @rule(lid=consumes(locks))
    def unlock(self, lid: int) -> None:
        _, node = self.probe_locks.pop(lid)
        self.tree.dec_lock_ref(node)

    @precondition(lambda self: self.tree.evictable_size() > 0)
    @rule(n=st.integers(0, 3 * N_PAGES))
    def evict(self, n: int) -> None:
        ps = self.PS
        n *= ps // 2 or 1
        evictable = self.tree.evictable_size()
        avail = self.alloc.available_size()
        nodes = {id(x): x for x in self.tree.nodes()}
        info = {k: (x.last_access, x.lock_ref) for k, x in nodes.items()}
        protected = self.ref_protected()
        evicted = self.tree.evict(n)
        event("evicted" if evicted else "evicted nothing")
        survivors = {id(x) for x in self.tree.nodes()}
        gone = [k for k in nodes if k not in survivors]
        assert evicted == sum(len(nodes[k].key) for k in gone)
        assert evicted >= min(n, evictable)
        assert all(info[k][1] == 0 for k in gone)  # only unlocked nodes go
        assert self.alloc.available_size() == avail + evicted
        if n >= evictable:
            assert self.tree.evictable_size() == 0
        leaves = [x for x in self.tree.nodes() if not x.children and x.lock_ref == 0]
        if gone and leaves:  # LRU: nothing evicted is more recent than a surviving leaf
            assert max(info[k][0] for k in gone) <= min(x.last_access for x in leaves)
        # reference: drop the evicted pages; they were unlocked and closed under extension
        freed = {p for p in range(1, N_PAGES + 1) if bool(self.alloc.is_page_free(
            torch.tensor([p], device=self.DEVICE)))} - self.free
        dropped = [k for k, v in self.cache.items() if v[0] // ps in freed]
        assert len(dropped) * ps == evicted
        for k in dropped:
            assert k not in protected
            del self.cache[k]
        for k in self.cache:  # only leaves go: nothing left extends an evicted prefix
            assert not any(len(k) > len(d) and k[: len(d)] == d for d in dropped)
        self.free |= freed

    @invariant()
    def consistent(self) -> None:
        ps = self.PS
        self.alloc.check_invariants()
        self.tree.check_invariants()
        assert self.alloc.available_size() == len(self.free) * ps
        assert set(self.alloc.free_pages_view().tolist()) == self.free
        protected = self.ref_protected()
        assert self.tree.protected_size() == len(protected) * ps
        assert self.tree.evictable_size() == (len(self.cache) - len(protected)) * ps
        tree_pages = {v[0] // ps for v in self.cache.values()}
        private = self.private_pages()
        assert len(tree_pages) == len(self.cache)
        assert not (tree_pages & private) and not (tree_pages & self.free)
        assert not (private & self.free)
        assert len(tree_pages) + len(private) + len(self.free) == N_PAGES


def _machine(ps: int, device: str = "cpu") -> type[RawMachine]:
    return type(f"RawMachinePs{ps}", (RawMachine,), {"PS": ps, "DEVICE": device})


_SETTINGS = settings(max_examples=20, stateful_step_count=50, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("ps", [1, 2, 16, 64])
def test_raw_allocator_and_radix_stateful(ps: int) -> None:
    run_state_machine_as_test(_machine(ps), settings=_SETTINGS)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="no CUDA device")
@pytest.mark.parametrize("ps", [1, 16])
def test_raw_allocator_and_radix_stateful_cuda(ps: int) -> None:
    run_state_machine_as_test(
        _machine(ps, "cuda"), settings=settings(_SETTINGS, max_examples=10)
    )


def test_evict_all_after_insert_splits_an_evictable_leaf() -> None:
    """A split during insert touches the lower half; it must stay evictable."""
    alloc, tree = _tree(1, pages=16)
    tree.insert([1, 2, 3, 4], alloc.alloc(4))
    s2 = alloc.alloc(3)
    already = tree.insert([1, 2, 9], s2)[0]
    alloc.free(s2[:already])
    assert tree.evictable_size() == 5
    assert tree.evict(100) == 5 and tree.evictable_size() == 0
    assert alloc.available_size() == 16
    tree.check_invariants()


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_insert_then_touch_path_equals_insert_then_match(eviction: str) -> None:
    """The paged policy locks the node insert returns and touches its path instead of
    matching again; both trees must then agree on every node's clock and hit count, and so
    on the eviction order."""
    trees = [RadixCache(4, eviction=eviction) for _ in range(2)]
    keys = [np.arange(16), np.arange(8), np.r_[np.arange(8), np.arange(50, 58)], np.arange(12),
            np.arange(200, 210)]
    for k, key in enumerate(keys):
        value = torch.arange(len(key)) + 100 * k
        trees[0].insert(key, value)
        node = trees[0].match_prefix(key).last_node
        _, node1 = trees[1].insert(key, value)
        trees[1].touch_path(node1)
        assert [len(n.key) for n in _path(node1)] == [len(n.key) for n in _path(node)]

    def state(t: RadixCache) -> list[tuple]:
        return sorted((tuple(n.key.tolist()), n.hit_count, n.last_access) for n in t.nodes())

    assert state(trees[0]) == state(trees[1])
    orders = []
    for t in trees:
        sizes: list[int] = []
        t.evict(10**6, sizes)
        orders.append(sizes)
    assert orders[0] == orders[1] and sum(orders[0]) > 0


def _path(node):
    out = []
    while node.parent is not None:
        out.append(node)
        node = node.parent
    return out


@settings(max_examples=25, deadline=None)
@given(ps=st.sampled_from([1, 4]), data=st.data())
def test_insert_below_a_locked_node_equals_insert_from_the_root(ps: int, data) -> None:
    """The paged policy inserts a finishing request's pages below its locked match instead
    of walking from the root: both trees must end with the same nodes, clocks, hits, locks
    and eviction order. Prompts share prefixes (a few token values) so paths split."""
    trees = [RadixCache(ps) for _ in range(2)]
    prompts = data.draw(st.lists(st.lists(st.integers(0, 2), min_size=ps, max_size=6 * ps),
                                 min_size=1, max_size=6))
    for k, prompt in enumerate(prompts):
        key = np.array(prompt + [10 + k] * (2 * ps), dtype=np.int64)  # a new tail each
        key = key[: len(key) - len(key) % ps]
        nodes = [t.match_prefix(key[: len(prompt) - len(prompt) % ps]).last_node
                 for t in trees]
        depth = sum(len(n.key) for n in _path(nodes[0]))
        for t, node in zip(trees, nodes, strict=True):
            t.inc_lock_ref(node)
        value = torch.arange(len(key)) + 1000 * k
        got = trees[0].insert(key, value, nodes[0], depth)
        want = trees[1].insert(key, value)
        assert got[0] == want[0] and len(_path(got[1])) == len(_path(want[1]))
        if data.draw(st.booleans()):
            for t, node in zip(trees, nodes, strict=True):
                t.dec_lock_ref(node)

    def state(t: RadixCache) -> list[tuple]:
        return sorted((tuple(n.key.tolist()), n.hit_count, n.last_access, n.lock_ref)
                      for n in t.nodes())

    assert state(trees[0]) == state(trees[1])
    for t in trees:
        t.check_invariants()
    orders = []
    for t in trees:
        sizes: list[int] = []
        t.evict(10**6, sizes)
        orders.append(sizes)
    assert orders[0] == orders[1]


def test_insert_below_needs_a_whole_page_depth_within_the_key() -> None:
    tree = RadixCache(4)
    tree.insert(np.arange(8), torch.arange(8))
    node = tree.match_prefix(np.arange(8)).last_node
    for bad in (0, 6, 12):
        with pytest.raises(ValueError, match=f"insert below depth {bad} of a 8-token key"):
            tree.insert(np.arange(8), torch.arange(8), node, bad)


@settings(max_examples=40, deadline=None)
@given(ps=st.sampled_from([1, 4]), data=st.data())
def test_token_hit_after_the_match_equals_peek_before(ps: int, data) -> None:
    """The paged policy's admission matches once and reads the token-level hit from where
    the match ends (`partial_page_hit`) instead of peeking first: the same number, whether
    the match ends inside a node (a split), at a node's end or before a partial page."""
    tree = RadixCache(ps)
    ids = st.lists(st.integers(0, 2), min_size=0, max_size=5 * ps)
    for k, stored in enumerate(data.draw(st.lists(ids, min_size=1, max_size=5))):
        stored = stored[: len(stored) - len(stored) % ps]
        tree.insert(np.array(stored, dtype=np.int64), torch.arange(len(stored)) + 100 * k)
    key = np.array(data.draw(ids), dtype=np.int64)
    want = tree.peek(key)
    match = tree.match_prefix(key)
    assert len(match.indices) == want[0]
    assert len(match.indices) + partial_page_hit(match.last_node, key,
                                                 len(match.indices)) == want[1]
