"""Rich tables for the memory planner's result and the page-size recommendation."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from kvcore.memory import DEFAULT_ACTIVATION_PEAK_GIB, DEFAULT_NON_TORCH_GIB
from kvcore.planner import PlanResult
from kvcore.presets import GiB
from reports.recommend import PageSizeRecommendation


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def _bytes(n: float) -> str:
    if n >= GiB:
        return _gib(n)
    if n >= 2**20:
        return f"{n / 2**20:,.2f} MiB"
    if n >= 2**10:
        return f"{n / 2**10:,.2f} KiB"
    return f"{n:,.0f} B"


def render_plan(result: PlanResult) -> Table:
    """The headline figures: inputs, budget, KV bytes, tokens and pages, page table, limits."""
    r = result
    t = Table(title=f"KV plan: {r.model} on {r.gpu} (tp={r.tp})", show_header=False)
    t.add_column("quantity", style="bold")
    t.add_column("value", justify="right")
    t.add_column("note")
    per_rank = " per GPU" if r.tp > 1 else ""
    t.add_row("GPU memory", _gib(r.gpu_mem_bytes) + per_rank, "decimal GB as the vendor quotes")
    t.add_row("budget rule", r.budget_rule, r.budget_formula)
    t.add_row("activation peak", _gib(r.activation_peak_bytes) + per_rank,
              f"input (default {DEFAULT_ACTIVATION_PEAK_GIB:g} GiB)")
    t.add_row("non-torch memory", _gib(r.non_torch_bytes) + per_rank,
              f"input (default {DEFAULT_NON_TORCH_GIB:g} GiB)")
    t.add_row("weights", _gib(r.weight_bytes), f"{_gib(r.weight_bytes_per_rank)} per GPU, "
              f"{r.weight_dtype}")
    t.add_row("KV bytes per token", f"{r.kv_bytes_per_token:,} B",
              f"{_bytes(r.kv_bytes_per_token)}; {r.kv_bytes_per_token_per_rank:,} B per GPU, "
              f"{r.kv_dtype}")
    t.add_row("KV budget", _gib(r.kv_budget_bytes), f"{_gib(r.kv_budget_bytes_per_rank)} per GPU")
    t.add_row("KV tokens", f"{r.kv_tokens:,}", f"floored to pages of {r.page_size}")
    t.add_row("KV pages", f"{r.kv_pages:,}", f"page size {r.page_size}")
    t.add_row("req_to_token", _bytes(r.req_to_token_bytes),
              f"int32 [({r.max_running_requests}+1) x {r.context_len}]")
    for c in r.concurrency:
        t.add_row(f"max requests @ {c['context_len']:,}", f"{c['max_requests']:,}",
                  f"{c['pages_per_request']:,} pages each")
    for n in r.notes:
        t.add_row("note", "", n)
    for w in r.warnings:
        t.add_row("[yellow]warning[/]", "", w)
    return t


def render_page_sizes(result: PlanResult) -> Table:
    """Per page size: pages, expected rounding and page-table entries."""
    t = Table(title="Page sizes")
    for col in ("page size", "pages", "tokens", "mean rounding (tokens)", "rounding %",
                "rounding bytes", "page-table entries / req"):
        t.add_column(col, justify="right")
    for row in result.page_sizes:
        t.add_row(str(row["page_size"]), f"{row['kv_pages']:,}", f"{row['kv_tokens']:,}",
                  f"{row['mean_internal_frag_tokens']:.1f}", f"{row['internal_frag_pct']:.2f}",
                  _bytes(row["internal_frag_bytes"]), f"{row['mean_page_table_entries']:.1f}")
    return t


def render_plan_all(result: PlanResult) -> Group:
    """Both tables, for printing with a rich Console."""
    return Group(render_plan(result), render_page_sizes(result))


def render_recommendation(rec: PageSizeRecommendation) -> Table:
    """The sweep figures behind a page-size recommendation, the chosen row marked."""
    t = Table(title=f"Recommended page size: {rec.page_size}", caption=rec.rule)
    for col in ("page size", "normalized latency (s/token)", "prefix hit rate", "within"):
        t.add_column(col, justify="right")
    for row in rec.rows:
        mark = "both" if row["latency_within"] and row["hit_within"] else (
            "latency" if row["latency_within"] else "hit" if row["hit_within"] else "-")
        style = "bold green" if row["page_size"] == rec.page_size else None
        t.add_row(str(row["page_size"]), f"{row['normalized_latency_s']:.4f}",
                  f"{row['prefix_hit_rate']:.3f}", mark, style=style)
    return t
