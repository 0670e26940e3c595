"""Achieved vs ideal prefix reuse in one sentence (the columns simulator/reuse_gap.py writes).

"missed reuse 0.00" next to a hit rate of 4 % reads as "nothing was missed" when the ideal is
22 %: missed reuse only counts page alignment at admission. This sentence puts the hit rate
next to the ideal and says where the rest went, for `run`, `compare` and `plan`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def _pct(v: Any) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return "-"
    return f"{f:.1%}" if math.isfinite(f) else "-"


def reuse_sentence(row: Mapping[str, Any], label: str = "") -> str | None:
    """'hit rate X of an ideal Y; lost: a to page alignment, b to requests not yet arrived,
    c to capacity' for a summary row; None when the row has no ideal (older results, or
    per-request rows that went to a sink)."""
    ideal = row.get("ideal_hit_rate")
    try:
        if ideal is None or not math.isfinite(float(ideal)):
            return None
    except (TypeError, ValueError):
        return None
    head = f"reuse{f' ({label})' if label else ''}: "
    return (f"{head}hit rate {_pct(row.get('prefix_hit_rate'))} of an ideal {_pct(ideal)} "
            f"(token level, infinite cache); lost: {_pct(row.get('reuse_gap_alignment'))} to "
            f"page alignment, {_pct(row.get('reuse_gap_not_arrived'))} to requests not yet "
            f"arrived or computed, {_pct(row.get('reuse_gap_capacity'))} to capacity (evicted "
            "before reuse)")


def reuse_lines(rows: list[Mapping[str, Any]], labels: list[str]) -> list[str]:
    """The reuse sentence of each row, told once when every row's is the same (a workload
    with no shared prefix gives "0.0 % of an ideal 0.0 %" under every policy)."""
    plain = [reuse_sentence(r) for r in rows]
    if len(rows) > 1 and plain[0] is not None and all(p == plain[0] for p in plain):
        return [reuse_sentence(rows[0], "all " + str(len(rows)) + " runs alike") or ""]
    out = [reuse_sentence(r, lab if len(rows) > 1 else "") for r, lab in
           zip(rows, labels, strict=True)]
    return [line for line in out if line is not None]


__all__ = ["reuse_lines", "reuse_sentence"]
