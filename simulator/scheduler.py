"""Scheduling decisions that do not depend on the admission mode: queue order (`--schedule`),
what a preempted request does (`--preempt`), and the two victim rules the admission strategies
(simulator/admission.py) pick from. Orders and preemption modes are registered by name; the
engine resolves its two once and asks them what they do, never their names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvcore.contract.registry import Registry
from simulator.request import SimRequest

Peek = Callable[[SimRequest], int]


@dataclass(frozen=True)
class QueueOrder:
    """A queue order: `order(waiting, peek)` returns the queue sorted. `by_prefix_hit`: the
    order reads the prefix cache, so an eviction can reorder the queue (the fast-forward ends
    a stretch before one)."""

    order: Callable[[list[SimRequest], Peek], list[SimRequest]]
    by_prefix_hit: bool = False


@dataclass(frozen=True)
class PreemptMode:
    """What a preempted request does: `swap` copies its computed KV out and back (vLLM's
    preemption_mode="swap"); otherwise it recomputes it (both engines' default)."""

    swap: bool = False


def _fcfs(waiting: list[SimRequest], peek: Peek) -> list[SimRequest]:
    """As queued."""
    return waiting


def _lpm(waiting: list[SimRequest], peek: Peek) -> list[SimRequest]:
    """Longest cached prefix first (SGLang's cache-aware order, schedule_policy.py "lpm"),
    ties by queue position; preempted requests stay at the front."""
    if len(waiting) < 2:
        return waiting
    keyed = []
    for pos, r in enumerate(waiting):
        hit = peek(r) if r.preemptions == 0 else 1 << 60
        keyed.append((-hit, pos, r))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in keyed]


SCHEDULES: Registry[QueueOrder] = Registry("queue order")
SCHEDULES.add("fcfs", QueueOrder(_fcfs))
SCHEDULES.add("lpm", QueueOrder(_lpm, by_prefix_hit=True))
PREEMPTS: Registry[PreemptMode] = Registry("preemption mode")
PREEMPTS.add("recompute", PreemptMode())
PREEMPTS.add("swap", PreemptMode(swap=True))


def retract_victim(running: list[SimRequest]) -> SimRequest:
    """SGLang: the request with the fewest decoded tokens, then the longest prompt."""
    return min(running, key=lambda r: (r.decoded, -r.prompt_len, -r.req.request_id))


def preempt_victim(running: list[SimRequest]) -> SimRequest:
    """vLLM: the most recently arrived running request."""
    return max(running, key=lambda r: (r.req.arrival_s, r.req.request_id))
