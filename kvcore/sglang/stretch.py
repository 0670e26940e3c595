"""The closed forms of a full-attention decode stretch (kvcore/sglang/policy.py
`FullAttentionPolicy`): how many steps fit, the breakdown after each step of a stretch of at
most a page, and where every step's token lands. Plain functions of the row arrays, so each can
be checked against what it replaces (tests/kvcore/test_paged_fast_paths.py).
"""

from __future__ import annotations

import numpy as np

from kvcore.breakdown import pages_at_steps

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
    """`page_growth_within_page` (kvcore/breakdown.py) from plain ints, for a batch of a few
    dozen requests: a Python pass over the requests that take a page costs less than that
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
