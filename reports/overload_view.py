"""What the commands print about overload: the one-line warning and the capacity answer.

Read from summary rows (the `overloaded` / `overload_reason` columns simulator/overload.py
writes) so `run`, `compare`, `sweep` and `plan` warn in the same words, and a saved results
directory reads the same as a fresh run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def is_overloaded(row: Mapping[str, Any]) -> bool:
    """The row's verdict; rows written before the column existed count as not overloaded."""
    v = row.get("overloaded", False)
    if isinstance(v, str):
        return v.strip().lower() == "true"
    return bool(v) and not (isinstance(v, float) and math.isnan(v))


def _where(row: Mapping[str, Any]) -> str:
    parts = [f"{k} {row[k]}" for k in ("policy", "page_size") if k in row]
    rate = row.get("rate_req_s")
    if isinstance(rate, (int, float)) and math.isfinite(rate):
        parts.append(f"{rate:.3g} req/s")
    return ", ".join(parts)


def overload_warning(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """One line naming the overloaded runs and why (the first one's reasons), with the way
    out; None when every run is servable."""
    rows = list(rows)
    over = [r for r in rows if is_overloaded(r)]
    if not over:
        return None
    reason = str(over[0].get("overload_reason") or "")
    which = _where(over[0]) if len(rows) == 1 else (
        f"{len(over)} of {len(rows)} runs, e.g. {_where(over[0])}")
    return (f"warning: overloaded ({which}): {reason}; the GPU cannot keep up, so latency and "
            "hit rates measure the queue - `kvsim capacity` (same options) finds the highest "
            "sustainable rate")


def _verdict(p: Any) -> str:
    """A probe's verdict: servable, overloaded (the queue grows), or servable but missing the
    SLO; both when both."""
    missed = getattr(p, "slo_met", None) is False
    if p.overloaded:
        return "overloaded and misses the SLO" if missed else "overloaded"
    return "misses the SLO" if missed else "servable"


def _amount(v: float) -> str:
    """A rate in the one number format: 1,235 and 0.4213 alike (never 0 for 0.4)."""
    from reports.interactive import fmt_number

    return fmt_number(float(v))


def capacity_lines(cap: Any) -> list[str]:
    """The capacity search's answer (experiments.answers.capacity.CapacityResult) in words."""
    lines = [f"probe {p.flag_value:.4g} ({cap.flag}): {p.rate_req_s:.4g} req/s "
             f"{_verdict(p)}" for p in cap.probes]
    if cap.multiplier is None:
        low = min(cap.probes, key=lambda p: p.flag_value)
        lines.append(f"no sustainable rate found: still {_verdict(low)} at {cap.flag} "
                     f"{low.flag_value:.4g} ({low.rate_req_s:.4g} req/s)")
        return lines
    slo = getattr(cap, "slo", None)
    what = f"goodput ({slo})" if slo else "highest sustainable rate"
    binding = getattr(cap, "binding", None)
    binds = ""
    if binding:
        binds = ("; above it the GPU is overloaded" if binding == "overload"
                 else f"; above it {binding} binds")
    lines.append(f"{what}: {cap.rate_req_s:.4g} req/s = "
                 f"{_amount(cap.input_tok_s)} prompt + {_amount(cap.output_tok_s)} output "
                 f"tokens/s (use {cap.flag} {cap.flag_value:.4g}; generated "
                 f"{_amount(cap.throughput_tok_s)} tok/s){binds}")
    return lines


def probe_line(p: Any) -> str:
    """One capacity probe as it finishes (each is a whole simulation)."""
    return f"  {_verdict(p)} at {p.flag_value:.4g} ({p.rate_req_s:.4g} req/s)"


__all__ = ["capacity_lines", "is_overloaded", "overload_warning", "probe_line"]
