"""The QPS ladder's stage gate: a load stage starts only when every request sent before it has
finished, then `gap_s` later, its arrivals keeping their offsets from the stage's start.

This is what inference-perf's multi-process load generator does between stages
(kubernetes-sigs/inference-perf aa3fd7f, inference_perf/loadgen/load_generator.py
`run_stage`: it waits until the stage's finished-request counter reaches the stage's count,
sleeps `load.interval`, and starts the next stage's clock one second later). A workload is
generated before the run, so it holds each stage at its own clock (workloads/ladder.py
`LadderSchedule`); the gate moves each later stage to when the simulation drained the one
before. A rejected request counts as finished, as a failed one does for the harness.

The open-loop arrivals ask the gate two things: whether the next request opens a stage that
must wait (then no arrival is due until the drain), and by how much the stage's times move.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from workloads.ladder import LadderSchedule


class StageGate:
    """Holds each stage after the first until the requests sent before it have all ended."""

    def __init__(self, env: simpy.Environment, schedule: LadderSchedule) -> None:
        self.env = env
        self.gap_s = schedule.gap_s
        # arrival-order index of each later stage's first request, and its generated start
        self._firsts = [s.first for s in schedule.stages[1:]]
        self._starts = [s.start_s for s in schedule.stages[1:]]
        self._next = 0  # the next stage to open
        self.shift = 0.0  # seconds added to every generated time of the current stage
        self._sent = 0
        self._ended = 0
        self._drained: simpy.Event | None = None

    def opens_stage(self, index: int) -> bool:
        """Whether open-loop request `index` (arrival order) is the first of a held stage."""
        return self._next < len(self._firsts) and index == self._firsts[self._next]

    @property
    def holding(self) -> bool:
        """A stage waits for the drain: nothing arrives before it."""
        return self._drained is not None

    def due(self, arrival_s: float) -> float:
        """When a request generated at `arrival_s` of the current stage is sent."""
        return np.inf if self.holding else arrival_s + self.shift

    def sent(self) -> None:
        self._sent += 1

    def ended(self) -> None:
        """A request finished or was rejected; the last one out opens the held stage."""
        self._ended += 1
        if self._drained is not None and self._ended == self._sent:
            self._drained.succeed()

    def open_next(self) -> Generator[simpy.Event, Any, None]:
        """Wait until every request sent so far has ended, then move the next stage to
        (now + gap), its first request's offset kept."""
        if self._ended < self._sent:
            self._drained = self.env.event()
            yield self._drained
            self._drained = None
        self.shift = self.env.now + self.gap_s - self._starts[self._next]
        self._next += 1


__all__ = ["StageGate"]
