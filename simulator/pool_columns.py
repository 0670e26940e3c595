"""A hybrid run's summary columns per pool kind (full, swa, chunked, mamba).

A policy with the `PoolKinds` capability reports each pool's bytes and prefix hits
(kvcore.contract.capabilities.PoolUsage). The recorder integrates the bytes in use and held by
the cache over the measurement window, as it does the breakdown's parts (simulator/metrics.py),
so the columns are time-weighted shares of each pool's capacity; the hit rate is the pool's
hit tokens over the tokens admissions asked it for, over the whole run. A full-attention run
has no such policy and none of these columns, so its summary keeps its exact column set.

Columns, for each kind the policy reports (`<kind>` one of POOL_KINDS):
`<kind>_pool_capacity_bytes`, `<kind>_pool_used_pct` (in use, cache included),
`<kind>_pool_cached_pct` (held by the prefix cache alone), `<kind>_pool_hit_rate`; and
`pools_shared`: True when the kinds share one pool (vLLM), whose bytes every kind's capacity
column then repeats and whose use the kinds' used shares add up to.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kvcore.contract.capabilities import POOL_KINDS, PoolUsage

#: the per-kind column suffixes, in the order a summary shows them
POOL_COLUMN_SUFFIXES = ("pool_capacity_bytes", "pool_used_pct", "pool_cached_pct",
                        "pool_hit_rate")


def pool_columns(usage: Mapping[str, PoolUsage], seconds: Mapping[str, np.ndarray],
                 span: float, shared: bool = False) -> dict[str, float | bool]:
    """The columns of each pool kind: `usage` at the end of the run, `seconds` each kind's
    integral of (used, cached) bytes over the window of length `span`; `shared`: the kinds
    share one pool (PoolKinds.shared_pool)."""
    out: dict[str, float | bool] = {"pools_shared": bool(shared)}
    for kind in POOL_KINDS:
        u = usage.get(kind)
        if u is None:
            continue
        used_s, cached_s = seconds.get(kind, np.zeros(2))
        denom = u.capacity_bytes * span
        out[f"{kind}_pool_capacity_bytes"] = float(u.capacity_bytes)
        out[f"{kind}_pool_used_pct"] = float(used_s / denom * 100.0) if denom > 0 else 0.0
        out[f"{kind}_pool_cached_pct"] = float(cached_s / denom * 100.0) if denom > 0 else 0.0
        out[f"{kind}_pool_hit_rate"] = (u.hit_tokens / u.queried_tokens if u.queried_tokens
                                        else 0.0)
    return out


def pool_column_names(row: Mapping[str, object]) -> list[str]:
    """The pool kinds a summary row has columns for, in POOL_KINDS order."""
    return [k for k in POOL_KINDS if f"{k}_pool_capacity_bytes" in row]


__all__ = ["POOL_COLUMN_SUFFIXES", "pool_column_names", "pool_columns"]
