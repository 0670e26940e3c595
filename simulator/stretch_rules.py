"""The fast-forward's rules for one run, fixed when the engine starts: the engine's options and
the policy's capabilities turned into the plain `StretchRules` the planner reads
(simulator/stretch.py), so that the planner knows nothing of queue orders, write policies,
tiers or latency models.

Features become data here, once:

* a queue order by prefix hit (`lpm`) re-sorts after an eviction: with two or more waiting, a
  stretch ends one step past its first evicting step (`EvictLimit(2, 1)`);
* a write policy that writes back on eviction (`write_back`) with a lower tier charges and
  records each write-back: a stretch ends before its first evicting step (`EvictLimit(0, 0)`);
* step times come from the latency model, and with a lower tier the first step also carries
  the write-backs not charged yet, as the first stepped iteration would (stepping charges tier
  traffic at every iteration; inside a stretch nothing writes back, so later steps add 0).
"""

from __future__ import annotations

import numpy as np

from kvcore.policies.base import KVPolicy
from kvcore.policies.capabilities import DecodeStretch, LowerTiers, Reserving
from kvcore.tiers import WRITES
from simulator.config import SimConfig
from simulator.latency import LatencyModel, step_ends
from simulator.scheduler import QueueOrder
from simulator.stretch import EvictLimit, StepEnds, StepTimes, StretchRules
from simulator.transfers import TierTraffic


def stretch_rules(policy: KVPolicy, config: SimConfig, latency: LatencyModel,
                  schedule: QueueOrder, tier: TierTraffic | None) -> StretchRules | None:
    """The rules of this run's stretches; None when the policy has no batched decode (the
    engine then steps one iteration at a time)."""
    if not isinstance(policy, DecodeStretch):
        return None
    tiered = policy if isinstance(policy, LowerTiers) and tier is not None else None
    limits = []
    if schedule.by_prefix_hit:
        limits.append(EvictLimit(min_waiting=2, after=1))
    if tiered is not None and WRITES.get(config.tier.hicache_write_policy).on_evict:
        limits.append(EvictLimit(min_waiting=0, after=0))
    times = _step_times(latency, policy.page_size, tiered, tier)
    return StretchRules(
        policy=policy, page_size=policy.page_size,
        max_steps=config.tuning.max_steps_per_stretch,
        max_running=config.engine.max_running_requests,
        reserving=isinstance(policy, Reserving), evict_limits=tuple(limits),
        step_times=times, step_ends=_step_ends(latency, policy.page_size, times, tiered))


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
