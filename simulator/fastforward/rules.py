"""The fast-forward's rules for one run, fixed when the engine starts: the engine's options and
the policy's capabilities turned into the plain `StretchRules` the planner reads
(simulator/fastforward/planner.py), so that the planner knows nothing of queue orders, write
policies, tiers or latency models.

Features become data here, once:

* a policy with a batched decode (`DecodeStretch`) takes decode stretches; a reserving policy
  (`Reserving`) without a lower tier also takes prefill stretches (its chunked prefills while
  the queue head waits: the reservation holds every token they write, and nothing is charged
  per iteration);
* a queue order by prefix hit (`lpm`) re-sorts after an eviction: with two or more waiting, a
  stretch ends one step past its first evicting step (`EvictLimit(2, 1)`);
* a write policy that writes back on eviction (`write_back`) with a lower tier charges and
  records each write-back: a stretch ends before its first evicting step (`EvictLimit(0, 0)`);
* step times come from the latency model, and with a lower tier the first step also carries
  the write-backs not charged yet, as the first stepped iteration would (stepping charges tier
  traffic at every iteration; inside a stretch nothing writes back, so later steps add 0):
  `charge_tiers` charges them when the stretch is applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvcore.contract.capabilities import DecodeStretch, LowerTiers, Reserving
from kvcore.contract.policy import KVPolicy
from kvcore.contract.tiers import WRITES
from simulator.config import SimConfig
from simulator.latency import LatencyModel, PrefillBatch, step_ends
from simulator.scheduler import QueueOrder
from simulator.transfers import TierTraffic

#: (contexts after the first step, k) -> each of the k decode steps' time in seconds
StepTimes = Callable[[np.ndarray, int], np.ndarray]
#: (contexts after the first step, k, now, due) -> the steps' end times from `now`, up to and
#: including the first that reaches `due` (`step_ends` of the StepTimes, cut there)
StepEnds = Callable[[np.ndarray, int, float, float], np.ndarray]
#: (prefill chunks as (new tokens, context before), decode contexts, page size) -> seconds of
#: one iteration (the latency model's `iteration_time`, the call stepping makes)
IterationTime = Callable[[PrefillBatch, np.ndarray, int], float]


@dataclass(frozen=True)
class EvictLimit:
    """A stretch ends `after` steps past its first step that evicts cache, when at least
    `min_waiting` requests wait: the engine would react to that eviction (a queue sorted by
    prefix hits sorts again; a write-back to a lower tier is charged and recorded)."""

    min_waiting: int
    after: int


@dataclass(frozen=True)
class StretchRules:
    """Everything fixed that plans and prices a stretch, built once when the engine starts:
    the planner reads no engine configuration."""

    policy: KVPolicy  # the policy the stretches drive (under both capabilities below)
    decode: DecodeStretch | None  # the batched decode (None: no decode stretches)
    chunked: Reserving | None  # the batched chunked prefill (None: no prefill stretches)
    page_size: int
    max_steps: int  # --max-steps-per-stretch
    max_running: int  # the batch limit (a full batch admits nobody)
    reserving: bool  # admission reserves up front: its placement refused the head or not
    evict_limits: tuple[EvictLimit, ...]  # evictions the engine reacts to
    step_times: StepTimes  # latency model and lower-tier stalls
    step_ends: StepEnds  # the same steps' end times, priced only up to the next arrival
    iteration_time: IterationTime  # a prefill stretch's iterations, priced one by one
    # with a lower tier: charge the write-backs not charged yet (the stretch's first step
    # carries them, as the first stepped iteration would) and return the host tier's (used,
    # locked) slots the stretch holds; None without one
    charge_tiers: Callable[[], tuple[int, int]] | None = None


def stretch_rules(policy: KVPolicy, config: SimConfig, latency: LatencyModel,
                  schedule: QueueOrder, tier: TierTraffic | None) -> StretchRules | None:
    """The rules of this run's stretches; None when the policy has neither a batched decode
    nor a reservation to prefill into (the engine then steps one iteration at a time)."""
    decode = policy if isinstance(policy, DecodeStretch) else None
    chunked = policy if isinstance(policy, Reserving) and tier is None else None
    if decode is None and chunked is None:
        return None
    tiered = policy if isinstance(policy, LowerTiers) and tier is not None else None
    limits = []
    if schedule.by_prefix_hit:
        limits.append(EvictLimit(min_waiting=2, after=1))
    if tiered is not None and WRITES.get(config.tier.hicache_write_policy).on_evict:
        limits.append(EvictLimit(min_waiting=0, after=0))
    times = _step_times(latency, policy.page_size, tiered, tier)
    return StretchRules(
        policy=policy, decode=decode, chunked=chunked, page_size=policy.page_size,
        max_steps=config.tuning.max_steps_per_stretch,
        max_running=config.engine.max_running_requests,
        reserving=isinstance(policy, Reserving), evict_limits=tuple(limits),
        step_times=times, step_ends=_step_ends(latency, policy.page_size, times, tiered),
        iteration_time=latency.iteration_time,
        charge_tiers=_charge_tiers(tiered, tier))


def _step_times(latency: LatencyModel, page_size: int, tiered: LowerTiers | None,
                tier: TierTraffic | None) -> StepTimes:
    def step_times(contexts: np.ndarray, k: int) -> np.ndarray:
        times = np.asarray(latency.decode_step_times(contexts, page_size, k), dtype=float)
        if tiered is not None and tier is not None and len(times):
            t0 = float(times[0])
            stall = tier.decode_stall(tiered.tier_state(), t0, page_size)
            if stall:
                times = times.copy()
                times[0] = t0 + stall
        return times

    return step_times


def _step_ends(latency: LatencyModel, page_size: int, times: StepTimes,
               tiered: LowerTiers | None) -> StepEnds:
    """Without a tier stall the latency model prices the steps only up to the arrival
    (`decode_step_ends`); with one, every step's time (the first carries the stall), cut."""
    if tiered is None:
        def ends_untiered(contexts: np.ndarray, k: int, now: float, due: float) -> np.ndarray:
            return latency.decode_step_ends(contexts, page_size, k, now, due)

        return ends_untiered

    def ends_tiered(contexts: np.ndarray, k: int, now: float, due: float) -> np.ndarray:
        return step_ends(now, times(contexts, k), due)

    return ends_tiered


def _charge_tiers(tiered: LowerTiers | None, tier: TierTraffic | None
                  ) -> Callable[[], tuple[int, int]] | None:
    if tiered is None or tier is None:
        return None

    def charge() -> tuple[int, int]:
        state = tiered.tier_state()
        tier.written_since(state)
        return state.host_used, state.host_locked

    return charge
