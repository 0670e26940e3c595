"""The fast-forward: when the next iterations' outcome is fixed in advance, take n of them at
once, with results identical to n stepped iterations.

A stretch is n iterations in each of which every prefill under way continues by the same
chunk (none, in a decode stretch) and every running request decodes one token. n is the
largest number such that nothing the stepping engine reacts to happens before the end of the
n-th iteration:

* the admission round admits nobody in any of them. A decode stretch (no prefill under way)
  needs the queue head not admissible now and, while one waits with room in the batch, no
  step before the n-th at which admission could take it (`Admission.horizon`) or which gives
  memory back (`DecodeStretch.steps_before_release`: a hybrid's sliding-window and Mamba
  blocks). A prefill stretch needs the admission loop to stop at the head before asking the
  policy (a full batch, or the reserving policy refused it and no memory was given back
  since: `AdmissionRound.admission_stops`), or no prefill budget left for admissions, or
  nobody waiting; nothing in it gives memory back, so this holds to its end;
* no prefill under way completes (its first token, cache insert and join are a stepped
  iteration's), swaps in or re-prefills;
* no running request finishes before the n-th iteration (n <= the smallest remaining output);
* a decode stretch's memory (`decode_cost`, whole pages) is available, so no step fails, and
  no step before the n-th evicts cache the engine reacts to (`EvictLimit`); a prefill
  stretch writes inside its requests' reservations (`Reserving.prefill_steps`);
* no arrival or session release falls before the end of the (n-1)-th iteration (the one in
  which it falls is the last);
* n <= `max_steps_per_stretch` (1: the stepping reference, no stretch).

Each iteration's time is the latency model's (the decode steps' from their contexts, a
prefill iteration's from the same `iteration_time` call stepping makes); the end times
accumulate left to right exactly as SimPy adds successive timeouts and the clock lands on the
last one exactly. The policy applies the n iterations in one batched call and returns the
breakdown after each; the recorder gets every iteration's interval, count, timeline sample
and gaps, and the engine's one hook (`stretch_applied`) what stepping does after each
iteration, n times over. So summaries, request rows and the timeline are bit for bit those of
stepping (tests/simulator/test_multistep.py, test_prefill_stretch.py, the differential fuzz).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NamedTuple, Protocol

import numpy as np
import simpy

from simulator.admission_round import Plan
from simulator.fastforward.rules import StretchRules
from simulator.fastforward.steps import (
    Gaps,
    chunk_entries,
    entries_at_steps,
    entries_at_steps_short,
    gaps_between,
    wait_until,
)
from simulator.metrics import SCALAR_PROFILE, Recorder
from simulator.request import SimRequest
from simulator.running_batch import RunningBatch


class Stretch(NamedTuple):
    """n iterations planned at once, at the instant they start."""

    chunks: list[tuple[SimRequest, int]]  # each prefill under way, tokens per iteration
    ends: np.ndarray  # each iteration's end time (n of them)


class StretchHost(Protocol):
    """The engine state a stretch reads (the queues, the clock, the recorder), the questions
    it asks the admission round, and the one hook it calls once a stretch is applied."""

    env: simpy.Environment
    rec: Recorder
    running: RunningBatch
    prefilling: list[SimRequest]
    waiting: list[SimRequest]
    generated_tokens: int
    event_sink: Callable[..., None] | None

    def head_admissible(self) -> bool: ...
    def admission_horizon(self, k: int) -> int: ...
    def continuing_chunks(self) -> tuple[Plan, int]: ...
    def admission_stops(self, sreq: SimRequest, charged: int) -> bool: ...
    def next_arrival(self) -> float: ...
    def head_reservation(self) -> int: ...
    def stretch_applied(self, n: int, decoded: bool) -> None: ...
    def progress_made(self) -> None: ...
    def finish(self, sreq: SimRequest) -> None: ...


class FastForward:
    """Plans and runs the stretches of one engine."""

    def __init__(self, host: StretchHost, rules: StretchRules | None) -> None:
        self.e = host
        self.rules = rules  # None: the policy has no batched call, the engine steps

    # -- planning ---------------------------------------------------------------------------
    def plan(self) -> Stretch | None:
        """The stretch to take now, or None (take a normal iteration instead)."""
        e, r = self.e, self.rules
        if r is None:
            return None
        batch = e.running
        if e.prefilling:
            chunks = self._chunks()
            if chunks is None:
                return None
        elif r.decode is None or not batch or not self._head_waits():
            return None
        else:
            chunks = []
        n = r.max_steps
        if batch:
            n = min(n, batch.min_remaining_output())
        for s, room in chunks:
            n = min(n, (s.prefill_target - s.written - 1) // room)  # none completes
        if n >= 2 and not chunks:
            n = self._decode_limit(n)
        if n < 2:
            return None
        ends = self._ends(chunks, n)
        return Stretch(chunks, ends) if len(ends) >= 2 else None

    def _head_waits(self) -> bool:
        """Admission takes nobody now: nobody waits, the batch is full, or the head is not
        admissible."""
        e, r = self.e, self.rules
        assert r is not None
        if not e.waiting or len(e.running) >= r.max_running:
            return True
        return not e.head_admissible()

    def _chunks(self) -> list[tuple[SimRequest, int]] | None:
        """Each prefill under way with the tokens it takes per iteration, when the admission
        round admits nobody and no chunk swaps in or re-prefills; else None."""
        e, r = self.e, self.rules
        assert r is not None
        if r.chunked is None or r.max_steps < 2:
            return None
        plan, budget = e.continuing_chunks()
        if not plan or (e.waiting and budget > 0 and not e.admission_stops(e.waiting[0], 0)):
            return None
        chunks = []
        for s, target in plan:
            if s.swap_len or s.computed_len > s.written:
                return None
            chunks.append((s, target - s.written))
        return chunks

    def _decode_limit(self, k: int) -> int:
        """The decode steps (<= k) whose memory is there, before an eviction the engine
        reacts to, and before admission could take the waiting head."""
        e, r = self.e, self.rules
        assert r is not None and r.decode is not None
        policy = r.decode
        rids = e.running.rids()
        k = max(policy.steps_within(rids, k, policy.available_tokens()), 1)
        for limit in r.evict_limits:
            if k >= 2 and len(e.waiting) >= limit.min_waiting:
                k = min(k, policy.steps_within(rids, k, policy.fresh_tokens()) + limit.after)
        if k >= 2 and e.waiting and not r.reserving and len(e.running) < r.max_running:
            # the horizon assumes decoding only takes memory: a step that frees some ends it
            k = min(k, e.admission_horizon(k), policy.steps_before_release(rids, k))
        return k

    def _ends(self, chunks: list[tuple[SimRequest, int]], n: int) -> np.ndarray:
        """The n iterations' end times from now, up to and including the first that reaches
        the next arrival (the stretch's last)."""
        e, r = self.e, self.rules
        assert r is not None
        now, due = e.env.now, e.next_arrival()
        batch = e.running
        contexts = batch.written[: batch.n] + 1  # each running row's after its first decode
        if not chunks:
            return r.step_ends(contexts, n, now, due)
        t, ends = now, []
        for j in range(n):
            info = [(room, s.written + j * room) for s, room in chunks]
            t += r.iteration_time(info, contexts + j, r.page_size)
            ends.append(t)
            if t >= due:
                break
        return np.array(ends)

    # -- running ----------------------------------------------------------------------------
    def run(self, stretch: Stretch) -> Generator[simpy.Event, Any, None]:
        """Apply the planned iterations, record them as stepping would, advance the clock."""
        e, r = self.e, self.rules
        assert r is not None
        env, batch = e.env, e.running
        chunks, ends = stretch.chunks, stretch.ends
        n, m = len(ends), batch.n
        rids = batch.rids()
        if r.charge_tiers is not None:
            e.rec.host = r.charge_tiers()
        head = e.head_reservation()
        policy = r.policy
        b0 = policy.breakdown(head)
        short = n <= SCALAR_PROFILE
        w0 = batch.written[:m].tolist() if short else batch.written[:m].copy()
        if chunks:
            assert r.chunked is not None
            lens0, rooms = [s.written for s, _ in chunks], [room for _, room in chunks]
            profile = r.chunked.prefill_steps([s.rid for s, _ in chunks], rooms, rids, n, head)
            for s, room in chunks:
                s.written += n * room
        else:
            assert r.decode is not None
            profile = r.decode.decode_steps(rids, n, head)
        batch.wrote(m, n)
        # the entries after each step: the rows' growth, counted back from the entries now
        entries_now = policy.page_table_entries()
        grown = chunk_entries(lens0, rooms, n, r.page_size) if chunks else None
        if grown is not None:
            entries_now -= grown[-1]
        now = env.now
        if short:
            ends_v: Any = ends.tolist()
            starts: Any = [now, *ends_v[:-1]]
            rows: Any = profile.tolist()
            entries: Any = entries_at_steps_short(entries_now, w0, n, r.page_size)
            if grown is not None:
                entries = [a + b for a, b in zip(entries, grown, strict=True)]
            add = e.rec.add_steps
        else:
            ends_v, rows = ends, profile
            starts = np.concatenate(([now], ends[:-1]))
            entries = entries_at_steps(entries_now, w0, n, r.page_size)
            if grown is not None:
                entries = entries + np.array(grown, dtype=np.int64)
            add = e.rec.add_profile
        add(starts, ends_v, rows, b0.frag_index, entries, b0.over_reservation)
        size = m + len(chunks)
        e.rec.add_iterations(starts, n, size)
        e.rec.sample_steps(starts, rows, size, len(e.waiting), m)
        first, last = float(ends_v[0]), float(ends_v[-1])
        if e.event_sink is not None:
            e.event_sink(now, last, [(s.rid, s.written - n * room, s.written)
                                     for s, room in chunks], rids, n)
        e.stretch_applied(n, m > 0)
        yield from wait_until(env, last)
        if not m:
            return
        assert batch.n == m, "the running batch changed during a stretch"
        e.progress_made()
        # inter-token gaps as stepping records them: each request's first step from its
        # previous token, then the step times between consecutive ends (the same floats)
        e.rec.add_gaps(*batch.stepped(m, n, first, last))
        e.rec.add_gaps(*_step_gaps(ends_v, m))
        e.generated_tokens += n * m
        for s in batch.remove_done(m):
            e.finish(s)


def _step_gaps(ends: list[float] | np.ndarray, m: int) -> Gaps:
    """The gaps between consecutive ends, each made by `m` requests: from Python floats for
    a short stretch, as an array difference (np.diff, without its wrapper) for a long one."""
    if isinstance(ends, list):
        return gaps_between(ends, m)
    return ends[1:] - ends[:-1], m
