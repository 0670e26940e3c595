"""The side pools on their own (kvcore/sglang/swa_pool.py, kvcore/sglang/mamba_pool.py): worked
examples, bad input, and a stateful machine against a reference model of who owns which page or
slot, with every invariant checked after every step. About 1 s."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcore.sglang.mamba_pool import MambaPool
from kvcore.sglang.swa_pool import SWAPagePool


def test_swa_pool_by_hand() -> None:
    pool = SWAPagePool(full_pages=6, swa_pages=3, page_size=4)
    full = pool.pop_host(3)  # each full page comes with an SWA page
    assert full is not None and pool.swa_used_pages() == 3 and pool.has_swa(full).all()
    assert pool.pop_host(1) is None and pool.free_page_count() == 3  # SWA short: none taken
    assert pool.free_swa(full[:2]) == 2  # two tokens' pages leave the window
    assert pool.swa_free_pages() == 2 and pool.has_swa(full).tolist() == [False, False, True]
    other = pool.pop_host(1)
    assert other is not None and pool.free_swa(other) == 1
    pool.move_swa(full[2:], other)  # a tombstone revived with these SWA pages
    assert pool.has_swa(other).all() and not pool.has_swa(full).any()
    pool.push_host(np.concatenate([full, other]))  # the SWA page still mapped goes too
    assert pool.free_page_count() == 6 and pool.swa_free_pages() == 3
    pool.check_invariants()
    slots = pool.alloc_extend_one(0, 9, -1)  # 3 pages of 4 through the allocator's own call
    assert slots is not None and pool.has_swa(slots[::4] // 4).all()
    pool.free_page(int(slots[0]) // 4)  # one page and its SWA page
    assert pool.swa_free_pages() == 1 and pool.free_page_count() == 4
    pool.check_invariants()
    with pytest.raises(ValueError, match="move_swa needs SWA pages on src"):
        pool.move_swa(np.array([int(slots[0]) // 4]), np.array([int(slots[4]) // 4]))


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
    """Random allocations (pages and slots), SWA frees, moves and frees; the reference knows
    each owner."""

    PS = 2

    @initialize(full=st.integers(1, 12), swa=st.integers(1, 12), slots=st.integers(1, 6))
    def create(self, full: int, swa: int, slots: int) -> None:
        self.pool = SWAPagePool(full, swa, self.PS)
        self.states = MambaPool(slots, 4)
        self.with_swa: set[int] = set()  # full pages that have an SWA page
        self.without: set[int] = set()  # full pages in use whose SWA page was freed
        self.slots: set[int] = set()

    def took(self, pages: np.ndarray | None, n: int, before: tuple[int, int]) -> None:
        fits = n <= before[0] and n <= before[1]
        assert (pages is not None) == fits
        if pages is None:  # all or nothing: neither pool changed
            assert (self.pool.free_page_count(), self.pool.swa_free_pages()) == before
            return
        assert len(pages) == n and not set(pages.tolist()) & (self.with_swa | self.without)
        self.with_swa |= set(pages.tolist())

    @rule(n=st.integers(1, 4))
    def alloc(self, n: int) -> None:
        before = (self.pool.free_page_count(), self.pool.swa_free_pages())
        self.took(self.pool.pop_host(n), n, before)

    @rule(n=st.integers(1, 4), partial=st.booleans())
    def alloc_slots(self, n: int, partial: bool) -> None:
        before = (self.pool.free_page_count(), self.pool.swa_free_pages())
        out = self.pool.alloc_extend_one(0, n * self.PS - partial, -1)
        self.took(None if out is None else out[:: self.PS] // self.PS, n, before)

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
        if len(pages) == 1 and data.draw(st.booleans()):
            self.pool.free_page(pages[0])
        else:
            self.pool.push_host(np.array(pages))
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
        assert used + pool.free_page_count() == pool.num_pages
        assert len(self.with_swa) + pool.swa_free_pages() == pool.swa.num_pages
        assert set(np.flatnonzero(pool.full_to_swa).tolist()) == self.with_swa
        assert set(self.states.in_use().tolist()) == self.slots
        assert len(self.slots) + self.states.available_size() == self.states.size


TestPoolsMachine = PoolsMachine.TestCase
TestPoolsMachine.settings = settings(max_examples=20, stateful_step_count=20, deadline=None)
