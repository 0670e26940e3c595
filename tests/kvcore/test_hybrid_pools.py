"""The hybrid pools on their own (kvcore/swa_pool.py, kvcore/mamba_pool.py): worked examples,
bad input, and a stateful machine against a reference model of who owns which page or slot,
with every invariant checked after every step. About 1 s."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcore.mamba_pool import MambaPool
from kvcore.swa_pool import SWAPagePool


def test_swa_pool_by_hand() -> None:
    pool = SWAPagePool(full_pages=6, swa_pages=3, page_size=4)
    assert pool.can_take(3) == (True, True) and pool.can_take(4) == (True, False)
    full = pool.full.pop_host(3)
    pool.map_new(full)
    assert pool.swa_used_pages() == 3 and pool.has_swa(full).all()
    assert pool.free_swa(full[:2]) == 2  # two tokens' pages leave the window
    assert pool.swa_free_pages() == 2 and pool.has_swa(full).tolist() == [False, False, True]
    other = pool.full.pop_host(1)
    pool.move_swa(full[2:], other)  # a tombstone revived with these SWA pages
    assert pool.has_swa(other).all() and not pool.has_swa(full).any()
    pool.free(np.concatenate([full, other]))
    assert pool.full.free_page_count() == 6 and pool.swa_free_pages() == 3
    pool.check_invariants()
    with pytest.raises(ValueError, match="SWA pool has 3 free pages, 4 asked"):
        pool.map_new(pool.full.pop_host(4))


def test_mamba_pool_by_hand() -> None:
    pool = MambaPool(3, state_bytes=8, store=True)
    a, b = pool.alloc(), pool.alloc()
    assert (a, b) == (0, 1) and pool.available_size() == 1
    pool.buffer[a] = 7
    pool.copy(a, b)  # copy on write: the request's slot gets the cached state
    assert pool.buffer[b].tolist() == [7] * 8 and pool.copies == 1
    pool.free(a)
    with pytest.raises(ValueError, match="already free"):
        pool.free(a)
    with pytest.raises(ValueError, match="copy src slot 0 is not in use"):
        pool.copy(a, b)
    assert pool.alloc() == a  # LIFO reuse
    pool.check_invariants()


class PoolsMachine(RuleBasedStateMachine):
    """Random allocations, SWA frees, moves and frees; the reference knows each owner."""

    @initialize(full=st.integers(1, 12), swa=st.integers(1, 12), slots=st.integers(1, 6))
    def create(self, full: int, swa: int, slots: int) -> None:
        self.pool = SWAPagePool(full, swa, 2)
        self.states = MambaPool(slots, 4)
        self.with_swa: set[int] = set()  # full pages that have an SWA page
        self.without: set[int] = set()  # full pages in use whose SWA page was freed
        self.slots: set[int] = set()

    @rule(n=st.integers(1, 4))
    def alloc(self, n: int) -> None:
        ok = self.pool.can_take(n)
        if not all(ok):
            return
        pages = self.pool.full.pop_host(n)
        self.pool.map_new(pages)
        self.with_swa |= set(pages.tolist())

    @precondition(lambda self: self.with_swa)
    @rule(data=st.data())
    def free_swa(self, data: st.DataObject) -> None:
        pages = data.draw(st.lists(st.sampled_from(sorted(self.with_swa)), unique=True,
                                   min_size=1))
        assert self.pool.free_swa(np.array(pages)) == len(pages)
        self.with_swa -= set(pages)
        self.without |= set(pages)

    @precondition(lambda self: self.with_swa and self.without)
    @rule(data=st.data())
    def move(self, data: st.DataObject) -> None:
        src = data.draw(st.sampled_from(sorted(self.with_swa)))
        dst = data.draw(st.sampled_from(sorted(self.without)))
        self.pool.move_swa(np.array([src]), np.array([dst]))
        self.with_swa ^= {src, dst}
        self.without ^= {src, dst}

    @precondition(lambda self: self.with_swa or self.without)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        pages = data.draw(st.lists(st.sampled_from(sorted(self.with_swa | self.without)),
                                   unique=True, min_size=1))
        self.pool.free(np.array(pages))
        self.with_swa -= set(pages)
        self.without -= set(pages)

    @rule(take=st.booleans(), data=st.data())
    def state(self, take: bool, data: st.DataObject) -> None:
        if take:
            s = self.states.alloc()
            assert (s is None) == (len(self.slots) == self.states.size)
            if s is not None:
                assert s not in self.slots
                self.slots.add(s)
        elif self.slots:
            s = data.draw(st.sampled_from(sorted(self.slots)))
            self.states.free(s)
            self.slots.remove(s)

    @invariant()
    def agree(self) -> None:
        pool = self.pool
        pool.check_invariants()
        self.states.check_invariants()
        # pages in use + free = capacity, per pool
        used = len(self.with_swa) + len(self.without)
        assert used + pool.full.free_page_count() == pool.full.num_pages
        assert len(self.with_swa) + pool.swa_free_pages() == pool.swa.num_pages
        assert set(np.flatnonzero(pool.full_to_swa).tolist()) == self.with_swa
        assert set(self.states.in_use().tolist()) == self.slots
        assert len(self.slots) + self.states.available_size() == self.states.size


TestPoolsMachine = PoolsMachine.TestCase
TestPoolsMachine.settings = settings(max_examples=20, stateful_step_count=20, deadline=None)
