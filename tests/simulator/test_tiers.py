"""The engine with lower KV tiers: a tier of size 0 changes nothing on any policy; an unbounded
host tier reaches the trace's ideal reuse; loads are charged as stalls (TTFT), block >= overlap;
storage prefetch policies; option errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments.options.run_options import RunOptions
from simulator.run import simulate
from simulator.specs import TierSpec
from simulator.transfers import TransferModel
from tests.simulator.helpers import CONTIGUOUS_POLICIES, PAGED_POLICIES, config, kshot
from workloads import build_workload
from workloads.reuse import ideal_reuse, ideal_reuse_hits

TIER_COLUMNS = ("hicache_size", "hicache_ratio", "storage_size", "hicache_write_policy",
                "hicache_prefetch_policy", "hicache_prefetch_timeout_s", "hicache_load",
                "host_link_gbps", "storage_gbps", "storage_latency_us")
# four prefixes, arrivals far apart: the device pool (4 prompts) forgets, the host remembers
WORK = kshot(n=40, rate=2.0, prefix=300, question=24, num_prefixes=4)


def _results(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "sim_wall_s" and k not in TIER_COLUMNS}


def _same(a: dict, b: dict) -> bool:
    return all((isinstance(v, float) and math.isnan(v) and math.isnan(b[k])) or v == b[k]
               for k, v in a.items())


@pytest.mark.parametrize("policy", PAGED_POLICIES + CONTIGUOUS_POLICIES)
def test_tier_size_zero_changes_nothing(policy: str) -> None:
    """Every other tier knob set, sizes 0: the same summary and request rows as no tier."""
    w = kshot(n=30)
    base = simulate(w, config(policy=policy))
    knobs = dict(hicache_write_policy="write_back", hicache_prefetch_policy="wait_complete",
                 hicache_load="block", host_link_gbps=1.0, storage_gbps=1.0,
                 storage_latency_us=5000.0)
    tiered = simulate(w, config(policy=policy, **knobs))
    assert _same(_results(base.summary), _results(tiered.summary))
    assert base.requests.equals(tiered.requests)
    assert base.summary["host_capacity_slots"] == 0 and base.summary["host_hit_rate"] == 0


def _tiered(**kw):
    base = dict(kv_tokens=1024, max_context_len=1024, page_size=16, hicache_ratio=4.0)
    base.update(kw)
    return simulate(WORK, config(**base))


@pytest.mark.parametrize("policy", ["paged", "vllm"])
def test_host_tier_serves_what_the_device_forgot(policy: str) -> None:
    plain = simulate(WORK, config(policy=policy, kv_tokens=1024, max_context_len=1024,
                                  page_size=16))
    r = _tiered(policy=policy)
    s = r.summary
    assert s["prefix_hit_rate"] > plain.summary["prefix_hit_rate"]
    assert s["host_hit_rate"] > 0 and s["storage_hit_rate"] == 0
    # Where the hits came from, counted independently of the engine's tier counters: the
    # whole trace's reuse (token-id prefix matches, workloads/reuse.py) is served, the device
    # keeps exactly what it keeps without a tier (same pool, arrivals far apart), and the host
    # serves, request by request, the difference. A sum check (total = device + host) is true
    # by definition in simulator/run.py and could not fail.
    ideal = ideal_reuse_hits(WORK, 16)
    q = r.requests.set_index("request_id").loc[ideal.request_ids]
    device = plain.requests.set_index("request_id").loc[ideal.request_ids].cached_tokens
    assert (q.cached_tokens.to_numpy() == ideal.hits).all()
    assert (q.host_hit_tokens.to_numpy() == ideal.hits - device.to_numpy()).all()
    prompt = q.prompt_len.sum()
    assert s["prefix_hit_rate"] == pytest.approx(ideal.hits.sum() / prompt, abs=1e-12)
    assert s["host_hit_rate"] == pytest.approx((ideal.hits - device).sum() / prompt, abs=1e-12)
    assert s["device_hit_rate"] == pytest.approx(device.sum() / prompt, abs=1e-12)
    assert s["host_to_device_bytes"] > 0 and s["device_to_host_bytes"] > 0
    assert s["load_stall_s"] > 0 and 0 < s["host_cached_pct"] <= 100
    # the host's time-averaged use (free = 100 - used holds by definition in simulator/run.py)
    # lies within what the timeline sampled of it, counted apart from the summary's integral
    used = 100 - s["host_free_pct"]
    sampled = r.timeline.host_used / s["host_capacity_slots"] * 100
    assert sampled.min() <= used <= sampled.max() and 0 < s["host_free_pct"] < 100
    q = r.requests
    assert (q.host_hit_tokens > 0).any()
    assert (q.load_stall_s[q.host_hit_tokens == 0] == 0).all()  # only loaders stall
    assert (r.timeline.host_used > 0).any()


def test_block_stalls_at_least_overlap() -> None:
    over = _tiered(latency="roofline").summary
    block = _tiered(latency="roofline", hicache_load="block").summary
    assert block["host_hit_rate"] == over["host_hit_rate"]
    assert block["load_stall_s"] > over["load_stall_s"] > 0
    slow = _tiered(latency="roofline", host_link_gbps=0.5).summary
    assert slow["load_stall_s"] > over["load_stall_s"]


def test_overlap_model() -> None:
    m = TransferModel(1.0, 4, 1.0, 1.0, 0.0, "overlap", "best_effort", 0.0)
    assert m.load_stall(8.0, 100.0) == 2.0  # hidden but the first layer's
    assert m.load_stall(8.0, 4.0) == 8.0 - 4.0 + 1.0
    assert m.load_stall(0.0, 4.0) == 0.0
    assert TransferModel(1.0, 4, 1.0, 1.0, 0.0, "block", "best_effort", 0.0).load_stall(
        8.0, 100.0) == 8.0


def test_write_policies() -> None:
    """write_through and write_back both keep what the device forgets; selective only backs
    up prefixes hit on the device, which this pool forgets first: it writes least."""
    runs = {w: _tiered(hicache_write_policy=w).summary
            for w in ("write_through", "write_through_selective", "write_back")}
    for s in runs.values():
        assert s["requests_completed"] == WORK.num_requests
    assert runs["write_through"]["host_hit_rate"] > 0 and runs["write_back"]["host_hit_rate"] > 0
    assert runs["write_through_selective"]["device_to_host_bytes"] \
        < runs["write_back"]["device_to_host_bytes"] \
        <= runs["write_through"]["device_to_host_bytes"]


def test_storage_prefetch_policies() -> None:
    """Host 1x the pool, storage behind it: waiting for the prefetch gets at least what
    best effort gets, and a slow storage gives best effort nothing."""
    kw = dict(hicache_ratio=1.0, storage_size=0.01)
    wait = _tiered(hicache_prefetch_policy="wait_complete", **kw).summary
    assert wait["storage_hit_rate"] > 0 and wait["host_to_storage_bytes"] > 0
    slow = _tiered(hicache_prefetch_policy="best_effort", storage_latency_us=1e9, **kw).summary
    assert slow["storage_hit_rate"] == 0
    timeout = _tiered(hicache_prefetch_policy="timeout", hicache_prefetch_timeout_s=10.0,
                      **kw).summary
    assert timeout["storage_hit_rate"] == pytest.approx(wait["storage_hit_rate"])


def test_tier_option_errors() -> None:
    with pytest.raises(ValueError, match="one of --hicache-size"):
        TierSpec(hicache_size=1.0, hicache_ratio=1.0)
    with pytest.raises(ValueError, match="needs a host tier"):
        TierSpec(storage_size=1.0)
    with pytest.raises(ValueError, match="never"):
        TierSpec(hicache_write_policy="never")
    with pytest.raises(ValueError, match="--policy paged or vllm, not 'contiguous-max'"):
        simulate(kshot(n=3), config(policy="contiguous-max", hicache_ratio=1.0))
    with pytest.raises(ValueError, match="--policy paged or vllm, not 'paged-nocache'"):
        simulate(kshot(n=3), config(policy="paged-nocache", hicache_ratio=1.0))


# -- the vllm policy's host tier (kvcore/vllm/tiered.py) --------------------------------


def test_vllm_write_policies() -> None:
    """Every write policy keeps what the device forgets on this reuse-heavy workload;
    selective writes least (only blocks already reused on the device)."""
    runs = {w: _tiered(policy="vllm", hicache_write_policy=w).summary
            for w in ("write_through", "write_through_selective", "write_back")}
    for s in runs.values():
        assert s["requests_completed"] == WORK.num_requests
        assert s["host_hit_rate"] > 0
    assert runs["write_through_selective"]["device_to_host_bytes"] \
        < runs["write_through"]["device_to_host_bytes"]
    assert runs["write_back"]["device_to_host_bytes"] \
        <= runs["write_through"]["device_to_host_bytes"]


def test_vllm_storage_tier() -> None:
    """Host 1x the pool, storage behind it: host evictions spill to storage and waiting for
    the prefetch brings them back."""
    s = _tiered(policy="vllm", hicache_ratio=1.0, storage_size=0.01,
                hicache_prefetch_policy="wait_complete").summary
    assert s["storage_hit_rate"] > 0 and s["host_to_storage_bytes"] > 0
    assert s["storage_to_host_bytes"] > 0


@pytest.mark.parametrize("policy", ["paged", "vllm"])
@pytest.mark.parametrize("page_size", [16, 512])
def test_unbounded_host_reaches_the_ideal_reuse(page_size: int, policy: str) -> None:
    """The bundled Mooncake trace (a slice): with a host tier that never evicts, the total hit
    rate is the trace's ideal reuse (page-aligned, the last token computed) within 0.5 points,
    for the radix tree's tiers (paged) and the hash-chain block store's (vllm) alike."""
    opts = RunOptions.from_mapping({"workload": "mooncake-conv", "num_requests": 500,
                                    "page_size": page_size, "kv_tokens": 262144,
                                    "hicache_ratio": 30.0, "policy": policy})
    w = build_workload(opts.workload_spec())
    total = sum(r.prompt_len + r.output_len for r in w.requests)
    assert total <= 30 * 262144  # unbounded: the host holds everything written
    s = simulate(w, opts.sim_config()).summary
    ideal = ideal_reuse(w, page_size)
    assert ideal > 0.1
    assert abs(s["prefix_hit_rate"] - ideal) * 100 <= 0.5, (s["prefix_hit_rate"], ideal)
    assert s["requests_rejected"] == 0  # the ideal counts every prompt
    assert s["host_hit_rate"] > s["device_hit_rate"]
    assert np.isfinite(s["ttft_p50_s"])


@pytest.mark.parametrize("page_size,write,admission", [
    (1, "write_back", "vllm"), (16, "write_through", "sglang"),
    (4, "write_through_selective", "vllm"), (16, "write_back", "reserve")])
def test_vllm_tier_under_pressure(page_size: int, write: str, admission: str) -> None:
    """A crowded pool (preemptions, unadmitted rounds, chunked prefills) with host and storage
    tiers (six 324-token prefixes, more than host + storage hold): the policy's invariants
    hold at every iteration (config checks them), every request completes, storage serves
    hits, and the hit never exceeds the workload's ideal reuse."""
    w = kshot(n=60, rate=60.0, prefix=300, question=24, num_prefixes=6)
    r = simulate(w, config(policy="vllm", kv_tokens=1024, max_context_len=1024,
                           page_size=page_size, hicache_ratio=1.0, storage_size=0.1,
                           hicache_write_policy=write, admission=admission,
                           hicache_prefetch_policy="wait_complete"))
    s = r.summary
    assert s["requests_completed"] == w.num_requests
    assert s["prefix_hit_rate"] <= ideal_reuse(w, page_size) + 1e-12
    assert s["storage_hit_rate"] > 0 and s["host_to_storage_bytes"] > 0
    # device = total - host - storage by definition (simulator/run.py): check each source
    # against the request rows instead, each request's loads within its own hit
    q = r.requests
    prompt = q.prompt_len.sum()
    assert (q.host_hit_tokens + q.storage_hit_tokens <= q.cached_tokens).all()
    assert s["prefix_hit_rate"] == pytest.approx(q.cached_tokens.sum() / prompt, abs=1e-12)
    assert s["host_hit_rate"] == pytest.approx(q.host_hit_tokens.sum() / prompt, abs=1e-12)
    assert s["storage_hit_rate"] == pytest.approx(q.storage_hit_tokens.sum() / prompt,
                                                  abs=1e-12)
