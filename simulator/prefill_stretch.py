"""The prefill stretch: a run of chunked-prefill iterations planned and applied at once, for a
reserving policy (contiguous-*), with results identical to stepping them.

Why: a reserving policy holds each request's whole reservation from admission on, so with
`contiguous-max` only a few requests fit at once and small prefill chunks
(`--chunked-prefill-size 64`) are spent one request at a time: the engine steps about six
times the iterations of `paged` (45,000 against 7,600 on the 300-request Mooncake slice of
benchmarks/bench_policies.py), each one a chunk of the prefilling request while the others
decode. Such an iteration's outcome is fixed in advance while:

* the queue head cannot be admitted: the admission loop stops at it before asking the policy
  (a full batch, or the reserving policy refused it and no memory was given back since:
  `AdmissionRound.admission_stops`), or no prefill budget is left for admissions, or nobody
  waits; nothing in the stretch gives memory back, so this holds to its end;
* every prefill under way continues by the same chunk each iteration and none completes
  (its first token, cache insert and join are a stepped iteration's);
* no running request finishes before the last iteration (the decode stretch's rule);
* no arrival or session release falls before the end of the second-to-last iteration;
* at most `max_steps_per_stretch` iterations (1: the stepping reference, no stretch);
* no swap-in or re-prefill is under way, no lower tier (nothing charged per iteration).

Then iteration j's time is the latency model's `iteration_time` of its chunks and decode
contexts (the same call as stepping's, so the same doubles), the ends accumulate left to right
as SimPy adds timeouts, the policy applies the n iterations in one call
(`Reserving.prefill_steps`: the breakdown after each), and the recorder, the gaps and the
finishes get what n stepped iterations would have handed them. The differential fuzz
(tests/simulator/engine_fuzz.py) compares a run with stretches against stepping.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol

import simpy

from kvcore.policies.capabilities import Reserving
from simulator.admission_round import Plan
from simulator.latency import LatencyModel
from simulator.metrics import Recorder
from simulator.request import SimRequest
from simulator.running_batch import RunningBatch
from simulator.stretch import gaps_between, wait_until


class PrefillHost(Protocol):
    """The engine state a prefill stretch reads and the hooks it calls."""

    env: simpy.Environment
    rec: Recorder
    latency: LatencyModel
    running: RunningBatch
    prefilling: list[SimRequest]
    waiting: list[SimRequest]
    generated_tokens: int
    event_sink: Callable[..., None] | None

    def continuing_chunks(self) -> tuple[Plan, int]: ...
    def admission_stops(self, sreq: SimRequest, charged: int) -> bool: ...
    def next_arrival(self) -> float: ...
    def head_reservation(self) -> int: ...
    def maybe_check_invariants(self) -> None: ...
    def decoded_steps(self, k: int) -> None: ...
    def progress_made(self) -> None: ...
    def finish(self, sreq: SimRequest) -> None: ...


class PrefillStretch:
    """Plans and runs prefill stretches for one engine over a reserving policy."""

    def __init__(self, host: PrefillHost, policy: Reserving, page_size: int,
                 max_steps: int) -> None:
        self.e = host
        self.policy = policy
        self.page_size = page_size
        self.max_steps = max_steps
        # the last plan: its chunks (request, tokens per iteration), its iterations' end
        # times, and the clock it was planned at (run applies it only at that instant)
        self._chunks: list[tuple[SimRequest, int]] = []
        self._ends: list[float] = []
        self._from = -1.0
        self.taken = 0  # stretches run (a count for tests and benchmarks)

    def length(self) -> int:
        """n, the iterations to take at once (< 2: take a normal iteration instead)."""
        e = self.e
        if not e.prefilling or self.max_steps < 2:
            return 0
        plan, budget = e.continuing_chunks()
        if not plan or (e.waiting and budget > 0 and not e.admission_stops(e.waiting[0], 0)):
            return 0
        n = self.max_steps
        chunks = []
        for s, target in plan:
            if s.swap_len or s.computed_len > s.written:
                return 0
            room = target - s.written
            n = min(n, (s.prefill_target - s.written - 1) // room)  # none completes
            chunks.append((s, room))
        batch = e.running
        if batch:
            n = min(n, batch.min_remaining_output())
        if n < 2:
            return n
        self._chunks, self._ends, self._from = chunks, self._step_ends(chunks, n), e.env.now
        return len(self._ends)

    def _step_ends(self, chunks: list[tuple[SimRequest, int]], n: int) -> list[float]:
        """The iterations' end times from now, each `iteration_time` of its chunks and decode
        contexts (the running rows' lengths after its decode), up to and including the first
        that reaches the next arrival."""
        e = self.e
        t, due, ps = e.env.now, e.next_arrival(), self.page_size
        batch = e.running
        ctx = batch.written[: batch.n] + 1
        ends = []
        for j in range(n):
            info = [(room, s.written + j * room) for s, room in chunks]
            t += e.latency.iteration_time(info, ctx + j, ps)
            ends.append(t)
            if t >= due:
                break
        return ends

    def run(self, n: int) -> Generator[simpy.Event, Any, None]:
        """Apply n planned iterations, record them as stepping would, advance the clock."""
        e = self.e
        env = e.env
        assert self._from == env.now and 2 <= n <= len(self._ends), "run what length planned"
        chunks, ends = self._chunks, self._ends[:n]
        self._chunks, self._ends, self._from = [], [], -1.0
        self.taken += 1
        batch = e.running
        m = batch.n
        decoders = batch.rids()
        head = e.head_reservation()
        b0 = self.policy.breakdown(head)
        entries0 = self.policy.page_table_entries()
        lens0 = [s.written for s, _ in chunks] + batch.written[:m].tolist()
        incs = [room for _, room in chunks] + [1] * m
        profile = self.policy.prefill_steps([s.rid for s, _ in chunks],
                                            [room for _, room in chunks], decoders, n, head)
        for s, room in chunks:
            s.written += n * room
        batch.wrote(m, n)
        e.maybe_check_invariants()
        now = env.now
        starts = [now, *ends[:-1]]
        rows = profile.tolist()
        size = m + len(chunks)
        e.rec.add_steps(starts, ends, rows, b0.frag_index,
                        entries_per_step(entries0, lens0, incs, n, self.page_size),
                        b0.over_reservation)
        e.rec.add_iterations(starts, n, size)
        waiting = len(e.waiting)
        for t0, row in zip(starts, rows, strict=True):  # stepping samples every iteration
            e.rec.sample(t0, row, size, waiting, m)
        first, last = ends[0], ends[-1]
        if e.event_sink is not None:
            e.event_sink(now, last, [(s.rid, s.written - n * room, s.written)
                                     for s, room in chunks], decoders, n)
        if m:
            e.decoded_steps(n)
        yield from wait_until(env, last)
        if not m:
            return
        assert batch.n == m, "the running batch changed during a prefill stretch"
        e.progress_made()
        e.rec.add_gaps(*batch.stepped(m, n, first, last))
        e.rec.add_gaps(*gaps_between(ends, m))  # each later step's gap, as stepping's
        e.generated_tokens += n * m
        for s in batch.remove_done(m):
            e.finish(s)


def entries_per_step(entries0: int, lens0: list[int], incs: list[int], n: int,
                     page_size: int) -> list[int]:
    """Page-table entries after each of n iterations in which row i grows from `lens0[i]`
    tokens by `incs[i]` per iteration (one entry per page a row has begun), `entries0`
    before the first."""
    out = []
    for j in range(1, n + 1):
        out.append(entries0 + sum(-(-(w + j * d) // page_size) - -(-w // page_size)
                                  for w, d in zip(lens0, incs, strict=True)))
    return out
