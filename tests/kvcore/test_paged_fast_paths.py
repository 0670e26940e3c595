"""The full-attention manager's closed forms against what they replace: `steps_within` against
the binary search over `decode_cost`, `page_growth_within_page` against `page_growth_profile`
and `short_stretch` (its plain-int form, what decode_steps runs) against it, the running
totals behind `breakdown` against a recomputation (check_invariants catches a drift), and the
allocator's decode given the policy's page indices (and the manager's `fresh_page_rows` /
`alloc_decode_rows`, page size 1 included) against its own mask.
The stateful tests in test_paged_policy.py run check_invariants after every operation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.contract.breakdown import MemoryBreakdown, page_growth_profile, page_growth_within_page
from kvcore.contract.capabilities import DecodeStretch
from kvcore.contract.req_to_token_pool import step_column
from kvcore.contract.validation import InvariantError
from kvcore.policies import PolicyConfig, make_policy
from kvcore.sglang.allocator import PagedAllocator
from kvcore.sglang.stretch import (
    short_stretch,
    short_stretch_slots,
    stretch_pages,
)


def _policy(ps: int, pages: int = 1024, rows: int = 8):
    cfg = PolicyConfig(kv_tokens=pages * ps, page_size=ps, max_context_len=512,
                       max_requests=rows)
    return make_policy("paged", cfg)


@settings(max_examples=60, deadline=None)
@given(ps=st.sampled_from([1, 2, 4, 16]), data=st.data())
def test_steps_within_equals_search(ps: int, data) -> None:
    p = _policy(ps)
    lens = data.draw(st.lists(st.integers(1, 100), min_size=0, max_size=6))
    rids = list(range(len(lens)))
    for rid, n in enumerate(lens):
        assert p.admit(rid, np.arange(n) + 1000 * rid, n + 200, 200) is not None
    if rids:
        assert p.extend(rids, lens)
    k = data.draw(st.integers(0, 80))
    slots = data.draw(st.integers(-3, 40 * ps))
    want = DecodeStretch.steps_within(p, rids, k, slots)  # the default: a binary search
    assert p.steps_within(rids, k, slots) == want
    if want < k:  # the next step would not fit: the closed form is the most, not just some
        assert p.decode_cost(rids, want + 1) > slots


def _within_page_case(ps: int, data, max_batch: int):
    """A batch's written and final lengths, a step count within one page, the rows' page ends
    and a breakdown to grow from: the inputs both within-page closed forms take."""
    batch = data.draw(st.integers(0, max_batch))
    w = np.array(data.draw(st.lists(st.integers(0, 80), min_size=batch, max_size=batch)),
                 dtype=np.int64)
    final = w + np.array(data.draw(st.lists(st.integers(0, 40), min_size=batch,
                                            max_size=batch)), dtype=np.int64)
    n = data.draw(st.integers(1, ps))
    have = (w + ps - 1) // ps * ps
    base = MemoryBreakdown.for_pages(10_000, 100, 50, 30, 20, 10_000 - 200)
    return w, final, n, have, base


@settings(max_examples=60, deadline=None)
@given(ps=st.sampled_from([1, 2, 4, 16]), data=st.data())
def test_page_growth_within_page_equals_general(ps: int, data) -> None:
    w, final, n, have, base = _within_page_case(ps, data, 6)
    got, got_new = page_growth_within_page(base, have - w, final, have, ps, n)
    want, want_new = page_growth_profile(base, w, final, have, ps, n)
    assert np.array_equal(got, want)
    assert np.array_equal(got_new, want_new)
    assert got.dtype == want.dtype and got_new.dtype == np.int64


@settings(max_examples=60, deadline=None)
@given(ps=st.sampled_from([1, 2, 4, 16]), data=st.data())
def test_short_stretch_equals_within_page(ps: int, data) -> None:
    """The plain-int short stretch gives the same profile, new slots per step, page count
    and rounding as the array closed form (itself checked against the general profile)."""
    w, final, n, have, base = _within_page_case(ps, data, 8)
    want, want_new = page_growth_within_page(base, have - w, final, have, ps, n)
    got, got_new, order, rounding = short_stretch(base.as_tuple(), w.tolist(),
                                                  final.tolist(), ps, n)
    assert got.dtype == np.int64 and np.array_equal(got, want)
    assert got_new == want_new.tolist()
    assert len(order) == int((have - w < n).sum()) == want_new[-1] // ps
    # the pop order: by the step of the page start (room), then batch index
    assert order == sorted(np.flatnonzero(have - w < n).tolist(), key=lambda i: have[i] - w[i])
    assert rounding == int(want[-1, 3]) - base.internal


@settings(max_examples=60, deadline=None)
@given(ps=st.sampled_from([2, 4, 16]), data=st.data())
def test_short_stretch_slots_equal_general(ps: int, data) -> None:
    """A stretch of at most a page places its slots as the general (any length) form does:
    the last page's next slots, then each new page in stepping's pop order."""
    w, final, n, have, base = _within_page_case(ps, data, 8)
    order = short_stretch(base.as_tuple(), w.tolist(), final.tolist(), ps, n)[2]
    # each row's last page somewhere distinct, its last written slot at w's offset
    last_page = np.arange(len(w), dtype=np.int64) * 3 + 1
    last = last_page * ps + (w - 1) % ps
    pages = 1000 + np.array(data.draw(st.permutations(range(len(order)))), dtype=np.int64)
    steps = step_column(n)
    pos = w + steps
    want = stretch_pages(pos, pages, last_page, ps) * ps + pos % ps
    got = short_stretch_slots(last + 1, have - w, order, pages, steps, ps)
    assert got.shape == want.shape and np.array_equal(got, want)


def test_running_totals_drift_is_caught() -> None:
    p = _policy(4)
    assert p.admit(1, np.arange(10), 14, 4) is not None
    assert p.extend([1], [10])
    assert p.decode([1])
    p.check_invariants()
    assert p.page_table_entries() == 3  # 11 tokens on pages of 4
    p._tot.rounding += 1
    with pytest.raises(InvariantError, match="running totals"):
        p.check_invariants()


@settings(max_examples=40, deadline=None)
@given(ps=st.sampled_from([2, 4, 16]), data=st.data())
def test_alloc_decode_given_indices_equals_its_own_mask(ps: int, data) -> None:
    """The policy passes the indices of the requests taking a fresh page; the allocator
    must hand out exactly what it does when it finds them itself."""
    a, b = PagedAllocator(64, ps), PagedAllocator(64, ps)
    seq = np.array(data.draw(st.lists(st.integers(1, 3 * ps), min_size=1, max_size=8)),
                   dtype=np.int64)
    last = np.arange(len(seq), dtype=np.int64) * ps * 8 + (seq - 2) % ps  # its page offset
    need = np.flatnonzero((seq - 1) % ps == 0)
    got = a.alloc_decode_host(seq, last.copy(), need, len(need))
    want = b.alloc_decode_host(seq, last.copy())
    assert got is not None and want is not None
    assert got.tolist() == want.tolist()
    assert a.free_pages_view().tolist() == b.free_pages_view().tolist()


@settings(max_examples=40, deadline=None)
@given(ps=st.sampled_from([1, 2, 4, 16]), data=st.data())
def test_fresh_page_rows_and_decode_rows_equal_the_mask(ps: int, data) -> None:
    """The manager's decode (which requests start a page, then their slots, the last slots
    read only where a page has room) hands out what `alloc_decode_host` finds by itself."""
    a, b = PagedAllocator(64, ps), PagedAllocator(64, ps)
    written = data.draw(st.lists(st.integers(0, 3 * ps), min_size=1, max_size=8))
    seq = np.array(written, dtype=np.int64) + 1
    last = np.arange(len(seq), dtype=np.int64) * ps * 8 + (seq - 2) % ps  # its page offset
    need = a.fresh_page_rows(written)
    assert need == np.flatnonzero((seq - 1) % ps == 0).tolist()
    reads: list[int] = []

    def last_slots() -> np.ndarray:
        reads.append(1)
        return last.copy()

    got = a.alloc_decode_rows(need, len(written), last_slots)
    want = b.alloc_decode_host(seq, last.copy())
    assert got is not None and want is not None
    assert got.tolist() == want.tolist()
    assert a.free_pages_view().tolist() == b.free_pages_view().tolist()
    assert not reads if len(need) == len(written) else reads == [1]
