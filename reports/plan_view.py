"""Rich tables for the memory planner's result and the page-size recommendation.

The recommendation is decided above reports (experiments/answers/recommend.py); the table
reads the record it returns, whose fields `Recommendation` names.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from rich.console import Group
from rich.table import Table

from kvcore.model.memory import DEFAULT_ACTIVATION_PEAK_GIB, DEFAULT_NON_TORCH_GIB
from kvcore.model.planner import PlanResult
from kvcore.model.presets import GiB
from reports.reuse_view import HYBRID_CAUSES, REUSE_CAUSES


class Recommendation(Protocol):
    """What the table reads of a page-size recommendation (`PageSizeRecommendation`)."""

    @property
    def page_size(self) -> int | None: ...
    @property
    def reason(self) -> str: ...
    @property
    def best_latency_s(self) -> float: ...
    @property
    def rows(self) -> list[dict[str, Any]]: ...


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
    t.add_row("GPU memory", _gib(r.gpu_mem_bytes) + per_rank,
              "total the device reports to CUDA (sources: kvsim gpus)")
    t.add_row("budget rule", r.budget_rule, r.budget_formula)
    t.add_row("activation peak", _gib(r.activation_peak_bytes) + per_rank,
              f"input (default {DEFAULT_ACTIVATION_PEAK_GIB:g} GiB)")
    t.add_row("non-torch memory", _gib(r.non_torch_bytes) + per_rank,
              f"input (default {DEFAULT_NON_TORCH_GIB:g} GiB)")
    if r.weights_unknown:
        t.add_row("weights", "unknown", r.weights_unknown)
    else:
        t.add_row("weights", _gib(r.weight_bytes), f"{_gib(r.weight_bytes_per_rank)} per "
                  f"GPU, {r.weight_dtype}")
    h = r.hybrid
    full = " (all full)" if h is not None else ""  # a hybrid's baseline figures say so
    if h is not None:
        t.add_row("attention KV per token", f"{r.attention_kv_bytes_per_token:,} B",
                  f"per GPU, {r.kv_dtype}; the attention layers only")
        t.add_row("state per request", _bytes(r.state_bytes_per_request),
                  "per GPU; Mamba / linear-attention layers, the engine's state dtypes")
    t.add_row(f"KV bytes per token{full}", f"{r.kv_bytes_per_token:,} B",
              f"{_bytes(r.kv_bytes_per_token)}; {r.kv_bytes_per_token_per_rank:,} B per GPU, "
              f"{r.kv_dtype}")
    t.add_row("KV budget", _gib(r.kv_budget_bytes), f"{_gib(r.kv_budget_bytes_per_rank)} per GPU")
    if h is not None:
        t.add_row("KV tokens", f"{h.kv_cache_tokens:,}",
                  f"the engine's figure ({_engine_label(h)}; its layout below)")
    t.add_row(f"KV tokens{full}", f"{r.kv_tokens:,}", f"floored to pages of {r.page_size}")
    t.add_row(f"KV pages{full}", f"{r.kv_pages:,}", f"page size {r.page_size}")
    t.add_row("req_to_token", _bytes(r.req_to_token_bytes),
              f"int32 [({r.max_running_requests}+1) x {r.context_len}]")
    for c in r.concurrency:
        t.add_row(f"max requests @ {c['context_len']:,}{full}", f"{c['max_requests']:,}",
                  f"{c['pages_per_request']:,} pages each")
    for n in r.notes:
        t.add_row("note", "", n)
    for w in r.warnings:
        t.add_row("[yellow]warning[/]", "", w)
    return t


def _engine_label(h) -> str:
    """Which engine and rules a hybrid plan's figures follow."""
    if h.engine == "vllm":
        caching = "on" if h.prefix_caching else "off"
        return (f"vLLM v{h.vllm_version} rules, prefix caching {caching}, mamba cache mode "
                f"{h.mamba_cache_mode}; one pool of {h.num_blocks:,} blocks of "
                f"{h.block_bytes:,} B shared by every group")
    return "SGLang v0.5 pools"


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


def render_hybrid(result: PlanResult) -> Table | None:
    """A hybrid model's pools as the engine lays them out, its start-up lines, and the
    full-attention baseline; None for a full-attention model."""
    h = result.hybrid
    if h is None:
        return None
    t = Table(title=f"{h.engine} layout of {result.model}: {result.layer_mix}",
              caption="\n".join([*h.log, _engine_label(h)]))
    for col in ("pool", "layers", "page bytes (1 layer)", "pages / slots", "tokens", "note"):
        t.add_column(col, justify="left" if col in ("pool", "note") else "right")
    for p in h.pools:
        t.add_row(p.kind, str(p.layers), f"{p.page_bytes:,}", f"{p.pages:,}",
                  f"{p.tokens:,}" if p.tokens else "-", p.note)
    t.add_row("[bold]engine[/]", "", f"block {h.block_size}", "",
              f"{h.kv_cache_tokens:,}",
              f"max concurrency {h.max_concurrency:.2f}x @ {h.context_len:,} tokens"
              + (f"; running cap {h.running_request_cap:,}"
                 if h.running_request_cap is not None else ""))
    t.add_row("[bold]all as full attention[/]", "", "", "", f"{h.baseline_tokens:,}",
              f"max concurrency {h.baseline_max_concurrency:.2f}x (pre-hybrid baseline)")
    return t


def render_plan_all(result: PlanResult) -> Group:
    """Both tables (and a hybrid's layout), for printing with a rich Console."""
    hybrid = render_hybrid(result)
    parts = [render_plan(result)] + ([hybrid] if hybrid is not None else [])
    return Group(*parts, render_page_sizes(result))


def _pct(v: object) -> str:
    return f"{v:.1%}" if isinstance(v, float) and math.isfinite(v) else "-"


def _vs_best(row: dict, best: float) -> str:
    """A candidate's latency against the best, with the band it had to be within."""
    if row["fails"] == ["servable"] or not math.isfinite(best) or best <= 0:
        return "-"
    gap = (row["normalized_latency_s"] - best) / best
    return f"{gap:+.1%} / {row['latency_margin_s'] / best:.1%}"


def render_recommendation(rec: Recommendation) -> Table:
    """The sweep figures behind a page-size recommendation: per page size its latency and how
    far from the best against its band, its hit rate next to the ideal and where the gap went,
    and the rules it fails; the chosen row marked, the reason (or why nothing is recommended)
    as the caption."""
    title = (f"Recommended page size: {rec.page_size}" if rec.page_size is not None
             else "No page size recommended")
    t = Table(title=title, caption=f"{rec.reason}.")
    # the reuse line's causes (reports/reuse_view.py), the hybrid ones where the rows have them
    causes = [c for _, c in REUSE_CAUSES if any(c in r for r in rec.rows)
              or c not in HYBRID_CAUSES]
    short = {"reuse_gap_alignment": "align", "reuse_gap_not_arrived": "not arrived",
             "reuse_gap_window": "window", "reuse_gap_state": "state boundary",
             "reuse_gap_capacity": "capacity"}
    cols = ["page", "latency s/tok", "vs best / band", "hit", "ideal",
            *(f"lost: {short[c]}" for c in causes), "verdict"]
    for col in cols:
        t.add_column(col, justify="right" if col != "verdict" else "left")
    for row in rec.rows:
        verdict = "ok" if not row["fails"] else "fails " + ", ".join(row["fails"])
        style = "bold green" if row["page_size"] == rec.page_size else (
            "red" if row["overloaded"] else None)
        t.add_row(str(row["page_size"]), f"{row['normalized_latency_s']:.4f}",
                  _vs_best(row, rec.best_latency_s),
                  _pct(row["prefix_hit_rate"]), _pct(row.get("ideal_hit_rate")),
                  *(_pct(row.get(c)) for c in causes), verdict, style=style)
    return t
