"""Achieved vs ideal prefix reuse in one sentence (the columns simulator/reuse_gap.py writes).

"missed reuse 0.00" next to a hit rate of 4 % reads as "nothing was missed" when the ideal is
22 %: missed reuse only counts page alignment at admission. This sentence puts the hit rate
next to the ideal and says where the rest went, for `run`, `compare` and `plan`; the
latency table's reuse rows (reports/tables.py) read the same columns through `REUSE_CAUSES`,
so the two always agree. A hybrid run adds the causes its layout has: sliding-window
eviction and the state-boundary rule.
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


#: each cause of lost reuse (simulator/reuse_gap.py) in words, and its summary column; the
#: hybrid ones only where the row has the column
REUSE_CAUSES: tuple[tuple[str, str], ...] = (
    ("page alignment", "reuse_gap_alignment"),
    ("requests not yet arrived or computed", "reuse_gap_not_arrived"),
    ("sliding-window eviction", "reuse_gap_window"),
    ("the state-boundary rule (states kept only at some positions)", "reuse_gap_state"),
    ("capacity (evicted before reuse)", "reuse_gap_capacity"),
)
HYBRID_CAUSES = ("reuse_gap_window", "reuse_gap_state")


def causes_of(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The causes a row reports: every plain one, the hybrid ones it has a column for."""
    return [(w, c) for w, c in REUSE_CAUSES if c not in HYBRID_CAUSES or c in row]


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
    lost = ", ".join(f"{_pct(row.get(c))} to {w}" for w, c in causes_of(row))
    return (f"{head}hit rate {_pct(row.get('prefix_hit_rate'))} of an ideal {_pct(ideal)} "
            f"(token level, infinite cache); lost: {lost}")


def reuse_lines(rows: list[Mapping[str, Any]], labels: list[str]) -> list[str]:
    """The reuse sentence of each row, told once when every row's is the same (a workload
    with no shared prefix gives "0.0 % of an ideal 0.0 %" under every policy)."""
    plain = [reuse_sentence(r) for r in rows]
    if len(rows) > 1 and plain[0] is not None and all(p == plain[0] for p in plain):
        return [reuse_sentence(rows[0], "all " + str(len(rows)) + " runs alike") or ""]
    out = [reuse_sentence(r, lab if len(rows) > 1 else "") for r, lab in
           zip(rows, labels, strict=True)]
    return [line for line in out if line is not None]


__all__ = ["HYBRID_CAUSES", "REUSE_CAUSES", "causes_of", "reuse_lines", "reuse_sentence"]
