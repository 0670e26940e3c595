"""Deltas of summary rows against a baseline: "what do I lose with this policy?".

`kvsim compare` shows them against its first (or `--baseline`) policy and `kvsim diff` between
two saved results directories, so both use the same metrics, signs and words. A delta is
`value - baseline` in the metric's own unit, and relative to the baseline in percent; each
metric says which direction is better, so the table can say "worse" rather than leave the sign
of a latency delta to the reader.

Two guards keep the words honest:

* **better / worse only at the same offered load**: a run fed more requests per second shows
  more throughput whether or not it serves them better (an overloaded run's throughput is its
  offered load); when the two rows' `rate_req_s` differ by more than `SAME_LOAD` (1 %) the
  deltas are shown without a verdict and `load_note` says why;
* **percent only of a base that is not near zero**: a delta is also shown in percent only when
  the base is at least `NEAR_ZERO` (1 %) of the larger of the two values; otherwise (a hit
  rate of 0.00001 against 0.02 reads "+189754 %") only the absolute delta is shown.
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


SAME_LOAD = 0.01
NEAR_ZERO = 0.01


def same_load(row: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    """Both rows were offered the same arrival rate (within SAME_LOAD; True when a row has no
    rate to compare)."""
    r, b = _num(row.get("rate_req_s")), _num(base.get("rate_req_s"))
    if not (math.isfinite(r) and math.isfinite(b)):
        return True
    return abs(r - b) <= SAME_LOAD * max(abs(r), abs(b))


def load_note(rows: Sequence[Mapping[str, Any]], labels: Sequence[str],
              baseline: int = 0) -> str | None:
    """One sentence when some row was offered another load than the baseline (None if not)."""
    base = rows[baseline]
    other = [f"{lab} ({_num(r.get('rate_req_s')):.4g} req/s)" for lab, r in
             zip(labels, rows, strict=True) if not same_load(r, base)]
    if not other:
        return None
    return (f"not better or worse: {', '.join(other)} ran at another offered load than "
            f"{labels[baseline]} ({_num(base.get('rate_req_s')):.4g} req/s), so their deltas "
            "reflect the load as much as the configuration")


#: policies whose admission reserves more than a request holds, so the pool caps how many run at
#: once (kvcore/contiguous/policy.py: the contiguous baselines of the vLLM paper, s. 6), and
#: what each reserves
CAPPED_ADMISSION = {"contiguous-max": "each request's maximum context",
                    "contiguous-pow2": "each prompt plus the next power of two of its output"}


def admission_notes(rows: Sequence[Mapping[str, Any]], labels: Sequence[str],
                    baseline: int = 0) -> list[str]:
    """A line per compared policy whose admission capped the batch: its lower latency comes
    from running fewer requests at once, not from a better allocator. Only where the cap
    showed (a smaller average batch than the baseline's): a reservation the pool could afford
    for every request capped nothing, and saying so would blame the wrong cause."""
    base = rows[baseline]
    out = []
    for label, row in zip(labels, rows, strict=True):
        what = CAPPED_ADMISSION.get(str(row.get("policy", "")))
        if what is None or row is base:
            continue
        batch, base_batch = _num(row.get("avg_batch_size")), _num(base.get("avg_batch_size"))
        if not batch < base_batch:
            continue
        out.append(f"{label}: admission reserves {what}, so the pool caps the batch (avg "
                   f"{batch:.1f} vs {base_batch:.1f} for {labels[baseline]}); a lower latency "
                   "there means fewer requests ran at once, with more of them queued")
    return out


def as_number(v: Any) -> float:
    """A summary cell as a float (NaN for a missing or non-numeric one)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


_num = as_number


def delta(value: Any, base: Any) -> tuple[float, float]:
    """(value - base, the same in percent of base; NaN where base is 0 or missing)."""
    v, b = _num(value), _num(base)
    d = v - b
    big = max(abs(v), abs(b)) if math.isfinite(v) else abs(b)
    rel = (d / abs(b) * 100.0 if b and math.isfinite(b) and abs(b) >= NEAR_ZERO * big
           else math.nan)
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
        comparable = same_load(row, base)
        for _label, col, _, better in DELTA_METRICS:
            if col not in row and col not in base:
                continue
            d, rel = delta(row.get(col), base.get(col))
            out.append({"label": label, "metric": col, "value": _num(row.get(col)),
                        "baseline": _num(base.get(col)), "delta": d, "delta_pct": rel,
                        "verdict": verdict(d, better) if comparable else "other load"})
    return out


def _cell(fmt: str, v: float, d: float, rel: float, better: str, judge: bool = True) -> str:
    if not math.isfinite(v):
        return "-"
    text = fmt.format(v)
    if not math.isfinite(d) or d == 0:
        return text
    sign = "+" if d > 0 else "-"
    pct = f", {rel:+.0f}%" if math.isfinite(rel) else ""
    mark = ({"better": "[green]", "worse": "[red]"}.get(verdict(d, better), "[dim]") if judge
            else "[dim]")
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
                         "-" if i == baseline else
                         _cell(fmt, v, d, rel, better, same_load(row, base)))
        t.add_row(name, *cells)
    note = load_note(rows, labels, baseline)
    if note is not None:
        t.caption = note
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


__all__ = [
    "CAPPED_ADMISSION",
    "DELTA_METRICS",
    "NEAR_ZERO",
    "SAME_LOAD",
    "admission_notes",
    "baseline_index",
    "delta",
    "delta_records",
    "delta_table",
    "load_note",
    "same_load",
    "verdict",
]
