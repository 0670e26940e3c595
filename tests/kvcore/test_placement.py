"""Placement: first-fit / best-fit hole lists and the buddy system."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from kvcore.contiguous.placement import (
    BestFit,
    Buddy,
    FirstFit,
    make_placement,
    placement_names,
)
from kvcore.contract.validation import InvariantError


def test_registry_names_and_unknown_name_lists_known() -> None:
    assert placement_names() == ["first-fit", "best-fit", "buddy"]
    with pytest.raises(ValueError, match="first-fit, best-fit, buddy"):
        make_placement("worst-fit", 16, 16)


def test_buddy_needs_power_of_two_max_block() -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        Buddy(4096, 2000)


def test_bad_sizes_name_the_argument() -> None:
    with pytest.raises(ValueError, match="capacity"):
        FirstFit(-1)
    with pytest.raises(ValueError, match="n must be"):
        FirstFit(16).allocate(-3)
    with pytest.raises(ValueError, match="not an allocated block"):
        FirstFit(16).free(0)


def test_seed_example_external_fragmentation_first_fit() -> None:
    # A A A A . . B B B B . . C C C C, a 4-slot request waiting
    pl = FirstFit(16)
    a, x, b, y, c = (pl.allocate(n) for n in (4, 2, 4, 2, 4))
    assert (a, x, b, y, c) == (0, 4, 6, 10, 12)
    pl.free(x)
    pl.free(y)
    pl.check_invariants()
    assert pl.holes() == [(4, 2), (10, 2)]
    assert pl.free_total() == 4
    assert pl.external(4) == 4
    assert pl.external(2) == 0
    assert pl.largest_free_hole() == 2
    assert pl.allocate(4) is None  # refused although 4 slots are free


def test_first_fit_and_best_fit_choose_differently() -> None:
    for cls, want in ((FirstFit, 0), (BestFit, 10)):
        pl = cls(16)
        starts = [pl.allocate(n) for n in (4, 6, 2, 4)]  # 0, 4, 10, 12
        pl.free(starts[0])  # hole of 4 at 0
        pl.free(starts[2])  # hole of 2 at 10
        assert pl.allocate(2) == want
        pl.check_invariants()


def test_free_coalesces_both_neighbours() -> None:
    pl = BestFit(12)
    s = [pl.allocate(4) for _ in range(3)]
    pl.free(s[0])
    pl.free(s[2])
    assert pl.holes() == [(0, 4), (8, 4)]
    pl.free(s[1])
    assert pl.holes() == [(0, 12)]
    pl.check_invariants()


def test_buddy_arenas_of_opt13b() -> None:
    pl = Buddy(15_728, 2048)
    sizes = [1 << k for _, k in pl.arenas]
    assert sizes == [2048] * 7 + [1024, 256, 64, 32, 16]
    assert all(s % (1 << k) == 0 for s, k in pl.arenas)  # naturally aligned
    assert pl.free_total() == 15_728
    assert pl.largest_free_hole() == 2048
    pl.check_invariants()


def test_buddy_split_and_coalesce() -> None:
    pl = Buddy(16, 16)
    assert pl.block_size(3) == 4
    s = pl.allocate(1)
    assert s == 0 and pl.size_of(0) == 1
    assert pl.holes() == [(1, 1), (2, 2), (4, 4), (8, 8)]  # one split per order
    t = pl.allocate(3)
    assert t == 4 and pl.size_of(4) == 4  # smallest free block that fits: no new split
    pl.check_invariants()
    pl.free(s)
    assert pl.holes() == [(0, 4), (8, 8)]  # 0 and 1, then 0..1 and 2..3 coalesce
    pl.free(t)
    assert pl.holes() == [(0, 16)]
    pl.check_invariants()


def test_buddy_never_coalesces_across_arenas() -> None:
    pl = Buddy(24, 16)  # arenas 16 @ 0 and 8 @ 16
    assert pl.allocate(17) is None
    s = pl.allocate(8)
    assert s == 16  # the smallest block that fits, no split of the 16
    pl.free(s)
    assert pl.holes() == [(0, 16), (16, 8)]
    assert pl.largest_free_hole() == 16
    assert pl.external(16) == 8  # the 8-block cannot serve a 16-block
    pl.check_invariants()


def test_buddy_external_counts_free_blocks_not_runs() -> None:
    pl = Buddy(16, 16)
    _, b, c, _ = (pl.allocate(4) for _ in range(4))
    pl.free(b)
    pl.free(c)  # 4..7 and 8..11 are adjacent but not buddies
    assert pl.holes() == [(4, 4), (8, 4)]
    assert pl.largest_free_hole() == 4
    assert pl.external(8) == 8
    assert pl.allocate(8) is None
    pl.check_invariants()


def test_check_invariants_catches_corruption() -> None:
    pl = FirstFit(16)
    pl.allocate(4)
    pl._free_total += 1
    with pytest.raises(InvariantError):
        pl.check_invariants()
    bd = Buddy(16, 16)
    s = bd.allocate(4)
    bd._free[2].append(s)  # a block both free and allocated
    with pytest.raises(InvariantError):
        bd.check_invariants()


class PlacementMachine(RuleBasedStateMachine):
    """Random allocate/free against a model of the owned ranges."""

    def __init__(self) -> None:
        super().__init__()
        self.pl = None
        self.owned: dict[int, int] = {}

    @initialize(
        name=st.sampled_from(["first-fit", "best-fit", "buddy"]),
        capacity=st.integers(1, 200),
        max_order=st.integers(0, 6),
    )
    def create(self, name: str, capacity: int, max_order: int) -> None:
        self.pl = make_placement(name, capacity, 1 << max_order)

    @rule(n=st.integers(1, 70))
    def allocate(self, n: int) -> None:
        pl = self.pl
        free_before = pl.free_total()
        fits = pl.largest_free_hole() >= pl.block_size(n) and (
            pl.name != "buddy" or pl.block_size(n) <= pl.max_block
        )
        s = pl.allocate(n)
        assert (s is not None) == fits
        if s is None:
            assert pl.free_total() == free_before
            return
        size = pl.size_of(s)
        assert size == pl.block_size(n) >= n
        for t, z in self.owned.items():
            assert s + size <= t or t + z <= s
        self.owned[s] = size
        assert pl.free_total() == free_before - size

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        if not self.owned:
            return
        s = data.draw(st.sampled_from(sorted(self.owned)))
        assert self.pl.free(s) == self.owned.pop(s)

    @invariant()
    def consistent(self) -> None:
        if self.pl is None:
            return
        pl = self.pl
        pl.check_invariants()
        assert pl.free_total() == pl.capacity - sum(self.owned.values())
        assert pl.allocated() == self.owned
        holes = pl.holes()
        assert pl.largest_free_hole() == max((z for _, z in holes), default=0)
        for need in (1, 3, 8):
            assert pl.external(need) == sum(z for _, z in holes if z < pl.block_size(need))
        if not self.owned:  # everything coalesced back
            assert len(holes) == (len(pl.arenas) if pl.name == "buddy" else 1)


TestPlacementMachine = PlacementMachine.TestCase
TestPlacementMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
