"""Scheduling decisions that do not depend on the admission mode: queue order, and the two
victim rules the admission strategies (simulator/admission.py) pick from."""

from __future__ import annotations

from collections.abc import Callable

from simulator.request import SimRequest


def order_waiting(waiting: list[SimRequest], schedule: str,
                  peek: Callable[[SimRequest], int]) -> list[SimRequest]:
    """`fcfs`: as queued. `lpm`: longest cached prefix first (SGLang's cache-aware order),
    ties by queue position; preempted requests stay at the front either way."""
    if schedule == "fcfs" or len(waiting) < 2:
        return waiting
    keyed = []
    for pos, r in enumerate(waiting):
        hit = peek(r) if r.preemptions == 0 else 1 << 60
        keyed.append((-hit, pos, r))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in keyed]


def retract_victim(running: list[SimRequest]) -> SimRequest:
    """SGLang: the request with the fewest decoded tokens, then the longest prompt."""
    return min(running, key=lambda r: (r.decoded, -r.prompt_len, -r.req.request_id))


def preempt_victim(running: list[SimRequest]) -> SimRequest:
    """vLLM: the most recently arrived running request."""
    return max(running, key=lambda r: (r.req.arrival_s, r.req.request_id))
