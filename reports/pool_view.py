"""A hybrid run's pools per layer kind, for the terminal (`kvsim run`) and the report.

Reads the per-kind summary columns (`<kind>_pool_capacity_bytes`, `_pool_used_pct`,
`_pool_cached_pct`, `_pool_hit_rate`, and `pools_shared`; simulator/pool_columns.py writes
them for hybrid runs only). Rows without them (full-attention runs) give nothing, so those
outputs are unchanged.

Pools are shown as the engine lays them out: SGLang's full / SWA / state pools one line each,
each its own capacity; vLLM's KV cache groups as one shared pool (its capacity once, its use
the sum of the kinds') followed by each kind's share of it, whose capacity cell reads
"shared" rather than repeating the pool's bytes as if each kind had them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from rich.table import Table

from kvcore.contract.capabilities import POOL_KINDS
from reports.deltas import as_number as _num

HEADER = ("policy", "page", "pool", "capacity (GiB)", "used %", "cached %", "hit rate")


def _shared(r: Mapping[str, Any]) -> bool:
    v = r.get("pools_shared")
    return bool(v) and str(v).lower() not in ("false", "0", "nan")


def pool_rows(rows: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """One line per run and pool kind it has: policy, page, kind, capacity, used, cached,
    hit rate (formatted); a shared pool first as one line of its own ("shared pool", its
    capacity once, used and cached summed over the kinds, the run's prefix hit rate), then
    each kind's share with "shared" for its capacity."""
    out = []
    for r in rows:
        kinds = [k for k in POOL_KINDS
                 if not math.isnan(_num(r.get(f"{k}_pool_capacity_bytes")))]
        head = [str(r.get("policy", "")), str(r.get("page_size", ""))]
        shared = _shared(r) and kinds
        if shared:
            cap = _num(r.get(f"{kinds[0]}_pool_capacity_bytes"))
            used = sum(_num(r.get(f"{k}_pool_used_pct")) for k in kinds)
            cached = sum(_num(r.get(f"{k}_pool_cached_pct")) for k in kinds)
            out.append([*head, "shared pool", f"{cap / 2**30:.2f}",
                        f"{used:.1f}", f"{cached:.1f}",
                        f"{_num(r.get('prefix_hit_rate')):.3f}"])
        for kind in kinds:
            cap = _num(r.get(f"{kind}_pool_capacity_bytes"))
            out.append([*head, f"  {kind} share" if shared else kind,
                        "shared" if shared else f"{cap / 2**30:.2f}",
                        f"{_num(r.get(f'{kind}_pool_used_pct')):.1f}",
                        f"{_num(r.get(f'{kind}_pool_cached_pct')):.1f}",
                        f"{_num(r.get(f'{kind}_pool_hit_rate')):.3f}"])
    return out


def pool_table(rows: Iterable[Mapping[str, Any]]) -> Table | None:
    """The pools per layer kind as a rich table, or None when no row has any."""
    lines = pool_rows(rows)
    if not lines:
        return None
    t = Table(title="Hybrid pools per layer kind (time-weighted % of each pool, of the shared "
              "pool for a kind's share; hits of the tokens asked of it)")
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
