"""The closed forms of a full-attention decode stretch (kvcore/sglang/policy.py
`FullAttentionPolicy`): how many steps fit, the breakdown after each step, and where every
step's token lands. A stretch has three forms by its length against the page: at page size 1
every step pops one page per request, a stretch of at most a page takes at most one page per
request (plain-int sums, `short_stretch`), a longer one takes several (the (steps x batch)
arrays of kvcore/contract/breakdown.py). `plan_stretch`, `stretch_slots` and `stretch_profile`
pick the form, so the manager has one decode stretch. Plain functions of the row arrays, so each
form can be checked against what it replaces (tests/kvcore/test_paged_fast_paths.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvcore.contract.breakdown import (
    PARTS,
    MemoryBreakdown,
    page_growth_profile,
    page_growth_within_page,
    pages_at_steps,
)

_INTERNAL = PARTS.index("internal")

#: a short stretch's profile rows, the new slots through each step, the requests taking a
#: page (batch indices, in the order stepping pops their pages) and the rounding it adds
ShortStretch = tuple[np.ndarray, list[int], list[int], int]


def steps_within(written: np.ndarray, page_size: int, k: int, slots: int) -> int:
    """The most decode steps n <= k of requests with `written` tokens whose new pages fit in
    `slots` >= 0. With r_i = ceil_ps(w_i) - w_i the room left on request i's last page,
    n = q * ps + t steps (0 <= t < ps) take q + [t > r_i] new pages from request i, so the
    batch takes B q + #(r_i < t) pages: q is the most whole rounds the pages allow and t the
    longest partial round after, the most t with #(r_i < t) <= left (the pages left over,
    < B): the left-th smallest room (0-based), found by a sort of a few dozen ints."""
    if not len(written):
        return k
    ps = page_size
    q, left = divmod(slots // ps, len(written))
    if ps == 1 or q >= k:
        return min(q * ps, k)
    t = sorted([-w % ps for w in written.tolist()])[left]
    return min(q * ps + t, k)


def short_stretch_slots(last1: np.ndarray, room: np.ndarray, order: list[int],
                        pages: np.ndarray, steps: np.ndarray, page_size: int) -> np.ndarray:
    """The slot of every (step, request) position of a stretch of at most a page, from each
    request's `room` on its last page and `last1` (the slot after its last written one): the
    next slots of that page for steps < room, then its one new page from step room on.
    `order` lists the requests that take a page in the order stepping pops them (by room,
    then batch index: `short_stretch` gives it), one per page of `pages`. `steps` is the
    column 0..n-1. Every slot is last1 + step, shifted from the new page's first step by
    the distance between the last page's end and the new page (zero where none is taken):
    one comparison grid and no `where` (a few numpy calls on a batch of a few dozen)."""
    if not order:
        return last1 + steps
    shift = np.zeros(len(room), dtype=np.int64)
    shift[order] = pages * page_size - (last1 + room)[order]
    return last1 + steps + (steps >= room) * shift


def short_stretch(base: tuple[int, ...], written: list[int], final: list[int],
                  page_size: int, n: int) -> ShortStretch:
    """`page_growth_within_page` (kvcore/contract/breakdown.py) from plain ints, for a batch of a
    few dozen requests: a Python pass over the requests that take a page costs less than that
    function's dozen numpy calls. Request i (room r_i = ceil_ps(w_i) - w_i on its last page)
    takes one new page at step r_i + 1 when r_i < n (1 <= n <= page_size), which moves its
    rounding by min(max(ceil_ps(w_i) - final_i + ps, 0), ps). `base` is the breakdown's
    `as_tuple()`; the profile is the same int64 array. The requests taking a page come
    back in the order stepping pops them: by the step of their page start, then batch order
    (what `short_stretch_slots` places the pages by)."""
    ps = page_size
    pages_at = [0] * n  # requests taking their page at each step (by room), and the
    gain_at = [0] * n  # rounding those pages add
    batch = len(written)
    taking: list[int] = []  # room * batch + index: the pop order as one int each
    for i, (w, f) in enumerate(zip(written, final, strict=True)):
        r = -w % ps
        if r < n:
            pages_at[r] += 1
            taking.append(r * batch + i)
            gain = w + r - f + ps  # clipped to [0, ps] below (no min / max calls)
            gain_at[r] += (0 if gain < 0 else ps if gain > ps else gain)
    taking.sort()
    ts, ca, rs, it, ex, fr = base
    rows: list[tuple[int, int, int, int, int, int]] = []
    taken: list[int] = []
    slots = rounding = 0
    for s in range(n):
        slots += pages_at[s] * ps
        rounding += gain_at[s]
        tokens = (s + 1) * batch
        rows.append((ts + tokens, ca, rs + slots - tokens - rounding, it + rounding, ex,
                     fr - slots))
        taken.append(slots)
    return np.array(rows, dtype=np.int64), taken, [x % batch for x in taking], rounding


def stretch_pages(pos: np.ndarray, pages: np.ndarray, last_page: np.ndarray,
                  page_size: int) -> np.ndarray:
    """The page of every (step, request) position of a stretch longer than a page: each
    request's current `last_page` until its page ends, then its new pages in the order
    stepping pops them (`pages_at_steps`)."""
    if not len(pages):
        return np.broadcast_to(last_page, pos.shape)
    return pages_at_steps(pos, pages, last_page, page_size)


@dataclass(frozen=True)
class StretchPlan:
    """What n decode steps of a batch take, before any page is popped: the breakdown parts
    after each step (free memory only; the manager moves evicted cache over), the new slots
    taken through each step, the new pages in all, the rounding they add, and for a short
    stretch the requests taking a page in pop order (`short_stretch`)."""

    profile: np.ndarray
    taken: np.ndarray | list[int]
    new_pages: int
    rounding: int
    order: list[int] | None


def plan_stretch(base: MemoryBreakdown, written: np.ndarray, written_list: list[int],
                 final: np.ndarray, page_size: int, n: int) -> StretchPlan:
    """The plan of n >= 0 steps of requests with `written` tokens (also as `written_list`)
    and final lengths `final`, from the breakdown `base` before them."""
    ps = page_size
    if 0 < n <= ps:  # at most one new page each (the usual stretch): plain ints
        profile, taken, order, rounding = short_stretch(base.as_tuple(), written_list,
                                                        final.tolist(), ps, n)
        return StretchPlan(profile, taken, len(order), rounding, order)
    have = written + (-written) % ps  # where each request's last page ends
    profile, taken_a = page_growth_profile(base, written, final, have, ps, n)
    if not n:
        return StretchPlan(profile, taken_a, 0, 0, None)
    return StretchPlan(profile, taken_a, int(taken_a[-1]) // ps,
                       int(profile[-1, _INTERNAL]) - base.internal, None)


def stretch_slots(plan: StretchPlan, written: np.ndarray, last_slots: Callable[[], np.ndarray],
                  pages: np.ndarray, steps: np.ndarray, page_size: int) -> np.ndarray:
    """The (steps x batch) slots of the plan's tokens, from the new `pages` in pop order (step
    by step, then batch order) and `last_slots()`, each request's last written slot (read only
    where a last page may still have room: never at page size 1). `steps` is the column
    0..n-1."""
    ps = page_size
    if ps == 1:  # a new page every step, step-major: exactly the pop order
        return pages.reshape(len(steps), len(written))
    if plan.order is not None:
        return short_stretch_slots(last_slots() + 1, (-written) % ps, plan.order, pages,
                                   steps, ps)
    pos = written + steps  # (n, batch) positions
    return stretch_pages(pos, pages, last_slots() // ps, ps) * ps + pos % ps


def stretch_profile(base: MemoryBreakdown, written: np.ndarray, final: np.ndarray,
                    page_size: int, n: int) -> np.ndarray:
    """The breakdown parts after each of n steps (taking free memory only), without the
    plan's slots: a stretch of at most a page by counts over the rooms."""
    ps = page_size
    have = written + (-written) % ps
    if 0 < n <= ps:
        return page_growth_within_page(base, have - written, final, have, ps, n)[0]
    return page_growth_profile(base, written, final, have, ps, n)[0]
