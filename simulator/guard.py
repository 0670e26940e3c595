"""The livelock guard: an engine that keeps preempting and re-admitting without any request
making progress has a bug in admission or preemption. It is stopped with an error that names
the requests and the memory state, instead of looping forever.

Progress is a new token, a finish or a rejection: a re-prefill only restores what a victim
had, so a cycle of admit -> prefill -> preempt makes none.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.request import SimRequest


class LivelockError(RuntimeError):
    """Too many preemptions in a row with no request making progress (a bug)."""


class LivelockGuard:
    """Counts preemptions since the last progress; `limit` in a row raise LivelockError."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stalled = 0
        self._victims: list[SimRequest] = []  # the latest few, for the message

    def progress(self) -> None:
        self.stalled = 0
        self._victims.clear()

    def preempted(self, victim: SimRequest, now: float, state: Callable[[], str]) -> None:
        """Count one preemption; `state()` describes memory and queues for the error."""
        self.stalled += 1
        self._victims = [*self._victims[-7:], victim]
        if self.stalled <= self.limit:
            return
        who = ", ".join(
            f"request {r.rid} (prompt {r.prompt_len}, written {r.written}, decoded "
            f"{r.decoded}, preempted {r.preemptions}x)" for r in self._victims)
        raise LivelockError(f"livelock at t={now:.6f} s: {self.stalled} preemptions with no "
                            f"request making progress; latest victims: {who}; {state()}")
