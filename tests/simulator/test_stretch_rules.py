"""The fast-forward's rules for a run (simulator/fastforward/rules.py): each option that makes the
engine react to an eviction becomes one `EvictLimit`, reservation and limits come from the
policy and the config, and step times equal the latency model's (tier stalls aside). Builds
engines only (no simulation): well under a second in all."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from kvcore.model.presets import get_gpu, get_model
from simulator.config import SimConfig
from simulator.engine import Engine
from simulator.fastforward.rules import EvictLimit, StretchRules
from simulator.latency import make_latency_model
from simulator.metrics import Recorder
from simulator.run import build_policy
from simulator.transfers import TransferModel
from workloads.request import Workload


def _rules(**flat: object) -> StretchRules | None:
    """The rules the engine of `flat`'s config plans its stretches with."""
    cfg = SimConfig.of(kv_tokens=1024, max_context_len=1024, **flat)
    model, gpu = get_model(cfg.pool.model), get_gpu(cfg.pool.gpu)
    policy = build_policy(cfg, 1024)
    latency = make_latency_model(cfg.engine.latency, model, gpu, cfg.pool.tp, cfg.pool.kv_dtype,
                                 **cfg.engine.latency_constants(cfg.policy.page_size))
    transfers = (TransferModel.of(cfg.tier, model, gpu, cfg.pool.kv_dtype, cfg.pool.tp,
                                  cfg.policy.page_size) if cfg.tier.enabled else None)
    engine = Engine(simpy.Environment(), Workload("empty", []), policy, latency, cfg, 1024,
                    Recorder(policy.capacity, 0.0, 1.0, 0.1, 100), transfers=transfers)
    return engine.fast_forward.rules


@pytest.mark.parametrize(("flat", "limits"), [
    ({}, ()),
    ({"schedule": "lpm"}, (EvictLimit(2, 1),)),
    ({"hicache_ratio": 4.0, "hicache_write_policy": "write_back"}, (EvictLimit(0, 0),)),
    ({"hicache_ratio": 4.0, "hicache_write_policy": "write_through"}, ()),
    ({"schedule": "lpm", "hicache_ratio": 4.0, "hicache_write_policy": "write_back"},
     (EvictLimit(2, 1), EvictLimit(0, 0))),
])
def test_each_eviction_the_engine_reacts_to_is_one_limit(flat: dict, limits: tuple) -> None:
    rules = _rules(policy="paged", page_size=16, **flat)
    assert rules is not None and rules.evict_limits == limits
    assert rules.page_size == 16 and not rules.reserving


def test_limits_and_reservation_come_from_the_config_and_the_policy() -> None:
    rules = _rules(policy="contiguous-max", max_running_requests=7, max_steps_per_stretch=33)
    assert rules is not None
    assert (rules.reserving, rules.max_running, rules.max_steps) == (True, 7, 33)


def test_step_times_are_the_latency_models_without_a_tier() -> None:
    rules = _rules(policy="vllm", page_size=16)
    assert rules is not None
    contexts = np.array([17, 40, 300], dtype=np.int64)
    got = rules.step_times(contexts, 5)
    assert len(got) == 5 and np.all(np.diff(got) >= 0)  # contexts grow: never faster
    cfg = SimConfig.of(policy="vllm", page_size=16)
    want = make_latency_model(cfg.engine.latency, cfg.pool.model, cfg.pool.gpu, cfg.pool.tp,
                              cfg.pool.kv_dtype, **cfg.engine.latency_constants(16)
                              ).decode_step_times(contexts, 16, 5)
    np.testing.assert_array_equal(got, want)
