"""The multi-step decode fast-forward: when an iteration would only decode, advance k steps
in one go, with results identical to k single steps.

k is the largest number such that nothing the stepping engine reacts to happens before the end
of step k:

* no running request finishes before step k (k <= the smallest remaining output);
* the memory the k steps take (`decode_cost`, whole pages) is available: no step fails;
* under LPM with two or more waiting, no step before the k-th evicts cache (an eviction changes
  the prefix hits the queue is sorted by, and stepping sorts again before the next step);
* with lower KV tiers under write_back, no step evicts (an eviction writes back to the host,
  which each stepped iteration charges and records); the write-backs not charged yet when
  the stretch starts lengthen its first step, as they would the first stepped iteration;
* admission cannot take the queue head before step k (`Admission.horizon`), and while one
  waits no step before the k-th gives memory back (`DecodeStretch.steps_before_release`: a
  hybrid's sliding-window and Mamba blocks);
* no arrival or session release falls before the end of step k - 1;
* at most `max_steps_per_stretch` steps.

The policy applies the k steps in one batched call and returns the breakdown after each step;
step end times accumulate left to right exactly as SimPy adds successive timeouts and the
clock lands on the last one exactly, so summaries and request rows are bit-for-bit those of
stepping (tests/simulator/test_multistep.py, the differential fuzz).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol

import numpy as np
import simpy

from kvcore.breakdown import MemoryBreakdown
from kvcore.policies.capabilities import DecodeStretch
from simulator.latency import step_ends
from simulator.metrics import SCALAR_PROFILE, Recorder
from simulator.request import SimRequest
from simulator.running_batch import RunningBatch

#: (contexts after the first step, k) -> each of the k steps' time in seconds
StepTimes = Callable[[np.ndarray, int], np.ndarray]
#: (contexts after the first step, k, now, due) -> the steps' end times from `now`, up to and
#: including the first that reaches `due` (`step_ends` of the StepTimes, cut there)
StepEnds = Callable[[np.ndarray, int, float, float], np.ndarray]
#: inter-token gaps as `Recorder.add_gaps` takes them: (values, each value's count)
Gaps = tuple[np.ndarray, int]


@dataclass(frozen=True)
class EvictLimit:
    """A stretch ends `after` steps past its first step that evicts cache, when at least
    `min_waiting` requests wait: the engine would react to that eviction (a queue sorted by
    prefix hits sorts again; a write-back to a lower tier is charged and recorded)."""

    min_waiting: int
    after: int


@dataclass(frozen=True)
class StretchRules:
    """Everything fixed that plans and prices a stretch, built once when the engine starts
    (simulator/stretch_rules.py): the planner reads no engine configuration."""

    policy: DecodeStretch  # the batched decode (and its cost, its fresh memory)
    page_size: int
    max_steps: int  # --max-steps-per-stretch
    max_running: int  # the batch limit (a full batch admits nobody)
    reserving: bool  # admission reserves up front: its placement refused the head or not
    evict_limits: tuple[EvictLimit, ...]  # evictions the engine reacts to
    step_times: StepTimes  # latency model and lower-tier stalls
    step_ends: StepEnds  # the same steps' end times, priced only up to the next arrival


class StretchHost(Protocol):
    """The engine state a stretch reads (the queues, the clock, the recorder) and the hooks it
    calls; nothing about the policy, the admission mode or the tiers."""

    env: simpy.Environment
    rec: Recorder
    running: RunningBatch
    prefilling: list[SimRequest]
    waiting: list[SimRequest]
    generated_tokens: int
    event_sink: Callable[..., None] | None

    def head_admissible(self) -> bool: ...
    def admission_horizon(self, k: int) -> int: ...
    def next_arrival(self) -> float: ...
    def head_reservation(self) -> int: ...
    def stretch_started(self) -> None: ...
    def steps_taken(self, k: int) -> None: ...
    def progress_made(self) -> None: ...
    def finish(self, sreq: SimRequest) -> None: ...


class FastForward:
    """Plans and runs decode stretches for one engine."""

    def __init__(self, host: StretchHost, rules: StretchRules | None) -> None:
        self.e = host
        self.rules = rules  # None: the policy has no batched decode, the engine steps
        # the last plan's step end times and the clock it started from, reused by run
        self._ends: np.ndarray | None = None
        self._ends_from = 0.0

    # -- planning ---------------------------------------------------------------------------
    def possible(self) -> bool:
        """Only decoding is going on and the queue head cannot be admitted now."""
        e, r = self.e, self.rules
        if r is None or not e.running or e.prefilling:
            return False
        if not e.waiting or len(e.running) >= r.max_running:
            return True
        return not e.head_admissible()

    def length(self) -> int:
        """k, the steps to take at once (< 2: take a normal iteration instead)."""
        e, r = self.e, self.rules
        assert r is not None  # possible() said so
        k = min(r.max_steps, e.running.min_remaining_output())
        if k < 2:
            return k
        rids = e.running.rids()
        k = max(self._steps_within(rids, k, r.policy.available_tokens()), 1)
        for limit in r.evict_limits:
            if k >= 2 and len(e.waiting) >= limit.min_waiting:
                k = min(k, self._steps_within(rids, k, r.policy.fresh_tokens()) + limit.after)
        if k >= 2 and e.waiting and not r.reserving and len(e.running) < r.max_running:
            # the horizon assumes decoding only takes memory: a step that frees some ends it
            k = min(k, e.admission_horizon(k), r.policy.steps_before_release(rids, k))
        if k < 2:
            return k
        # the step in which the next arrival falls is the last one (the ends stop there)
        batch = e.running
        ends = r.step_ends(batch.written[: batch.n] + 1, k, e.env.now, e.next_arrival())
        self._ends, self._ends_from = ends, e.env.now
        return min(k, len(ends))

    def _steps_within(self, rids: list[int], k: int, slots: int) -> int:
        """The most decode steps (<= k) of `rids` whose new memory fits in `slots`: the
        policy's `steps_within` (a closed form where it has one, else a binary search)."""
        assert self.rules is not None
        return self.rules.policy.steps_within(rids, k, slots)

    def _step_times(self, k: int) -> np.ndarray:
        """Each step's time (the rules' function of the contexts after the first step)."""
        assert self.rules is not None
        batch = self.e.running
        return self.rules.step_times(batch.written[: batch.n] + 1, k)

    # -- running ----------------------------------------------------------------------------
    def run(self, k: int) -> Generator[simpy.Event, Any, None]:
        """Apply k decode steps, record them step by step, and advance the clock."""
        e, r = self.e, self.rules
        assert r is not None
        env = e.env
        batch = e.running
        n = len(batch)
        rids = batch.rids()
        planned, self._ends = self._ends, None
        if planned is not None and len(planned) >= k and self._ends_from == env.now:
            ends = planned[:k]  # a prefix of the plan's ends: the same left-to-right sums
        else:
            ends = step_ends(env.now, self._step_times(k))
        e.stretch_started()
        head = e.head_reservation()
        policy = r.policy
        b0 = policy.breakdown(head)
        profile = policy.decode_steps(rids, k, head)
        first, last, step_gaps = self._record(ends, profile, b0, rids, k)
        e.steps_taken(k)
        yield from wait_until(env, last)
        assert len(batch) == n, "the running batch changed during a stretch"
        e.progress_made()
        # inter-token gaps as stepping records them: each request's first step from its
        # previous token, then the step times between consecutive ends (the same floats)
        e.rec.add_gaps(*batch.stepped(n, k, first, last))
        if step_gaps is not None:
            e.rec.add_gaps(*step_gaps)
        e.generated_tokens += k * n
        for s in batch.remove_done(n):
            e.finish(s)

    def _record(self, ends: np.ndarray, profile: np.ndarray, b0: MemoryBreakdown,
                rids: list[int], k: int) -> tuple[float, float, Gaps | None]:
        """Apply the k steps to the batch and record them (breakdown per step, iterations,
        a timeline sample); returns the first and last step ends and the gaps between
        consecutive ends (None for one step). A stretch of at most SCALAR_PROFILE steps
        (most: a stretch of the Azure run is a median 5 steps of 25 requests) is recorded
        from Python lists, with about a third of the numpy calls and the same numbers
        (tests/simulator/test_short_stretch.py); a longer one from the arrays."""
        e, r = self.e, self.rules
        assert r is not None
        batch, now = e.running, e.env.now
        n = batch.n
        short = k <= SCALAR_PROFILE
        w0 = batch.written[:n].tolist() if short else batch.written[:n].copy()
        batch.wrote(n, k)
        entries_now = r.policy.page_table_entries()
        if short:
            ends_v: Any = ends.tolist()
            starts: Any = [now, *ends_v[:-1]]
            rows: Any = profile.tolist()
            entries: Any = entries_at_steps_short(entries_now, w0, k, r.page_size)
            add = e.rec.add_steps
        else:
            ends_v, rows = ends, profile
            starts = np.concatenate(([now], ends[:-1]))
            entries = entries_at_steps(entries_now, w0, k, r.page_size)
            add = e.rec.add_profile
        add(starts, ends_v, rows, b0.frag_index, entries, b0.over_reservation)
        first, last = float(ends_v[0]), float(ends_v[-1])
        if e.event_sink is not None:
            e.event_sink(float(starts[0]), last, [], rids, k)
        e.rec.add_iterations(starts, k, n)
        e.rec.sample(now, rows[0], n, len(e.waiting), n)
        if k == 1:
            return first, last, None
        if not short:
            return first, last, (ends[1:] - ends[:-1], n)  # np.diff, without its wrapper
        return first, last, gaps_between(ends_v, n)


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
