"""A fleet's shared KV tier (simulator/shared_tier.py): prefixes that recur across replicas
become hits under a router that ignores them; the cluster row's shared-tier columns add up;
stepping and fast-forward agree; without one, nothing changes; the option errors."""

from __future__ import annotations

import math

import pytest

from experiments.options.run_options import RunOptions
from simulator.fleet import FleetSetup, simulate_fleet
from simulator.shared_tier import SHARED_COLUMNS, replica_tier
from simulator.specs import TierSpec
from tests.simulator.helpers import config, kshot

GIB = 2**30


def _workload():
    """24 system prompts of 400 tokens, each asked 10 times: more than a replica's pool and
    host tier hold, so a random router keeps sending a prefix where it is not cached."""
    return kshot(n=240, rate=20.0, prefix=400, question=24, num_prefixes=24, seed=4)


def _cfg(**kw):
    base = dict(policy="paged", kv_tokens=2048, hicache_ratio=1.0,
                hicache_prefetch_policy="wait_complete", max_context_len=1024)
    base.update(kw)
    return config(**base)


@pytest.mark.parametrize("policy", ["paged", "vllm"])
def test_a_shared_tier_raises_the_hit_rate_under_the_random_router(policy: str) -> None:
    w = _workload()
    setup = FleetSetup(4, "random")
    alone = simulate_fleet(w, _cfg(policy=policy), setup)
    shared = simulate_fleet(w, _cfg(policy=policy, shared_tier_size=1.0), setup)
    a, s = alone.summary, shared.summary
    assert a["storage_hit_rate"] == 0
    assert s["shared_tier_hit_rate"] > 0.2, s["shared_tier_hit_rate"]
    assert s["prefix_hit_rate"] > a["prefix_hit_rate"] + 0.2, \
        (s["prefix_hit_rate"], a["prefix_hit_rate"])
    # the cluster row: what the replicas read and wrote, the store counted once
    cols = shared.extra["fleet"].columns
    for c in SHARED_COLUMNS:
        assert cols[c] == s[c]
    assert s["shared_tier_hit_rate"] == s["storage_hit_rate"]
    assert s["shared_tier_read_bytes"] > 0 and s["shared_tier_write_bytes"] > 0
    assert 0 < s["shared_tier_used_pct"] <= 100
    per_token = shared.extra["fleet"].replica_rows  # the replicas' rows exist
    assert len(per_token) == 4
    each = replica_tier(_cfg(shared_tier_size=1.0).tier)
    assert s["storage_capacity_slots"] < 4 * 1.0 * GIB  # once, not once per replica
    assert each.storage_size == 1.0 and each.shared_tier_size == 0


def test_the_shared_tiers_transfers_cost_time() -> None:
    """A slower link to the shared tier: the same hits, a longer TTFT."""
    w = _workload()
    setup = FleetSetup(4, "random")
    fast = simulate_fleet(w, _cfg(shared_tier_size=1.0, shared_tier_gbps=100.0), setup)
    slow = simulate_fleet(w, _cfg(shared_tier_size=1.0, shared_tier_gbps=0.5), setup)
    assert slow.summary["shared_tier_hit_rate"] > 0
    p90 = [r.extra["fleet"].columns["ttft_p90_s"] for r in (slow, fast)]
    assert p90[0] > p90[1], p90


@pytest.mark.parametrize("policy", ["paged", "vllm"])
@pytest.mark.parametrize("write", ["write_back", "write_through", "write_through_selective"])
def test_stepping_and_fast_forward_agree_with_a_shared_tier(policy: str, write: str) -> None:
    """The store changes only where a stretch ends (a prefill done, a finish, a write-back
    eviction), so the fast-forward needs no rule of its own for it."""
    w = kshot(n=80, rate=10.0, prefix=200, question=24, num_prefixes=8, seed=2)
    cfg = _cfg(policy=policy, kv_tokens=1024, shared_tier_size=0.05,
               hicache_write_policy=write, hicache_prefetch_policy="best_effort")
    setup = FleetSetup(3, "random")
    stretches = [0]

    def count(t0: float, t1: float, chunks: object, rids: object, steps: int) -> None:
        stretches[0] += steps >= 2

    a = simulate_fleet(w, cfg, setup, event_sink=count)
    b = simulate_fleet(w, cfg.replace(max_steps_per_stretch=1), setup)
    assert stretches[0] > 10 and a.summary["shared_tier_hit_rate"] > 0
    skip = {"sim_wall_s", "max_steps_per_stretch"}
    diff = [k for k in a.summary if k not in skip and a.summary[k] != b.summary[k]
            and not (isinstance(a.summary[k], float) and math.isnan(a.summary[k]))]
    assert not diff, diff
    assert a.requests.reset_index(drop=True).equals(b.requests.reset_index(drop=True))
    for x, y in zip(a.extra["fleet"].replica_rows, b.extra["fleet"].replica_rows,
                    strict=True):
        assert {k: v for k, v in x.items() if v == v} == {k: v for k, v in y.items() if v == v}


def test_no_shared_tier_keeps_the_columns_and_hash() -> None:
    """Without --shared-tier-size its options are neither summary columns nor hashed."""
    o = RunOptions()
    assert not any(k.startswith("shared_tier") for k in o.resolved())
    on = RunOptions.from_mapping(dict(hicache_ratio=1.0, shared_tier_size=2.0, replicas=2))
    assert on.resolved()["shared_tier_size"] == 2.0
    assert on.config_hash() != RunOptions.from_mapping(
        dict(hicache_ratio=1.0, storage_size=2.0, replicas=2)).config_hash()
    one = RunOptions.from_mapping(dict(hicache_ratio=1.0, shared_tier_size=2.0))
    with pytest.raises(ValueError, match="--replicas 2 or more"):
        one.sim_config()


@pytest.mark.parametrize("kw,msg", [
    (dict(shared_tier_size=1.0), "needs a host tier"),
    (dict(shared_tier_size=1.0, hicache_ratio=1.0, storage_size=1.0), "give one of"),
    (dict(shared_tier_size=1.0, hicache_ratio=1.0, shared_tier_gbps=0.0),
     "--shared-tier-gbps must be in"),
    (dict(shared_tier_size=1.0, hicache_ratio=1.0, shared_tier_gbps=-1.0),
     "--shared-tier-gbps must be in"),
])
def test_bad_shared_tier_options(kw: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg) as e:
        TierSpec(**kw)
    assert "\n" not in str(e.value)


def test_a_shared_tier_needs_two_replicas() -> None:
    with pytest.raises(ValueError, match="--replicas 2 or more") as e:
        simulate_fleet(kshot(n=4), _cfg(shared_tier_size=1.0), FleetSetup(1))
    assert "\n" not in str(e.value)
