"""PagedAllocator: worked examples, three-part extend fill, frees, free groups, backup/restore,
bad input (ValueError, state unchanged) and a stateful test against a set-of-pages model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tests.kvcore.sglang_api import SGLangPagedAllocator as PagedAllocator

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="no CUDA device")])]


def _free_list(a: PagedAllocator) -> list[int]:
    return a.free_pages_view().tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_six_tokens_take_two_pages(device: str) -> None:
    a = PagedAllocator(8, 4, device)
    out = a.alloc_extend([0], [6], [-1])  # cached_len 0, device_len 6
    assert out is not None and len(out) == 6
    pages = set((out // 4).tolist())
    # first_page = ceil(0/4) = 0, last_page = ceil(6/4) = 2: two pages, 2 slots unused
    assert len(pages) == 2
    assert a.available_size() == (8 - 2) * 4
    # the unused tail, counted from what was handed out: the slots of those two pages that no
    # token got are exactly the last page's final two
    spare = sorted({p * 4 + i for p in pages for i in range(4)} - set(out.tolist()))
    last = int(out[-1]) // 4  # the page of the sixth token
    assert spare == [last * 4 + 2, last * 4 + 3]
    # the partial last page serves the request's own next decode tokens first
    nxt = a.alloc_decode([7], [int(out[-1])])
    assert nxt is not None and int(nxt[0]) == int(out[-1]) + 1
    nxt2 = a.alloc_decode([8], [int(nxt[0])])
    assert int(nxt2[0]) == int(out[-1]) + 2 and a.available_size() == 6 * 4
    nxt3 = a.alloc_decode([9], [int(nxt2[0])])  # page full: a fresh page
    assert int(nxt3[0]) % 4 == 0 and int(nxt3[0]) // 4 not in pages
    assert a.available_size() == 5 * 4
    a.check_invariants()


def test_pages_to_slots_worked_example() -> None:
    a = PagedAllocator(8, 4)
    slots = a.pages_to_slots(torch.tensor([1, 3]))  # page starts 4 and 12
    assert slots.tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    assert PagedAllocator(8, 1).pages_to_slots(torch.tensor([1, 3])).tolist() == [1, 3]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ps", [1, 3, 4, 16])
def test_extend_three_part_fill(ps: int, device: str) -> None:
    a = PagedAllocator(64, ps, device)
    first = a.alloc_extend([0, 0], [ps + 1, 2], [-1, -1])  # both end inside a page
    assert first is not None
    l0, l1 = int(first[ps]), int(first[-1])
    pre, seq = [ps + 1, 2], [4 * ps + 2, 3]
    out = a.alloc_extend(pre, seq, [l0, l1])
    assert out is not None and len(out) == (4 * ps + 2 - ps - 1) + 1
    r0, r1 = out[: 3 * ps + 1].tolist(), out[3 * ps + 1 :].tolist()
    for j, slot in enumerate(r0):
        pos = ps + 1 + j
        assert slot % ps == pos % ps
        if pos < 2 * ps:  # part 1: the rest of its own partial page
            assert slot == l0 + 1 + j
    # parts 2 and 3: whole new pages, then one partial page, each page's slots contiguous
    tail = r0[2 * ps - (ps + 1) :]
    for k in range(0, len(tail), ps):
        page = tail[k : k + ps]
        assert page == list(range(page[0], page[0] + len(page))) and page[0] % ps == 0
    if ps > 2:
        assert r1 == [l1 + 1]  # request 1 stays on its page
    a.check_invariants()


def test_alloc_counts_pages_and_returns_none_when_short() -> None:
    a = PagedAllocator(4, 4)
    before = _free_list(a)
    assert a.alloc_extend([0, 0], [9, 8], [-1, -1]) is None  # 3 + 2 pages > 4
    assert _free_list(a) == before and a.available_size() == 16
    assert a.alloc_decode([1] * 5, [-1] * 5) is None
    assert a.alloc(20) is None and a.alloc_pages(5) is None
    assert _free_list(a) == before
    got = a.alloc(16)
    assert got is not None and sorted(got.tolist()) == list(range(4, 20))
    assert a.available_size() == 0
    assert a.alloc(0) is not None and len(a.alloc(0)) == 0


def test_free_is_page_granular_and_lifo() -> None:
    a = PagedAllocator(4, 4)
    s = a.alloc(8)
    a.free(s[1:2])  # any slot of a page frees the whole page
    assert a.available_size() == 12
    with pytest.raises(ValueError, match="double free"):
        a.free(s[0:1])
    a.free(s[4:5])
    again = a.alloc(4)
    assert int(again[0]) // 4 == int(s[4]) // 4  # most recently freed page comes back first


def test_free_copies_no_free_list() -> None:
    a = PagedAllocator(256, 2)
    ptr, mask = a._stack.data_ptr(), a._is_free.data_ptr()
    held = [a.alloc(4) for _ in range(20)]
    for h in held[::2]:
        a.free(h)
    a.free_group_begin()
    for h in held[1::2]:
        a.free(h)
    a.free_group_end()
    assert a._stack.data_ptr() == ptr and a._is_free.data_ptr() == mask
    assert a.available_size() == 512
    a.check_invariants()


def test_free_group_defers_and_rejects_double_free() -> None:
    a = PagedAllocator(8, 2)
    s = a.alloc(8)
    a.free_group_begin()
    a.free(s[:2])
    assert a.available_size() == 8  # deferred
    before = _free_list(a)
    with pytest.raises(ValueError, match="double free inside a free group"):
        a.free(s[1:2])
    assert _free_list(a) == before
    with pytest.raises(ValueError, match="cannot nest"):
        a.free_group_begin()
    a.free(s[2:8])
    a.free_group_end()
    assert a.available_size() == 16
    with pytest.raises(ValueError, match="without free_group_begin"):
        a.free_group_end()
    a.check_invariants()


@pytest.mark.parametrize("device", DEVICES)
def test_backup_restore_exact(device: str) -> None:
    a = PagedAllocator(16, 2, device)
    kept = a.alloc(6)
    other = a.alloc(4)
    before = _free_list(a)
    state = a.backup_state()
    x = a.alloc(8)
    a.free(other)  # frees in between overwrite stack entries: the undo log restores them
    a.free(x[:2])
    a.alloc(10)
    a.restore_state(state)
    assert _free_list(a) == before
    a.check_invariants()
    a.free(kept)
    a.free(other)
    assert a.available_size() == 32


def test_nested_backup_restore() -> None:
    a = PagedAllocator(10, 1)
    s0 = a.backup_state()
    x = a.alloc(3)
    mid = _free_list(a)
    s1 = a.backup_state()
    a.free(x)
    a.alloc(5)
    a.restore_state(s1)
    assert _free_list(a) == mid
    a.restore_state(s0)
    assert _free_list(a) == list(range(10, 0, -1))
    a.discard_backup()
    with pytest.raises(ValueError, match="restore_state"):
        a.restore_state(s1)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_bad_page_size(bad: object) -> None:
    with pytest.raises(ValueError, match=f"page_size must be a positive integer, got {bad!r}"):
        PagedAllocator(4, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_pages"):
        PagedAllocator(bad, 4)  # type: ignore[arg-type]


def test_bad_lengths_and_frees_leave_state_unchanged() -> None:
    a = PagedAllocator(8, 4)
    held = a.alloc(8)
    before = _free_list(a)
    cases = [
        (lambda: a.alloc(-1), "need_size must be a non-negative integer, got -1"),
        (lambda: a.alloc(6), "need_size 6 is not a multiple of page_size 4"),
        (lambda: a.alloc_pages(-2), "n must be a non-negative integer, got -2"),
        (lambda: a.alloc_extend([-1], [3], [-1]), "prefix_lens"),
        (lambda: a.alloc_extend([5], [3], [-1]), "seq_lens"),
        (lambda: a.alloc_extend([2], [3], [16]), "last_loc"),
        (lambda: a.alloc_extend([0, 0], [3], [-1]), "same length"),
        (lambda: a.alloc_decode([0], [-1]), "seq_lens must be >= 1"),
        (lambda: a.free([40]), r"slots must be in \[4, 36\).*40"),
        (lambda: a.free([2]), r"slots must be in .*\[2\]"),
        (lambda: a.free([-3]), "slots must be in"),
        (lambda: a.free([20]), "double free"),  # a page nobody owns
        (lambda: a.free([int(held[0]), 20]), "double free"),  # nothing freed on error
        (lambda: a.free_pages([0]), "page ids"),
    ]
    for call, msg in cases:
        with pytest.raises(ValueError, match=msg):
            call()
        assert _free_list(a) == before
        a.check_invariants()
    a.free(held)
    with pytest.raises(ValueError, match="double free"):
        a.free(held)
    assert a.available_size() == 32


# -- stateful: allocator alone, against a set of free pages --------------------------------------


class AllocMachine(RuleBasedStateMachine):
    PS = 1
    N = 10

    def __init__(self) -> None:
        super().__init__()
        self.a = PagedAllocator(self.N, self.PS)
        self.free = set(range(1, self.N + 1))
        self.held: list[list[int]] = []  # per sequence: its slots in order
        self.backup: tuple | None = None

    @rule(lens=st.lists(st.integers(1, 40), min_size=1, max_size=3))
    def extend_new(self, lens: list[int]) -> None:
        ps = self.PS
        need = sum(-(-n // ps) for n in lens)
        out = self.a.alloc_extend([0] * len(lens), lens, [-1] * len(lens))
        if need > len(self.free):
            assert out is None
            return
        assert out is not None
        pages = set((out // ps).tolist())
        assert len(pages) == need and pages <= self.free
        self.free -= pages
        i = 0
        for n in lens:
            self.held.append(out[i : i + n].tolist())
            i += n

    @rule(data=st.data())
    def decode(self, data) -> None:
        if not self.held:
            return
        idx = data.draw(st.lists(st.integers(0, len(self.held) - 1), min_size=1, unique=True))
        ps = self.PS
        ws = [len(self.held[i]) for i in idx]
        need = sum(w % ps == 0 for w in ws)
        out = self.a.alloc_decode([w + 1 for w in ws], [self.held[i][-1] for i in idx])
        if need > len(self.free):
            assert out is None
            return
        for i, w, s in zip(idx, ws, out.tolist(), strict=True):
            if w % ps:
                assert s == self.held[i][-1] + 1
            else:
                assert s // ps in self.free
                self.free.discard(s // ps)
            self.held[i].append(s)

    @rule(data=st.data(), group=st.booleans())
    def free_some(self, data, group: bool) -> None:
        if not self.held:
            return
        idx = sorted(set(data.draw(st.lists(st.integers(0, len(self.held) - 1), min_size=1))))
        if group:
            self.a.free_group_begin()
        for i in idx:
            self.a.free(torch.tensor(self.held[i]))
        if group:
            self.a.free_group_end()
        for i in reversed(idx):
            self.free |= {s // self.PS for s in self.held.pop(i)}

    @rule()
    def backup(self) -> None:
        self.backup = (self.a.backup_state(), [list(h) for h in self.held], set(self.free),
                       self.a.free_pages_view().tolist())

    @rule()
    def restore(self) -> None:
        if self.backup is None:
            return
        state, held, free, stack = self.backup
        self.a.restore_state(state)
        assert self.a.free_pages_view().tolist() == stack
        self.held, self.free, self.backup = [list(h) for h in held], free, None

    @invariant()
    def consistent(self) -> None:
        self.a.check_invariants()
        assert set(self.a.free_pages_view().tolist()) == self.free
        assert self.a.available_size() == len(self.free) * self.PS
        owned = [s // self.PS for h in self.held for s in h[:: self.PS]]
        assert len(set(owned)) == len(owned) and not set(owned) & self.free
        assert len(owned) + len(self.free) == self.N


@pytest.mark.parametrize("ps", [1, 2, 16, 64])
def test_allocator_stateful(ps: int) -> None:
    m = type(f"AllocMachinePs{ps}", (AllocMachine,), {"PS": ps})
    run_state_machine_as_test(m, settings=settings(
        max_examples=20, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))


def test_host_frees_validate_like_free_pages() -> None:
    """free_page and push_host (the policies' host-array frees) refuse what free_pages refuses,
    leave the state unchanged when they do, and defer inside a free group."""
    a = PagedAllocator(8, 4)
    pages = a.pop_host(3)
    assert pages is not None and pages.tolist() == [1, 2, 3]
    before = _free_list(a)
    for bad in (0, 9, 5):  # the dummy page, out of range, already free
        with pytest.raises(ValueError):
            a.free_page(bad)
        with pytest.raises(ValueError):
            a.push_host(np.array([bad], dtype=np.int64))
    assert _free_list(a) == before
    a.free_page(2)
    with pytest.raises(ValueError, match="double free"):
        a.free_page(2)
    a.free_group_begin()
    a.push_host(np.array([1], dtype=np.int64))
    assert not a.is_page_free(torch.tensor([1])).item()  # collected, not yet free
    a.free_group_end()
    assert _free_list(a)[-2:] == [2, 1]
    a.check_invariants()


def test_host_alloc_forms_equal_tensor_forms() -> None:
    a, b = PagedAllocator(32, 4), PagedAllocator(32, 4)
    pre, seq = np.array([0, 0, 0]), np.array([5, 9, 2])
    t = a.alloc_extend(torch.from_numpy(pre), torch.from_numpy(seq), torch.tensor([-1, -1, -1]))
    h = b.alloc_extend_host(pre, seq, np.array([-1, -1, -1]))
    assert t.tolist() == h.tolist()
    one_t = a.alloc_extend([5], [11], [int(t[4])])
    one_h = b.alloc_extend_one(5, 11, int(h[4]))
    assert one_t.tolist() == one_h.tolist()
    assert a.alloc_decode([12], [int(one_t[-1])]).tolist() == \
        b.alloc_decode_host(np.array([12]), np.array([int(one_h[-1])])).tolist()
    assert _free_list(a) == _free_list(b)
