"""Deltas of summary rows against a baseline: "what do I lose with this policy?".

`kvsim compare` shows them against its first (or `--baseline`) policy and `kvsim diff` between
two saved results directories, so both use the same metrics, signs and words. A delta is
`value - baseline` in the metric's own unit, and relative to the baseline in percent; each
metric says which direction is better, so the table can say "worse" rather than leave the sign
of a latency delta to the reader.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

# (label, column, format, better): the metrics a user weighs policies by
DELTA_METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("throughput (tok/s)", "throughput_tok_s", "{:,.1f}", "higher"),
    ("normalized latency (s/tok)", "normalized_latency_s", "{:.4f}", "lower"),
    ("TTFT p50 (s)", "ttft_p50_s", "{:.3f}", "lower"),
    ("TTFT p99 (s)", "ttft_p99_s", "{:.3f}", "lower"),
    ("TPOT p99 (s)", "tpot_p99_s", "{:.4f}", "lower"),
    ("prefix hit rate", "prefix_hit_rate", "{:.3f}", "higher"),
    ("token states (%)", "token_states_pct", "{:.2f}", "higher"),
    ("internal frag. (%)", "internal_frag_pct", "{:.2f}", "lower"),
    ("external frag. (%)", "external_frag_pct", "{:.2f}", "lower"),
    ("avg batch size", "avg_batch_size", "{:.1f}", "higher"),
    ("preemptions", "preemptions", "{:,.0f}", "lower"),
    ("requests completed", "requests_completed", "{:,.0f}", "higher"),
)


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def delta(value: Any, base: Any) -> tuple[float, float]:
    """(value - base, the same in percent of base; NaN where base is 0 or missing)."""
    v, b = _num(value), _num(base)
    d = v - b
    rel = d / abs(b) * 100.0 if b and math.isfinite(b) else math.nan
    return d, rel


def verdict(d: float, better: str) -> str:
    """'better' / 'worse' / 'same' for a delta of a metric whose `better` direction is given."""
    if not math.isfinite(d) or d == 0:
        return "same" if d == 0 else ""
    return "better" if (d > 0) == (better == "higher") else "worse"


def delta_records(rows: Sequence[Mapping[str, Any]], labels: Sequence[str],
                  baseline: int = 0) -> list[dict[str, Any]]:
    """Long-form deltas of every row against `rows[baseline]`: label, metric, value,
    baseline, delta, delta_pct, verdict (the CSV of a comparison)."""
    base = rows[baseline]
    out = []
    for label, row in zip(labels, rows, strict=True):
        for _label, col, _, better in DELTA_METRICS:
            if col not in row and col not in base:
                continue
            d, rel = delta(row.get(col), base.get(col))
            out.append({"label": label, "metric": col, "value": _num(row.get(col)),
                        "baseline": _num(base.get(col)), "delta": d, "delta_pct": rel,
                        "verdict": verdict(d, better)})
    return out


def _cell(fmt: str, v: float, d: float, rel: float, better: str) -> str:
    if not math.isfinite(v):
        return "-"
    text = fmt.format(v)
    if not math.isfinite(d) or d == 0:
        return text
    sign = "+" if d > 0 else "-"
    pct = f", {rel:+.0f}%" if math.isfinite(rel) else ""
    mark = {"better": "[green]", "worse": "[red]"}.get(verdict(d, better), "[dim]")
    return f"{text} {mark}({sign}{fmt.format(abs(d))}{pct})[/]"


def delta_table(rows: Sequence[Mapping[str, Any]], labels: Sequence[str], baseline: int = 0,
                title: str | None = None) -> Table:
    """Metrics down, runs across; every run but the baseline shows its delta in brackets,
    green when better and red when worse."""
    t = Table(title=title or f"Deltas against {labels[baseline]}")
    t.add_column("metric")
    for i, label in enumerate(labels):
        t.add_column(f"{label} (baseline)" if i == baseline else label, justify="right")
    base = rows[baseline]
    for name, col, fmt, better in DELTA_METRICS:
        if all(col not in r for r in rows):
            continue
        cells = []
        for i, row in enumerate(rows):
            d, rel = delta(row.get(col), base.get(col))
            v = _num(row.get(col))
            cells.append(fmt.format(v) if i == baseline and math.isfinite(v) else
                         "-" if i == baseline else _cell(fmt, v, d, rel, better))
        t.add_row(name, *cells)
    return t


def baseline_index(labels: Sequence[str], baseline: str | None, flag: str = "--baseline") -> int:
    """The position of `baseline` in `labels` (the first when None); a name not among them is
    a user error naming the flag."""
    if baseline is None:
        return 0
    if baseline not in labels:
        raise ValueError(f"{flag} {baseline!r} is not one of the compared runs: "
                         f"{', '.join(labels)}")
    return list(labels).index(baseline)


__all__ = ["DELTA_METRICS", "baseline_index", "delta", "delta_records", "delta_table",
           "verdict"]
