"""Rich tables for the terminal: the memory breakdown, the latency summary, trace statistics."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from rich.table import Table

from reports.reuse_view import REUSE_CAUSES, causes_of

BREAKDOWN_ROWS = (
    ("token states", "token_states_pct", "KV of tokens that running requests will read"),
    ("cached", "cached_pct", "finished prefixes kept for reuse (evictable)"),
    ("reserved", "reserved_pct", "held for tokens not yet written"),
    ("internal frag.", "internal_frag_pct", "slots lost inside allocations"),
    ("  over-reservation", "internal_overreserve_pct", "reserved beyond the final length"),
    ("  page rounding", "internal_rounding_pct", "last-page rounding"),
    ("external frag.", "external_frag_pct", "free but unusable holes"),
    ("free", "free_pct", "usable free memory"),
)
REUSE_ROWS = "reuse causes"  # LATENCY_ROWS' marker: reports/reuse_view.py REUSE_CAUSES
LATENCY_ROWS = (
    ("requests completed", "requests_completed", "{:,.0f}"),
    ("requests rejected", "requests_rejected", "{:,.0f}"),
    ("queue backlog", "queue_backlog", "{:,.0f}"),
    ("throughput (tok/s)", "throughput_tok_s", "{:,.1f}"),
    ("normalized latency (s/tok)", "normalized_latency_s", "{:.4f}"),
    ("TTFT p50 / p99 (s)", ("ttft_p50_s", "ttft_p99_s"), "{:.3f}"),
    ("TPOT p50 / p99 (s)", ("tpot_p50_s", "tpot_p99_s"), "{:.4f}"),
    ("ITL p50 / p99 (s)", ("itl_p50_s", "itl_p99_s"), "{:.4f}"),
    ("avg batch size", "avg_batch_size", "{:.1f}"),
    ("preemptions", "preemptions", "{:,.0f}"),
    ("prefix hit rate", "prefix_hit_rate", "{:.3f}"),
    ("reuse lost", REUSE_ROWS, "{:.2%}"),  # one row per cause, as the reuse line says them
    ("failed allocations", "failed_allocs", "{:,.0f}"),
    ("peak token states (%)", "peak_token_states_pct", "{:.1f}"),
    ("simulation wall time (s)", "sim_wall_s", "{:.2f}"),
)


def _fmt(fmt: str, v: Any) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return "-" if math.isnan(f) else fmt.format(f)


def breakdown_table(rows: Iterable[Mapping[str, Any]], label_key: str = "policy",
                    title: str = "KV memory breakdown (% of capacity, time-weighted)") -> Table:
    rows = list(rows)
    t = Table(title=title)
    t.add_column("part", style="bold")
    for r in rows:
        t.add_column(str(r.get(label_key, "")), justify="right")
    if len(rows) == 1:
        t.add_column("meaning", style="dim")
    for name, key, meaning in BREAKDOWN_ROWS:
        cells = [_fmt("{:.2f}", r.get(key)) for r in rows]
        t.add_row(name, *cells, *([meaning] if len(rows) == 1 else []))
    return t


def latency_table(rows: Iterable[Mapping[str, Any]], label_key: str = "policy",
                  title: str = "Latency and throughput") -> Table:
    rows = list(rows)
    t = Table(title=title)
    t.add_column("metric", style="bold")
    for r in rows:
        t.add_column(str(r.get(label_key, "")), justify="right")
    for name, key, fmt in LATENCY_ROWS:
        if key == REUSE_ROWS:  # the causes any row has, each read from its own column
            causes = {c: w for r in rows for w, c in causes_of(r)}
            for w, c in REUSE_CAUSES:
                if c in causes:
                    t.add_row(f"{name} to {w.split(' (')[0]}", *[_fmt(fmt, r.get(c))
                                                              for r in rows])
            continue
        if isinstance(key, tuple):
            cells = [" / ".join(_fmt(fmt, r.get(k)) for k in key) for r in rows]
        else:
            cells = [_fmt(fmt, r.get(key)) for r in rows]
        t.add_row(name, *cells)
    return t


def run_header(row: Mapping[str, Any]) -> str:
    return (f"{row.get('workload')} | policy {row.get('policy')} | page {row.get('page_size')}"
            f" | {row.get('model')} on {row.get('tp')} x {row.get('gpu')} | KV "
            f"{int(row.get('kv_tokens', 0)):,} slots ({row.get('memory_rule')}) | "
            f"seed {row.get('seed')}{latency_label(row)}")


def latency_label(row: Mapping[str, Any]) -> str:
    """' | latency PROFILE, BACKEND' (and that the page size is memory-only where the kernel
    walks page 1), or '' for a row without a roofline profile."""
    profile = row.get("latency_profile")
    if not isinstance(profile, str) or not profile:
        return ""
    text = f" | latency {profile}, {row.get('attention_backend')}"
    kernel, page = row.get("kernel_page_size"), row.get("page_size")
    if kernel is not None and page is not None and int(kernel) != int(page):
        text += f" (kernel page {int(kernel)}: the page size is memory-only)"
    return text


def trace_stats_table(s: Mapping[str, Any]) -> Table:
    """Length percentiles of a `workloads.trace_stats` result."""
    t = Table(title=f"trace {s['name']}: {s['rows']:,} requests, {s['sessions']} sessions")
    cols = ("mean", "p50", "p90", "p99", "min", "max")
    for col in ("", *cols):
        t.add_column(col, justify="right")
    for key in ("input", "output"):
        t.add_row(key, *(f"{s[key][k]:,.1f}" for k in cols))
    return t


def trace_stats_lines(s: Mapping[str, Any]) -> list[str]:
    """The rest of a `workloads.trace_stats` result, one line each."""
    rate = f"{s['rate']:.3f} req/s" if s["rate"] else "-"
    lines = [f"duration {s['duration_s']:,.1f} s, rate {rate}, tokens in "
             f"{s['input_tokens']:,} / out {s['output_tokens']:,}",
             f"ideal prefix reuse at page size {s['page_size']}: {s['ideal_reuse']:.4f} "
             f"({s['ideal_hit_tokens']:,} tokens)"]
    if s["bad_rows"] or s["failed_rows"]:
        lines.append(f"bad rows skipped: {s['bad_rows']}, failed: {s['failed_rows']}")
    return lines
