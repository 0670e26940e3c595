"""Where requests come from: the open-loop stream (arrival times fixed in advance) and the
closed-loop sessions (turn k+1 released a think time after turn k finished).

The engine needs two answers from here besides the requests themselves: when the next
arrival or session release is due (a multi-step decode stretch must not run past it) and
whether any may still come (an idle engine waits for it, or stops for good).

`max_concurrency` is the benchmark clients' closed loop (`vllm bench serve --max-concurrency`
wraps each request in an asyncio.Semaphore of that size, vllm/benchmarks/serve.py;
sglang.bench_serving does the same): an open-loop request arriving while that many are in
flight waits, first come first served, until one finishes, and is sent then. Its arrival time
becomes the send time, since both clients start a request's TTFT clock when they send it.
Closed-loop sessions already hold one turn in flight each and are not gated.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from simulator.request import SimRequest
from simulator.stage_gate import StageGate
from workloads.columns import arrival_column, arrival_order
from workloads.request import Request, Session, Workload


class Arrivals:
    """SimPy processes that hand each request to `enqueue` when it is due."""

    def __init__(self, env: simpy.Environment, workload: Workload,
                 enqueue: Callable[[Request], SimRequest], max_concurrency: int = 0) -> None:
        self.env = env
        self.max_concurrency = max_concurrency  # 0: no bound
        self._in_flight: set[int] = set()  # gated requests sent and not yet done
        self._gated: deque[Request] = deque()  # arrived, waiting for a slot
        self.workload = workload
        self.enqueue = enqueue
        # by (arrival, id); a columnar workload stays columns: each request is built when it
        # is due and dropped with its finished SimRequest (workloads/columns.py)
        self._open = arrival_order(workload.requests)
        self._times = arrival_column(self._open)
        self._next_open = 0
        self._releases: list[tuple[float, int]] = []  # announced session releases (heap)
        self._sessions_left = len(workload.sessions)
        # a QPS ladder whose stages wait for the one before to drain (simulator/stage_gate.py)
        ladder = workload.meta.get("ladder")
        self.gate = StageGate(env, ladder) if ladder is not None and ladder.drain else None

    def start(self) -> None:
        self.env.process(self._open_loop())
        for s in self.workload.sessions:
            self.env.process(self._session(s))

    def next_due(self) -> float:
        """The next open-loop arrival or announced session release (inf when none)."""
        t = float(self._times[self._next_open]) if self._next_open < len(self._open) \
            else np.inf
        if self.gate is not None and t < np.inf:
            t = self.gate.due(t)
        if self._releases:
            t = min(t, self._releases[0][0])
        return t

    def pending(self) -> bool:
        """Whether any request may still arrive."""
        return self._next_open < len(self._open) or self._sessions_left > 0 or bool(self._gated)

    def done(self, sreq: SimRequest) -> None:
        """A request finished or was rejected: its slot goes to the longest-waiting one."""
        if self.gate is not None:
            self.gate.ended()
        if sreq.rid in self._in_flight:
            self._in_flight.discard(sreq.rid)
            if self._gated:
                self._send(self._gated.popleft())

    def _send(self, req: Request) -> None:
        if self.max_concurrency:
            if len(self._in_flight) >= self.max_concurrency:
                self._gated.append(req)
                return
            self._in_flight.add(req.request_id)
            if req.arrival_s != self.env.now:
                req = dataclasses.replace(req, arrival_s=self.env.now)
        self.enqueue(req)

    def _open_loop(self) -> Generator[simpy.Event, Any, None]:
        gate = self.gate
        while self._next_open < len(self._open):
            if gate is not None and gate.opens_stage(self._next_open):
                yield from gate.open_next()
            req = self._open[self._next_open]
            due = req.arrival_s if gate is None else gate.due(req.arrival_s)
            if due > self.env.now:
                yield self.env.timeout(due - self.env.now)
            self._next_open += 1
            if gate is not None:
                gate.sent()
                if due != req.arrival_s:  # the stage moved: its time is the send time
                    req = dataclasses.replace(req, arrival_s=due)
            self._send(req)

    def _release_at(self, due: float, session_id: int) -> Generator[simpy.Event, Any, None]:
        """Wait until `due`, announcing the release so that decode stretches stop there."""
        if due <= self.env.now:
            return
        entry = (due, session_id)
        heapq.heappush(self._releases, entry)
        yield self.env.timeout(due - self.env.now)
        self._releases.remove(entry)
        heapq.heapify(self._releases)

    def _session(self, s: Session) -> Generator[simpy.Event, Any, None]:
        yield from self._release_at(s.start_s, s.session_id)
        previous = None
        for k, turn in enumerate(s.turns):
            if k > 0:
                yield from self._release_at(self.env.now + turn.think_time_s, s.session_id)
            req = s.request_for_turn(k, self.env.now, previous)
            sreq = self.enqueue(req)
            yield sreq.done
            if sreq.status != "completed":
                break  # a rejected turn ends its conversation
            previous = req
        self._sessions_left -= 1
