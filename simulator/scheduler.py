"""Scheduling decisions: queue order, admission budgets, and whom to preempt.

The engine owns time and memory calls; this module only answers questions, so each admission
mode is a few lines that can be read against the engine it imitates:

* `sglang`: budget = available + evictable - sum(remaining max_new_tokens of running requests,
  each clipped at 4096) x new_token_ratio - what this round already admitted (each admitted
  request charges its extend tokens + min(max_new_tokens, 4096), SGLang's clipped estimate).
  The ratio decays per decode step and is reset after a retraction.
* `vllm`: admit while the pages a request needs now, ceil((prompt + 1) / page_size) less its
  cached pages, leave at least a 1 % watermark of all pages free (cache counts as free: vLLM
  evicts it lazily).
* `reserve`: every running request holds prompt + max_new_tokens up front (mini-sglang); a
  contiguous policy's placement is the final word.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.engine import SimRequest

CLIP_MAX_NEW_TOKENS = 4096


def remaining_new_tokens(r: SimRequest) -> int:
    """SGLang's estimate of the tokens a request may still generate: its remaining
    max_new_tokens, clipped at 4096. One expression for the running requests, the queue head
    in the budget check and the head in the fast-forward's admission horizon."""
    return min(max(r.max_new - r.decoded, 0), CLIP_MAX_NEW_TOKENS)


def order_waiting(waiting: list[SimRequest], schedule: str, peek) -> list[SimRequest]:
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


@dataclass
class SGLangRatio:
    """SGLang's new_token_ratio: how much of the running requests' remaining max_new_tokens
    admission must keep free. Starts high, decays per decode step, jumps after a retraction."""

    value: float
    floor: float
    decay: float

    def step(self, n: int = 1) -> None:
        self.value = max(self.floor, self.value - self.decay * n)

    def after_retract(self, decoded: int, running: int, max_new_sum: int) -> None:
        if max_new_sum > 0:
            self.value = min(1.0, (decoded + 20 * running) / max_new_sum)


def retract_victim(running: list[SimRequest]) -> SimRequest:
    """SGLang: the request with the fewest decoded tokens, then the longest prompt."""
    return min(running, key=lambda r: (r.decoded, -r.prompt_len, -r.req.request_id))


def preempt_victim(running: list[SimRequest]) -> SimRequest:
    """vLLM: the most recently arrived running request."""
    return max(running, key=lambda r: (r.req.arrival_s, r.req.request_id))
