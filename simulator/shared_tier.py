"""A fleet's shared KV tier in a run (`--shared-tier-size`, `--shared-tier-gbps`,
`--shared-tier-latency-us`): the options' checks, how each replica is built, the one store
attached to every replica, and the cluster columns it adds.

The model (kvcore/tiers/shared.py, docs/fleet.md "A shared KV tier"):
* each replica is built as a run with a storage tier of the shared tier's size, reached at
  the shared tier's bandwidth and latency (`replica_tier`): the storage path of today
  (a prefix past the host hit read into the host, then loaded; the prefetch policy; transfer
  time = latency + bytes / bandwidth; writes beside compute at the bandwidth) is the shared
  tier's path;
* then one store (the first replica's) becomes every replica's storage tier
  (`attach_shared`), written through from each host tier, so a prefix any replica wrote is a
  hit for all;
* each replica's link is its own (a NIC per node): the bandwidth is not divided between
  replicas reading at once.
Stepping and fast-forward stay identical with no rule of their own: a replica writes into
the store only from its host, and its host is written only when a prefill completes, a
request finishes, or (write_back) the device evicts; a decode stretch ends before any of them
(simulator/fastforward/planner.py), so the store changes at the same instants in both modes,
and another replica reads it only at its own admissions.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvcore.tiers.shared import SharedTier
from simulator.specs import TierSpec

if TYPE_CHECKING:
    from simulator.run_summary import RunSummary

__all__ = ["SHARED_COLUMNS", "SHARED_OPTIONS", "attach_shared", "check_shared_tier",
           "replica_tier", "shared_columns"]

#: the options only a fleet's shared tier reads (out of a run's columns and hash without one)
SHARED_OPTIONS = ("shared_tier_size", "shared_tier_gbps", "shared_tier_latency_us")
#: the cluster row's shared-tier columns
SHARED_COLUMNS = ("shared_tier_hit_rate", "shared_tier_read_bytes", "shared_tier_write_bytes",
                  "shared_tier_used_pct")


def check_shared_tier(tier: TierSpec, replicas: int) -> None:
    """A shared tier is shared by two replicas or more (on one replica it is a storage tier:
    --storage-size)."""
    if tier.shared_tier_size and replicas < 2:
        raise ValueError(f"--shared-tier-size {tier.shared_tier_size}: a shared tier needs "
                         "--replicas 2 or more (on one replica use --storage-size)")


def replica_tier(tier: TierSpec) -> TierSpec:
    """The tier spec each replica is built with: the shared tier as its storage level (size,
    bandwidth, latency); the spec itself without a shared tier."""
    if not tier.shared_tier_size:
        return tier
    return replace(tier, storage_size=tier.shared_tier_size,
                   storage_gbps=tier.shared_tier_gbps,
                   storage_latency_us=tier.shared_tier_latency_us, shared_tier_size=0.0)


def attach_shared(policies: list[Any]) -> SharedTier:
    """The first policy's storage store becomes every policy's (each built by `replica_tier`
    with the shared tier as its storage level)."""
    tiers = [p.tiers for p in policies]
    first = tiers[0].storage
    if first is None:
        raise ValueError("a shared tier needs replicas built with a storage level")
    shared = SharedTier(first)
    for t in tiers:
        shared.attach(t)
    return shared


def shared_columns(shared: SharedTier, summary: RunSummary) -> dict[str, Any]:
    """The cluster row's shared-tier figures (from the replicas' summed storage columns, which
    only the shared tier feeds) and its true capacity (the replicas' sum counts it once each)."""
    cap = shared.capacity
    return {
        "shared_tier_hit_rate": summary.storage_hit_rate,
        "shared_tier_read_bytes": summary.storage_to_host_bytes,
        "shared_tier_write_bytes": summary.host_to_storage_bytes,
        "shared_tier_used_pct": 100.0 * shared.used / cap if cap else math.nan,
        "storage_capacity_slots": cap,
    }
