"""A hybrid run's pools per layer kind, for the terminal (`kvsim run`) and the report.

Reads the per-kind summary columns (`<kind>_pool_capacity_bytes`, `_pool_used_pct`,
`_pool_cached_pct`, `_pool_hit_rate`; simulator/pool_columns.py writes them for hybrid runs
only). Rows without them (full-attention runs) give nothing, so those outputs are unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from rich.table import Table

from kvcore.policies.capabilities import POOL_KINDS
from reports.deltas import as_number as _num

HEADER = ("policy", "page", "pool", "capacity (GiB)", "used %", "cached %", "hit rate")


def pool_rows(rows: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """One line per run and pool kind it has: policy, page, kind, capacity, used, cached,
    hit rate (formatted)."""
    out = []
    for r in rows:
        for kind in POOL_KINDS:
            cap = _num(r.get(f"{kind}_pool_capacity_bytes"))
            if math.isnan(cap):
                continue
            out.append([str(r.get("policy", "")), str(r.get("page_size", "")), kind,
                        f"{cap / 2**30:.2f}", f"{_num(r.get(f'{kind}_pool_used_pct')):.1f}",
                        f"{_num(r.get(f'{kind}_pool_cached_pct')):.1f}",
                        f"{_num(r.get(f'{kind}_pool_hit_rate')):.3f}"])
    return out


def pool_table(rows: Iterable[Mapping[str, Any]]) -> Table | None:
    """The pools per layer kind as a rich table, or None when no row has any."""
    lines = pool_rows(rows)
    if not lines:
        return None
    t = Table(title="Hybrid pools per layer kind (time-weighted % of each pool; hits of the "
              "tokens asked of it)")
    for i, name in enumerate(HEADER):
        t.add_column(name, justify="left" if i in (0, 2) else "right")
    for line in lines:
        t.add_row(*line)
    return t


__all__ = ["HEADER", "pool_rows", "pool_table", "run_tables"]


def run_tables(row: Mapping[str, Any]) -> list[Any]:
    """What `kvsim run` prints for one run, in order: the header, the memory breakdown, the
    latency summary and, for a hybrid model, its pools per layer kind."""
    from reports.tables import breakdown_table, latency_table, run_header

    pools = pool_table([row])
    return [run_header(row), breakdown_table([row]), latency_table([row]),
            *([pools] if pools is not None else [])]
