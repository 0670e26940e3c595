"""What a stretch's steps hand the recorder and the clock, computed from their start and their
growth instead of step by step, each equal to what stepping records: the page-table entries
after each step, the inter-token gaps between consecutive steps, and the clock's landing on
the last step's end.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from itertools import pairwise
from typing import Any

import numpy as np
import simpy

#: inter-token gaps as `Recorder.add_gaps` takes them: (values, each value's count)
Gaps = tuple[np.ndarray, int]


def gaps_between(ends: list[float], n: int) -> Gaps:
    """The inter-token gaps of `n` requests that each made a token at every one of `ends`
    (at least two), after the first: each gap the difference of consecutive ends, as
    stepping records them (the same floats); `add_gaps`' one-value form when every gap is the
    same (the usual stretch), else every gap once with count n."""
    diffs = [b - a for a, b in pairwise(ends)]
    d = diffs[0]
    if all(x == d for x in diffs):
        return np.array([d]), n * len(diffs)
    return np.array(diffs), n


def entries_at_steps_short(entries_now: int, w0: list[int], k: int, page_size: int
                           ) -> list[int]:
    """`entries_at_steps` in Python ints, for a short stretch of a small batch."""
    counts = [0] * page_size
    for w in w0:
        counts[(1 - w) % page_size] += 1
    grown, g = [], 0
    for j in range(1, k + 1):
        g += counts[j % page_size]
        grown.append(g)
    base = entries_now - g
    return [base + x for x in grown]


def entries_at_steps(entries_now: int, w0: np.ndarray, k: int, page_size: int) -> np.ndarray:
    """Page-table entries after each of k steps that took the rows from `w0` to `w0 + k`
    written tokens, `entries_now` (after the k-th) given: a row gains an entry at step j
    when its length passes a page start, (w0 + j - 1) % page_size == 0, so the entries grow
    by the count of rows whose offset (1 - w0) % page_size is j % page_size (no k x batch
    grid)."""
    counts = np.bincount((1 - w0) % page_size, minlength=page_size)
    grown = np.cumsum(counts[np.arange(1, k + 1) % page_size])
    return entries_now - int(grown[-1]) + grown


def chunk_entries(lens0: list[int], rooms: list[int], n: int, page_size: int) -> list[int]:
    """The page-table entries prefill chunks add by the end of each of n iterations, row i
    growing from `lens0[i]` tokens by `rooms[i]` per iteration: one entry per page a row has
    begun (the few rows of a prefill stretch, in Python ints)."""
    out = []
    for j in range(1, n + 1):
        out.append(sum(-(-(w + j * d) // page_size) - -(-w // page_size)
                       for w, d in zip(lens0, rooms, strict=True)))
    return out


def wait_until(env: simpy.Environment, end: float) -> Generator[simpy.Event, Any, None]:
    """Advance the clock to exactly `end` (a generator to `yield from`).

    SimPy schedules a timeout at now + delay, and for some (now, end) no float delay lands
    exactly on `end` (the sums skip it under round-half-even). Then a first hop lands on the
    last instant below `end` and a second hop of end - that instant, which is exact (the two
    are a few ulps apart: Sterbenz), lands on `end` itself."""
    now = env.now
    d = max(end - now, 0.0)
    while now + d < end:
        d = math.nextafter(d, math.inf)  # the same IEEE next double as numpy's, a float
    while d > 0 and now + d > end:
        d = math.nextafter(d, -math.inf)
    yield env.timeout(d)
    if env.now < end:
        yield env.timeout(end - env.now)
