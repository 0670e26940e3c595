"""Where the pool's slots are, and the fragmentation measured from that: one home for both.

Every policy reports a `MemoryBreakdown`, the engine integrates it over time, and the summary
turns the integrals into percentages. The definitions live here so that a policy, the engine
and a report cannot disagree on what "internal" or "external" means; the placements and the
policies compute the parts from their own structures, and `check_invariants` compares them
with these definitions.

All quantities are KV *slots* (one token of KV in every layer). The equations, for one instant:

    capacity   = token_states + cached + reserved + internal + external + free
    internal   = over_reservation + rounding
    free_total = external + free
    external(need) = sum of |h| over free holes h with |h| < need
    frag_index = 1 - largest_free_hole / free_total        (0 when free_total = 0)

and, for one request with final length L, `written` w and its allocation ending at slot `end`
(its unwritten tail is [w, end)):

    reserved = max(min(end, L) - w, 0)        (it will be written)
    rounding = max(end - max(L, w), 0)        (it never will)

Over a window of length `span`, a part's mean share is `integral / span / capacity * 100`
percent (NaN for an empty window): `mean_share_pct`. Nothing here knows about time beyond
that division.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np

from kvcore.contract.validation import InvariantError

#: order of the breakdown parts in profiles, timelines and reports
PARTS = ("token_states", "cached", "reserved", "internal", "external", "free")


def fragmentation_index(largest_free_hole: int, free_total: int) -> float:
    """1 - largest free hole / all free memory: 0 when the free memory is one hole (or there
    is none), approaching 1 when it is cut into many small holes."""
    return 0.0 if free_total == 0 else 1.0 - largest_free_hole / free_total


def external_fragmentation(hole_sizes: Iterable[int], need: int) -> int:
    """Free slots in holes smaller than `need`: memory that is free but cannot serve an
    allocation of `need` slots (0 for a need of 0: nobody is waiting)."""
    if need <= 0:
        return 0
    return sum(size for size in hole_sizes if size < need)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Where every slot of the pool is at one instant; the six parts add up to `capacity`."""

    capacity: int
    token_states: int  # KV written for live requests (shared slots counted once)
    cached: int  # held only by the prefix cache: evictable, reusable by a future match
    reserved: int  # allocated, not yet written, will be written before its request ends
    over_reservation: int  # reserved beyond L by the policy (contiguous max / pow2)
    rounding: int  # allocator granularity: a last page's unused tail, a buddy block's slack
    external: int  # free slots in holes too small for the waiting head's reservation
    free: int  # the rest of the free memory
    largest_free_hole: int  # contiguous free slots in the largest hole (all free for paged)
    failed_allocs: int  # allocations refused while the total free memory would have sufficed

    @classmethod
    def for_pages(cls, capacity: int, token_states: int, cached: int, reserved: int,
                  rounding: int, free: int) -> MemoryBreakdown:
        """A paged pool's breakdown: no over-reservation, no external fragmentation (any
        free page serves), so the largest free hole is all free memory."""
        return cls(capacity, token_states, cached, reserved, 0, rounding, 0, free, free, 0)

    @property
    def internal(self) -> int:
        return self.over_reservation + self.rounding

    @property
    def free_total(self) -> int:
        return self.external + self.free

    @property
    def frag_index(self) -> float:
        return fragmentation_index(self.largest_free_hole, self.free_total)

    def parts(self) -> dict[str, int]:
        """The six parts, in PARTS order (the order reports stack them)."""
        return dict(zip(PARTS, self.as_tuple(), strict=True))

    def as_tuple(self) -> tuple[int, int, int, int, int, int]:
        return (self.token_states, self.cached, self.reserved, self.internal, self.external,
                self.free)

    def as_array(self) -> np.ndarray:
        """The six parts as an int64 array in PARTS order (a profile row)."""
        return np.array(self.as_tuple(), dtype=np.int64)

    def check_invariants(self) -> None:
        """No part is negative and the six parts sum to the capacity."""
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise InvariantError(f"breakdown part {f.name} is negative: {self}")
        total = sum(self.as_tuple())
        if total != self.capacity:
            raise InvariantError(f"breakdown sums to {total}, capacity is {self.capacity}: {self}")
        if self.largest_free_hole > self.free_total:
            raise InvariantError(f"largest free hole exceeds the free memory: {self}")



def tail_split(end: np.ndarray, final: np.ndarray,
               written: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split each request's allocated-but-unwritten tail [written, end) into reserved (it will
    be written: up to the final length) and rounding (it never will). Elementwise."""
    reserved = np.maximum(np.minimum(end, final) - written, 0)
    rounding = np.maximum(end - np.maximum(final, written), 0)
    return reserved, rounding


def pages_at_steps(pos: np.ndarray, new_pages: np.ndarray, last_page: np.ndarray,
                   page_size: int) -> np.ndarray:
    """The page of every (step, request) position of a decode stretch: a new page starts at
    every position that is a multiple of the page size, taking `new_pages` in row-major
    order (step-major, then batch order: the order stepping pops them); before its first new
    page a request writes into its current `last_page`."""
    starts = pos % page_size == 0
    page_at = np.zeros(pos.shape, dtype=np.int64)
    page_at[starts] = new_pages
    step_idx = np.where(starts, np.arange(len(pos))[:, None], -1)
    ffill = np.maximum.accumulate(step_idx, axis=0)
    cols = np.arange(pos.shape[1])[None, :]
    return np.where(ffill >= 0, page_at[np.maximum(ffill, 0), cols], last_page)


def page_growth_profile(
    base: MemoryBreakdown, written: np.ndarray, final: np.ndarray, alloc_end: np.ndarray,
    page_size: int, n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The breakdown (PARTS columns) after each of n decode steps of requests that grow page
    by page, taking new pages from free memory; also the new slots taken through each step.
    Policies that take pages from elsewhere (cache eviction) adjust the two columns after.

    A request never writes past its final length, so its unwritten tail (end - written) is
    reserved up to the final length and rounding beyond it: only rounding needs a max."""
    steps = np.arange(1, n + 1, dtype=np.int64)
    wj = written[None, :] + steps[:, None]
    aj = np.maximum(alloc_end[None, :], (wj + (page_size - 1)) // page_size * page_size)
    rounding = np.maximum(aj - final, 0).sum(axis=1) - np.maximum(alloc_end - final, 0).sum()
    new_slots = aj.sum(axis=1) - alloc_end.sum()
    out = np.empty((n, len(PARTS)), dtype=np.int64)
    out[:] = base.as_array()
    token_growth = steps * len(written)
    out[:, 0] += token_growth
    out[:, 2] += new_slots - token_growth - rounding
    out[:, 3] += rounding
    out[:, 5] -= new_slots
    return out, new_slots


def page_growth_within_page(
    base: MemoryBreakdown, room: np.ndarray, final: np.ndarray, alloc_end: np.ndarray,
    page_size: int, n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """`page_growth_profile` for a stretch of at most one page (1 <= n <= page_size) of
    requests whose allocation ends on a page boundary (`alloc_end`) with `room` =
    alloc_end - written in [0, page_size): each takes at most one new page, at step room + 1,
    so the per-step sums are counts over the batch by room (two bincounts) instead of
    (steps x batch) arrays. A new page moves a request's rounding from max(alloc_end - final,
    0) to max(alloc_end + page_size - final, 0)."""
    ps = page_size
    new_slots = np.bincount(room, minlength=ps)[:n].cumsum() * ps
    gain = np.minimum(np.maximum(alloc_end - final + ps, 0), ps)  # the two maxes' difference
    # weights are small ints (at most page_size each): float64 sums of them are exact
    rounding = np.bincount(room, weights=gain, minlength=ps)[:n].cumsum().astype(np.int64)
    token_growth = np.arange(1, n + 1, dtype=np.int64) * len(room)
    # base + token_growth, new_slots, rounding spread over the PARTS columns: one product
    # np.array of the tuple, not np.stack: one call, where np.stack adds its own Python layers
    growth = np.array((token_growth, new_slots, rounding)).T @ _GROWTH
    return base.as_array() + growth, new_slots


#: how (token growth, new slots, rounding) move the PARTS columns: tokens turn reserved slots
#: into token states, new slots leave free memory for reserved, rounding is part of them
_GROWTH = np.array([[1, 0, -1, 0, 0, 0],
                    [0, 0, 1, 0, 0, -1],
                    [0, 0, -1, 1, 0, 0]], dtype=np.int64)


def mean_share_pct(integral: float | np.ndarray, span: float,
                   capacity: int) -> float | np.ndarray:
    """Time-integrated slots (slot-seconds) over a window of length `span` as a mean share of
    the capacity, in percent; NaN when the window is empty. Works elementwise on arrays."""
    if span <= 0:
        return np.full(np.shape(integral), np.nan) if np.ndim(integral) else float("nan")
    return integral / span / capacity * 100.0


def mean_frag_index(frag_index_seconds: float, span: float) -> float:
    """The time-weighted mean fragmentation index over a window (NaN when it is empty)."""
    return frag_index_seconds / span if span > 0 else float("nan")
