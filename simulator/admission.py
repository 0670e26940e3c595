"""Admission strategies: when a waiting request may start, what it charges against the
budget, whom to preempt when a decode step runs out of memory. One class per engine imitated,
registered by name (`--admission`); the engine holds one and asks it, never the mode's name.

* `sglang` (SGLang's PrefillAdder): budget = available (free + evictable) - sum over running
  requests of min(remaining max_new_tokens, 4096) x new_token_ratio - what this round already
  admitted; a request charges its extend tokens + min(remaining max_new_tokens, 4096). The
  ratio decays per decode step (`decayed_ratios`) and is reset after a retraction; the
  victim is the request with the fewest decoded tokens.
* `vllm` (vLLM v1's scheduler): admit while the pages a request needs now,
  ceil((prompt + 1) / page_size) less its cached pages, leave at least a watermark (1 %) of
  all pages free (cache counts as free: vLLM evicts it lazily); the victim is the most recent
  arrival.
* `reserve` (mini-sglang): every running request holds prompt + max_new_tokens up front.

Two rules hold for every mode:

* The evictable part of the head's own cached prefix is not available memory (nor, on a
  hybrid model, what its other pools need or lack: `PrefixPeek.other_pools`): admitting it
  locks that prefix (SGLang re-checks its budget after locking; vLLM counts such blocks among
  those to allocate). Counting it twice admits what cannot run, then preempts it, forever.
* A reserving policy (contiguous-*) places its own reservation: its placement is the final
  word, so the budget always passes and the engine retries the head only after memory is
  given back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvcore.contract.capabilities import Reserving
from kvcore.contract.policy import KVPolicy, PrefixPeek
from kvcore.contract.registry import Registry
from simulator.request import SimRequest, remaining_new_tokens
from simulator.running_batch import RunningBatch
from simulator.scheduler import preempt_victim, retract_victim


@dataclass(frozen=True)
class AdmissionParams:
    """Constants of the imitated engines that no option exposes (their shipped defaults)."""

    new_token_ratio_init: float = 0.7  # SGLang: share of running outputs admission keeps free
    new_token_ratio_min: float = 0.1
    new_token_ratio_decay: float = 0.001  # per decode step
    vllm_watermark: float = 0.01  # vLLM: share of all pages admission leaves free

    def __post_init__(self) -> None:
        for name in ("new_token_ratio_init", "new_token_ratio_min", "new_token_ratio_decay",
                     "vllm_watermark"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"AdmissionParams.{name} must be in [0, 1], got "
                                 f"{getattr(self, name)!r}")


class Admission(ABC):
    """One engine's admission and preemption rules over `policy`.

    `running` / `prefilling` are the engine's lists, read, never changed."""

    name = ""

    def __init__(self, policy: KVPolicy, params: AdmissionParams) -> None:
        self.policy = policy
        self.params = params
        # a reserving policy (contiguous-*) places its own reservation: its placement decides
        self.reserving = isinstance(policy, Reserving)

    # -- requests ---------------------------------------------------------------------------
    def context_limit(self, max_context_len: int) -> int:
        """The length a request may reach: its output (and max_new_tokens) are cut to it."""
        return max_context_len

    def need_alone(self, sreq: SimRequest) -> int:
        """Slots this mode must see free to admit `sreq` into an empty engine (beyond its
        final length and the policy's reservation): whether it can ever run."""
        return 0

    # -- admission ----------------------------------------------------------------------------
    def admissible(self, sreq: SimRequest, peek: PrefixPeek, charged: int,
                   running: Sequence[SimRequest], prefilling: Sequence[SimRequest]) -> bool:
        """Whether the budget lets `sreq` in now, `charged` slots already given to this
        round's admissions."""
        if self.reserving:
            return True
        available = self.policy.available_tokens() - peek.evictable - peek.other_pools
        return self._fits(sreq, peek.hit, available, charged, running, prefilling)

    @abstractmethod
    def _fits(self, sreq: SimRequest, cached: int, available: int, charged: int,
              running: Sequence[SimRequest], prefilling: Sequence[SimRequest]) -> bool:
        """The mode's budget rule, with the head's own evictable prefix already left out of
        `available`."""

    @abstractmethod
    def charge(self, sreq: SimRequest, cached: int) -> int:
        """What admitting `sreq` (with `cached` tokens found) takes from this round's budget."""

    def horizon(self, head: SimRequest, peek: PrefixPeek, running: Sequence[SimRequest],
                k: int) -> int:
        """A lower bound on the decode steps (<= k) of `running` before admission could take
        `head`: the fast-forward may not pass it. Default: never within k steps (free memory
        only shrinks while decoding)."""
        return k

    # -- decode and preemption ----------------------------------------------------------------
    def victim(self, pool: Sequence[SimRequest]) -> SimRequest:
        """Whom to preempt when a decode step runs out of memory."""
        return preempt_victim(list(pool))

    def after_steps(self, n: int) -> None:  # noqa: B027 - optional hook
        """`n` decode steps ran: the state after them is exactly the state after n calls
        with 1 (a stretch calls it once for its n steps, stepping once per step)."""

    def after_retraction(self, running: Sequence[SimRequest]) -> None:  # noqa: B027
        """A decode step ran out of memory and a victim left; `running` are those left."""


class SGLangAdmission(Admission):
    name = "sglang"

    def __init__(self, policy: KVPolicy, params: AdmissionParams) -> None:
        super().__init__(policy, params)
        self.ratio = params.new_token_ratio_init

    def context_limit(self, max_context_len: int) -> int:
        # SGLang caps max_new_tokens by its max_req_len = min(context length, pool size), so a
        # request that fits is not refused for an output budget the pool could never hold
        return min(max_context_len, self.policy.capacity)

    def need_alone(self, sreq: SimRequest) -> int:
        return sreq.prompt_len + 1  # the budget keeps room for one new token

    def _fits(self, sreq, cached, available, charged, running, prefilling) -> bool:
        rem = (running.remaining_new_sum() if isinstance(running, RunningBatch)
               else int(_remaining(running).sum()))
        budget = available - rem * self.ratio - charged
        return sreq.prefill_target - cached + remaining_new_tokens(sreq) <= budget

    def charge(self, sreq: SimRequest, cached: int) -> int:
        return sreq.prefill_target - cached + remaining_new_tokens(sreq)

    def horizon(self, head, peek, running, k) -> int:
        # running requests' remaining outputs shrink by one per step and the ratio decays:
        # the budget at step j is a bound the stepping engine could reach no earlier (with
        # the very ratio stepping holds after j steps)
        j = np.arange(1, k + 1, dtype=np.int64)
        rem = _remaining(running)
        p = self.params
        ratio = np.array(decayed_ratios(self.ratio, k, p.new_token_ratio_decay,
                                        p.new_token_ratio_min))
        left = np.clip(rem[None, :] - j[:, None], 0, None).sum(axis=1)
        avail = self.policy.available_tokens() - peek.evictable - peek.other_pools
        need = head.prefill_target - peek.hit + remaining_new_tokens(head)
        return _first_true(avail - left * ratio >= need, k)

    def victim(self, pool: Sequence[SimRequest]) -> SimRequest:
        return retract_victim(list(pool))

    def after_steps(self, n: int) -> None:
        p = self.params
        if n > 0 and self.ratio != p.new_token_ratio_min:  # at the floor no step moves it
            self.ratio = decayed_ratios(self.ratio, n, p.new_token_ratio_decay,
                                        p.new_token_ratio_min)[-1]

    def after_retraction(self, running: Sequence[SimRequest]) -> None:
        # SGLang: the ratio jumps to what the running requests have actually produced
        max_new_sum = sum(r.max_new for r in running)
        if max_new_sum > 0:
            self.ratio = min(1.0, (sum(r.decoded for r in running) + 20 * len(running))
                             / max_new_sum)


class VLLMAdmission(Admission):
    name = "vllm"

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.policy.page_size)

    def need_alone(self, sreq: SimRequest) -> int:
        return self._pages(sreq.prompt_len + 1) * self.policy.page_size  # prompt + 1 pages

    def _fits(self, sreq, cached, available, charged, running, prefilling) -> bool:
        ps = self.policy.page_size
        need = self._pages(sreq.prefill_target + 1) - cached // ps
        free_pages = available // ps - charged // ps
        # whole pages, as vLLM counts it: a pool under 100 pages keeps no watermark, so a
        # request that fits the empty pool is admitted
        watermark = int(self.params.vllm_watermark * (self.policy.capacity // ps))
        return free_pages - need >= watermark

    def charge(self, sreq: SimRequest, cached: int) -> int:
        return self._pages(sreq.prefill_target + 1) * self.policy.page_size - cached


class ReserveAdmission(Admission):
    name = "reserve"

    def need_alone(self, sreq: SimRequest) -> int:
        return 0 if self.reserving else sreq.prompt_len + sreq.max_new

    def _fits(self, sreq, cached, available, charged, running, prefilling) -> bool:
        held = sum(max(r.prompt_len + r.max_new - r.written, 0)
                   for r in (*running, *prefilling))
        return sreq.prompt_len + sreq.max_new - cached + held + charged <= available

    def charge(self, sreq: SimRequest, cached: int) -> int:
        return sreq.prompt_len + sreq.max_new - cached

    def horizon(self, head, peek, running, k) -> int:
        # every running request's holding shrinks by one slot per step
        j = np.arange(1, k + 1, dtype=np.int64)
        held = np.array([r.prompt_len + r.max_new - r.written for r in running])
        left = np.clip(held[None, :] - j[:, None], 0, None).sum(axis=1)
        avail = self.policy.available_tokens() - peek.evictable - peek.other_pools
        return _first_true(avail - left >= head.prompt_len + head.max_new - peek.hit, k)


def decayed_ratios(ratio: float, n: int, decay: float, floor: float) -> list[float]:
    """SGLang's new_token_ratio after each of the next n decode steps, from `ratio`: each
    decode batch that needs no retraction lowers it by `decay`, never below `floor`
    (python/sglang/srt/managers/scheduler.py `update_running_batch` in v0.4:
    `max(new_token_ratio - new_token_ratio_decay, min_new_token_ratio)`, the constants in
    global_config.py; the same rule in today's main, managers/scheduler_components/
    new_token_ratio_tracker.py `decay_step`). Step j's value is j rounded subtractions, the
    arithmetic stepping does, never ratio - j * decay: that product rounds once and differs
    from the j subtractions in the last bit (from step 61 of the default 0.7 by 0.001), and
    an admission budget compared at that bit would decide differently in a stretch than in
    stepping. At the floor it stays there (floor - decay < floor)."""
    out: list[float] = []
    for _ in range(n):
        ratio = max(ratio - decay, floor)
        out.append(ratio)
        if ratio == floor:
            out.extend([floor] * (n - len(out)))
            break
    return out


def _remaining(running: Sequence[SimRequest]) -> np.ndarray:
    """Each running request's remaining_new_tokens (the engine's batch: from its columns)."""
    if isinstance(running, RunningBatch):
        return running.remaining_new()
    return np.array([remaining_new_tokens(r) for r in running], dtype=np.int64)


def _first_true(ok: np.ndarray, k: int) -> int:
    """1 + the index of the first True (the step at which it holds), else k."""
    hit = np.nonzero(ok)[0]
    return int(hit[0]) + 1 if len(hit) else k


AdmissionFactory = Callable[[KVPolicy, AdmissionParams], Admission]
ADMISSIONS: Registry[AdmissionFactory] = Registry("admission mode")
for _cls in (SGLangAdmission, VLLMAdmission, ReserveAdmission):
    ADMISSIONS.add(_cls.name, _cls)


def make_admission(name: str, policy: KVPolicy, params: AdmissionParams) -> Admission:
    """The admission strategy `name` over `policy`; an unknown name lists the known ones."""
    return ADMISSIONS.get(name)(policy, params)
