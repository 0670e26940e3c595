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
* admission cannot take the queue head before step k (`Admission.horizon`);
* no arrival or session release falls before the end of step k - 1;
* at most `max_steps_per_stretch` steps.

The policy applies the k steps in one batched call and returns the breakdown after each step;
step end times accumulate left to right exactly as SimPy adds successive timeouts and the
clock lands on the last one exactly, so summaries and request rows are bit-for-bit those of
stepping (tests/simulator/test_multistep.py, the differential fuzz).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol

import numpy as np
import simpy

from kvcore.policies.base import KVPolicy, PrefixPeek
from kvcore.policies.capabilities import DecodeStretch, LowerTiers
from kvcore.tiers import WritePolicy
from simulator.admission import Admission
from simulator.config import SimConfig
from simulator.metrics import Recorder
from simulator.request import SimRequest
from simulator.scheduler import QueueOrder
from simulator.transfers import TierTraffic


class EngineState(Protocol):
    """What the fast-forward reads and calls on the engine."""

    env: simpy.Environment
    cfg: SimConfig
    policy: KVPolicy
    admission: Admission
    latency: Any
    rec: Recorder
    running: list[SimRequest]
    prefilling: list[SimRequest]
    waiting: list[SimRequest]
    generated_tokens: int
    event_sink: Callable[..., None] | None
    tier: TierTraffic | None
    tiered: LowerTiers | None
    schedule: QueueOrder
    writes: WritePolicy

    def head_blocked(self) -> bool: ...
    def next_arrival(self) -> float: ...
    def peek_admission(self, sreq: SimRequest) -> PrefixPeek: ...
    def head_reservation(self) -> int: ...
    def maybe_check_invariants(self) -> None: ...
    def progress_made(self) -> None: ...
    def finish(self, sreq: SimRequest) -> None: ...


class FastForward:
    """Plans and runs decode stretches for one engine."""

    def __init__(self, engine: EngineState) -> None:
        self.e = engine
        # the policy's batched decode (None: it has none, the engine steps one at a time)
        self.p = engine.policy if isinstance(engine.policy, DecodeStretch) else None
        self._times: np.ndarray | None = None  # step times of the last plan, reused by run

    # -- planning ---------------------------------------------------------------------------
    def possible(self) -> bool:
        """Only decoding is going on and the queue head cannot be admitted now."""
        e = self.e
        if self.p is None or not e.running or e.prefilling:
            return False
        if not e.waiting:
            return True
        if len(e.running) >= e.cfg.engine.max_running_requests:
            return True
        if e.admission.reserving:  # the placement refused the head until memory comes back
            return e.head_blocked()
        head = e.waiting[0]
        return not e.admission.admissible(head, e.peek_admission(head), 0, e.running,
                                          e.prefilling)

    def length(self) -> int:
        """k, the steps to take at once (< 2: take a normal iteration instead)."""
        e, p = self.e, self.p
        assert p is not None  # possible() said so
        rids = [s.rid for s in e.running]
        k = min(e.cfg.tuning.max_steps_per_stretch,
                min(s.output_len - s.decoded for s in e.running))
        if k < 2:
            return k
        k = max(self._steps_within(rids, k, e.policy.available_tokens()), 1)
        if k >= 2 and e.schedule.by_prefix_hit and len(e.waiting) > 1:
            k = min(k, self._steps_within(rids, k, p.fresh_tokens()) + 1)
        if k >= 2 and e.tier is not None and e.writes.on_evict:
            # an eviction writes back to the host, which an iteration charges and records:
            # the stretch ends before the first step that would evict
            k = min(k, self._steps_within(rids, k, p.fresh_tokens()))
        if k >= 2 and e.waiting and not e.admission.reserving \
                and len(e.running) < e.cfg.engine.max_running_requests:
            head = e.waiting[0]
            k = min(k, e.admission.horizon(head, e.peek_admission(head), e.running, k))
        if k < 2:
            return k
        times = self._step_times(k)
        self._times = times
        due = e.next_arrival()
        if np.isfinite(due):
            hit = np.nonzero(step_ends(e.env.now, times) >= due)[0]
            if len(hit):  # the step in which it falls is the last one
                k = min(k, int(hit[0]) + 1)
        return k

    def _steps_within(self, rids: list[int], k: int, slots: int) -> int:
        """The most decode steps (<= k) of `rids` whose new memory fits in `slots` (the cost
        grows with the steps: a binary search)."""
        assert self.p is not None
        cost = self.p.decode_cost
        if cost(rids, k) <= slots:
            return k
        lo, hi = 0, k - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cost(rids, mid) <= slots:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _step_times(self, k: int) -> np.ndarray:
        """Each step's time. With lower tiers, the first step also carries the write-backs
        not charged yet, as the first stepped iteration would (stepping charges tier traffic
        at every iteration; inside a stretch nothing writes back, so later steps add 0)."""
        e = self.e
        contexts = np.fromiter((s.written + 1 for s in e.running), dtype=np.int64,
                               count=len(e.running))
        fn = getattr(e.latency, "decode_step_times", None)
        if fn is not None:
            times = np.asarray(fn(contexts, e.policy.page_size, k), dtype=float)
        else:
            times = np.array([e.latency.iteration_time((), contexts + j, e.policy.page_size)
                              for j in range(k)])
        if e.tier is not None and len(times):
            assert e.tiered is not None  # a tier's traffic comes from a tiered policy
            state = e.tiered.tier_state()
            t0 = float(times[0])
            stall = e.tier.decode_stall(state, t0, e.policy.page_size)
            if stall:
                times = times.copy()
                times[0] = t0 + stall
        return times

    # -- running ----------------------------------------------------------------------------
    def run(self, k: int) -> Generator[simpy.Event, Any, None]:
        """Apply k decode steps, record them step by step, and advance the clock."""
        e = self.e
        env = e.env
        running = list(e.running)
        rids = [s.rid for s in running]
        planned, self._times = self._times, None
        times = planned[:k] if planned is not None and len(planned) >= k else self._step_times(k)
        if e.tier is not None:  # charge what the first step carries; record the host now
            assert e.tiered is not None
            state = e.tiered.tier_state()
            e.tier.written_since(state)
            e.rec.host = (state.host_used, state.host_locked)
        head = e.head_reservation()
        b0 = e.policy.breakdown(head)
        assert self.p is not None
        profile = self.p.decode_steps(rids, k, head)
        for s in running:
            s.written += k
        e.maybe_check_invariants()
        ends = step_ends(env.now, times)
        starts = np.concatenate([[env.now], ends[:-1]])
        ps = e.policy.page_size
        w0 = np.fromiter((s.written - k for s in running), dtype=np.int64, count=len(running))
        other = e.policy.page_table_entries() - int((-(-(w0 + k) // ps)).sum())
        entries = other + (-(-(w0[None, :] + np.arange(1, k + 1)[:, None]) // ps)).sum(axis=1)
        e.rec.add_profile(starts, ends, profile, b0.frag_index, entries, b0.over_reservation)
        if e.event_sink is not None:
            e.event_sink(float(starts[0]), float(ends[-1]), [], rids, k)
        e.rec.add_iterations(starts, k, len(running))
        e.rec.sample(env.now, profile[0], len(running), len(e.waiting), len(running))
        e.admission.after_steps(k)
        yield from wait_until(env, float(ends[-1]))
        e.progress_made()
        # inter-token gaps as stepping records them: each request's first step from its
        # previous token, then the step times between consecutive ends (the same floats)
        first, last = ends[0], float(ends[-1])
        e.rec.add_gaps(np.array([first - s.last_token_s for s in running]))
        if k > 1:
            e.rec.add_gaps(np.diff(ends), len(running))
        e.generated_tokens += k * len(running)
        for s in running:
            s.last_token_s = last
            s.decoded += k
        for s in running:
            if s.decoded >= s.output_len:
                e.running.remove(s)
                e.finish(s)


def step_ends(now: float, times: np.ndarray) -> np.ndarray:
    """End times of consecutive steps, accumulated left to right from `now` exactly as SimPy
    accumulates one timeout after another (now + t0, then + t1, ...), so that a stretch ends at
    bit-for-bit the same instant as stepping."""
    return np.add.accumulate(np.concatenate([[now], np.asarray(times, dtype=float)]))[1:]


def wait_until(env: simpy.Environment, end: float) -> Generator[simpy.Event, Any, None]:
    """Advance the clock to exactly `end` (a generator to `yield from`).

    SimPy schedules a timeout at now + delay, and for some (now, end) no float delay lands
    exactly on `end` (the sums skip it under round-half-even). Then a first hop lands on the
    last instant below `end` and a second hop of end - that instant, which is exact (the two
    are a few ulps apart: Sterbenz), lands on `end` itself."""
    now = env.now
    d = max(end - now, 0.0)
    while now + d < end:
        d = float(np.nextafter(d, np.inf))
    while d > 0 and now + d > end:
        d = float(np.nextafter(d, -np.inf))
    yield env.timeout(d)
    if env.now < end:
        yield env.timeout(end - env.now)
