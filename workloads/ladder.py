"""The QPS ladder: arrivals in stages of (rate x duration), as the llm-d capacity reports load
their clusters ("Poisson ladder 3-60 QPS after a 15 QPS warm-up"), with each request's stage
kept so results can be cut per stage.

The rules are inference-perf's load generator, which the llm-d benchmarks drive
(kubernetes-sigs/inference-perf at commit aa3fd7f, 2025-09-17, the commit llm-d-benchmark's
build/Dockerfile pinned in September 2025; the files below are unchanged in tag v0.2.0):

* a stage of rate r and duration d sends exactly int(r x d) requests
  (inference_perf/loadgen/load_generator.py `run_stage`);
* `constant` stages (`ConstantLoadTimer`, loadgen/load_timer.py): that many exponential gaps
  of mean 1/r, scaled so they add up to d: the last request leaves exactly d after the stage's
  start, the first one gap after it;
* `poisson` stages (`PoissonLoadTimer`): second by second, a Poisson(r) count of requests
  spread over that second as a `constant` stage of the count over 1 s (a second with no
  request is skipped), until the stage's int(r x d) requests are out; the stage so lasts a
  whole number of seconds, close to d;
* the multi-process load generator (the default, `num_workers` = the CPU count) starts a stage
  only when every request of the one before has finished, then waits `load.interval` (1 s by
  default) and starts the stage's clock 1 s later (`start_time = perf_counter() + 1`).

A workload cannot know when a stage drains (the simulation decides), so here stage k+1's clock
starts `gap_s` after stage k's last arrival; the default gap is the 1 s interval + the 1 s
lead. `LadderSchedule` keeps each stage's start and request range; with `drain` (the default,
inference-perf's rule) the simulation holds each later stage until every request sent before
it has finished and then moves the stage to (that time + gap), keeping its arrivals' offsets
(simulator/stage_gate.py). Without `drain` the stages run at their generated times.
All randomness comes from the caller's numpy Generator (inference-perf's timers are unseeded).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from workloads.errors import WorkloadError

LADDER_TYPES = ("poisson", "constant")  # inference-perf's load.type values
DEFAULT_GAP_S = 2.0  # inference-perf: load.interval (1 s) + the stage's 1 s lead
_STAGE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*[xX]\s*([0-9]+)\s*$")


@dataclass(frozen=True)
class Stage:
    """One rung: `rate` requests/s for `duration_s` whole seconds (inference-perf's LoadStage
    takes an integer duration)."""

    rate: float
    duration_s: int

    @property
    def num_requests(self) -> int:
        """inference-perf's count: int(rate x duration), truncated."""
        return int(self.rate * self.duration_s)


def parse_ladder(text: str, where: str = "--ladder") -> tuple[Stage, ...]:
    """'15x50,3x20,10x20': stages of RATExSECONDS, comma separated. One-line WorkloadError
    naming the bad stage."""
    if not isinstance(text, str) or not text.strip():
        raise WorkloadError(f"{where}: empty ladder (give stages as RATExSECONDS, e.g. "
                            "'15x50,3x20')")
    stages = []
    for i, part in enumerate(text.split(",")):
        m = _STAGE.match(part)
        if m is None:
            raise WorkloadError(f"{where}: stage {i + 1} {part.strip()!r} is not RATExSECONDS "
                                "(e.g. 3x20: 3 requests/s for 20 s)")
        rate, dur = float(m.group(1)), int(m.group(2))
        if not (math.isfinite(rate) and rate > 0):
            raise WorkloadError(f"{where}: stage {i + 1} {part.strip()!r}: the rate must be > 0")
        if dur < 1:
            raise WorkloadError(f"{where}: stage {i + 1} {part.strip()!r}: the duration must be "
                                ">= 1 s")
        if int(rate * dur) < 1:
            raise WorkloadError(f"{where}: stage {i + 1} {part.strip()!r} sends no request "
                                "(int(rate x seconds) = 0)")
        stages.append(Stage(rate, dur))
    return tuple(stages)


def format_ladder(stages: tuple[Stage, ...]) -> str:
    """The inverse of `parse_ladder` (rates printed as given: 3, 2.5)."""
    return ",".join(f"{s.rate:g}x{s.duration_s}" for s in stages)


def constant_offsets(count: int, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """inference-perf's ConstantLoadTimer: `count` exponential gaps scaled to add up to
    `duration_s`; the times after the stage's start (the last is `duration_s`). The gaps'
    mean does not matter once scaled, so they are drawn with mean 1."""
    if count <= 0:
        return np.zeros(0)
    gaps = rng.exponential(1.0, count)
    times = np.cumsum(gaps * (duration_s / gaps.sum()))
    times[-1] = duration_s  # the scaled sum is the duration up to rounding
    return times


def poisson_offsets(rate: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """inference-perf's PoissonLoadTimer for one stage: Poisson(rate) requests in each second,
    spread over it as `constant_offsets`, until `count` requests are out."""
    out: list[np.ndarray] = []
    sent, second = 0, 0
    while sent < count:
        k = int(rng.poisson(rate))
        if k > 0:
            t = second + constant_offsets(k, 1.0, rng)
            out.append(t[: count - sent])
            sent += len(out[-1])
        second += 1
    return np.concatenate(out) if out else np.zeros(0)


@dataclass(frozen=True)
class StageRow:
    """A generated stage: its rung, where its clock starts, its requests' range and span."""

    index: int
    rate: float
    duration_s: int
    start_s: float  # the stage's clock zero on the workload's timeline
    first: int  # index of its first request in arrival order (= its request id)
    count: int
    span_s: float  # its last arrival after start_s

    @property
    def end_s(self) -> float:
        return self.start_s + self.span_s


@dataclass(frozen=True)
class LadderSchedule:
    """What a ladder generated: its stages in order, the load type and the gap between a
    stage's last arrival and the next stage's clock. Request i (arrival order, its request id
    in generated workloads) belongs to the stage whose [first, first + count) holds i."""

    kind: str
    gap_s: float
    stages: tuple[StageRow, ...]
    drain: bool = True  # a stage starts only when every request before it has finished

    @property
    def num_requests(self) -> int:
        return sum(s.count for s in self.stages)

    def stage_of(self, index: np.ndarray | list[int] | int) -> np.ndarray:
        """The stage of each request index (arrival order); -1 past the last stage."""
        firsts = np.array([s.first for s in self.stages], dtype=np.int64)
        idx = np.asarray(index, dtype=np.int64)
        out = np.searchsorted(firsts, idx, side="right") - 1
        return np.where(idx < self.num_requests, out, -1)

    def rates(self) -> np.ndarray:
        return np.array([s.rate for s in self.stages])

    def to_frame(self):
        """One row per stage (index, rate, duration_s, start_s, first, count, span_s)."""
        import pandas as pd

        return pd.DataFrame([vars(s) for s in self.stages])


@dataclass(frozen=True)
class Ladder:
    """A ladder to generate: the stages, inference-perf's load type and the inter-stage gap."""

    stages: tuple[Stage, ...]
    kind: str = "poisson"
    gap_s: float = DEFAULT_GAP_S
    drain: bool = True

    def __post_init__(self) -> None:
        if not self.stages:
            raise WorkloadError("a ladder needs at least one stage")
        if self.kind not in LADDER_TYPES:
            raise WorkloadError(f"ladder type {self.kind!r} is not one of "
                                f"{', '.join(LADDER_TYPES)}")
        if not (math.isfinite(self.gap_s) and self.gap_s >= 0):
            raise WorkloadError(f"ladder gap must be a number of seconds >= 0, got {self.gap_s!r}")

    @classmethod
    def parse(cls, text: str, kind: str = "poisson", gap_s: float = DEFAULT_GAP_S,
              drain: bool = True) -> Ladder:
        return cls(parse_ladder(text), kind, gap_s, drain)

    def generate(self, rng: np.random.Generator, num_requests: int | None = None,
                 duration_s: float | None = None) -> tuple[np.ndarray, LadderSchedule]:
        """Arrival times (sorted, the first stage's clock at 0) and the schedule. Bounded like
        every arrival process: the first `num_requests`, those before `duration_s`, or both;
        stages past the bound are left out and the last one kept is cut short."""
        times: list[np.ndarray] = []
        rows: list[StageRow] = []
        start, first = 0.0, 0
        for i, st in enumerate(self.stages):
            n = st.num_requests
            off = (poisson_offsets(st.rate, n, rng) if self.kind == "poisson"
                   else constant_offsets(n, float(st.duration_s), rng))
            t = start + off
            if duration_s is not None:
                t = t[t < duration_s]
            if num_requests is not None:
                t = t[: max(num_requests - first, 0)]
            if len(t) == 0:
                break
            rows.append(StageRow(i, st.rate, st.duration_s, start, first, len(t),
                                 float(off[len(t) - 1])))
            times.append(t)
            first += len(t)
            if len(t) < n:
                break
            start = start + float(off[-1]) + self.gap_s
        all_t = np.concatenate(times) if times else np.zeros(0)
        return all_t, LadderSchedule(self.kind, self.gap_s, tuple(rows), self.drain)


__all__ = ["DEFAULT_GAP_S", "LADDER_TYPES", "Ladder", "LadderSchedule", "Stage", "StageRow",
           "constant_offsets", "format_ladder", "parse_ladder", "poisson_offsets"]
