"""A run's SLO verdict in one line: met or missed, the attainments, which target binds.

Read from the summary row's SLO columns (experiments/answers/slo.py writes them when a target is
given), so `run` and `compare` print the same words for a fresh run and a saved one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def _number(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _met(v: Any) -> bool | None:
    """slo_met as a bool: a fresh row's bool, a CSV's 'True' / 'False', None when absent."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    return None


def slo_line(row: Mapping[str, Any], name: str = "") -> str | None:
    """The SLO verdict of one run ("SLO met: ..." / "SLO missed: ..."), None without a target.
    `name` prefixes it (the policy, when several runs are printed)."""
    met = _met(row.get("slo_met"))
    if met is None:
        return None
    pct = _number(row.get("slo_percentile")) or 99.0
    targets = [(f"TTFT <= {v:g} s", _number(row.get("slo_ttft_attainment")))
               for v in [_number(row.get("slo_ttft"))] if v is not None]
    targets += [(f"TPOT <= {v:g} s", _number(row.get("slo_tpot_attainment")))
                for v in [_number(row.get("slo_tpot"))] if v is not None]
    both = _number(row.get("slo_attainment"))
    each = ", ".join(f"{t} {a:.1%}" for t, a in targets if a is not None)
    what = " and ".join(t for t, _ in targets)
    head = f"{name}: " if name else ""
    share = f"{both:.1%}" if both is not None else "-"
    line = (f"{head}SLO {'met' if met else 'missed'} ({pct:g} % of requests: {what}): "
            f"{share} of all requests met {'every target' if len(targets) > 1 else 'it'}"
            + (f" ({each})" if len(targets) > 1 else ""))
    binding = row.get("slo_binding")
    if not met and isinstance(binding, str) and binding:
        line += f"; {binding} binds"
    return line


__all__ = ["slo_line"]
