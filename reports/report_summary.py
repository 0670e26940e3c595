"""The lines a report opens with: the best page size per policy and why, overloaded cells, the
figures left out; and the results table in friendly column names and one number format.

A reader of a sweep wants the answer before the evidence, so the report leads with what the
rows say (the page-size recommendation, applied to each policy's rows) and keeps the table to
the columns that answer "which page size, at what cost". The recommendation is decided above
reports (experiments/answers/recommend.py): the caller passes its rule in, `PageSizeRule`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from reports.interactive import fmt_number
from reports.series import label, ordered, overloaded_mask, series_keys, truthy, with_axis_values

# summary column -> table heading, in table order (columns absent from a summary are skipped)
FRIENDLY: dict[str, str] = {
    "policy": "policy", "page_size": "page size", "placement": "placement",
    "workload": "workload", "rate": "rate (req/s)", "kv_tokens": "pool (slots)",
    "seed": "seed", "overloaded": "overloaded",
    "token_states_pct": "token states %", "internal_frag_pct": "internal frag. %",
    "external_frag_pct": "external frag. %", "prefix_hit_rate": "hit rate",
    "throughput_tok_s": "throughput (tok/s)", "normalized_latency_s": "latency (s/tok)",
    "ttft_p99_s": "TTFT p99 (s)", "tpot_p99_s": "TPOT p99 (s)",
    "requests_completed": "completed", "queue_backlog": "queued at end",
    "preemptions": "preemptions",
}
IDENTITY = ("policy", "page_size", "placement", "workload", "rate", "kv_tokens", "seed")
#: a policy's servable rows -> the sentence recommending a page size from them, or none, and why
PageSizeRule = Callable[[pd.DataFrame], str]


def _reason(row: pd.Series) -> str:
    for col in row.index:
        if col.startswith("overload") and col != "overloaded" and pd.notna(row[col]) \
                and str(row[col]).strip():
            return f": {row[col]}"
    return ""


def best_page_sizes(df: pd.DataFrame, recommend: PageSizeRule,
                    axes: Mapping[str, Sequence[Any]] | None = None) -> list[str]:
    """One line per policy (and other swept axis): the recommendation's own sentence
    (`recommend`: the same rule and words as `kvsim plan`), from the rows that are not
    overloaded."""
    if "page_size" not in df.columns or df["page_size"].nunique() < 2:
        return []
    df = ordered(df, axes)
    keys = series_keys(df, "page_size", axes)
    lines = []
    over = overloaded_mask(df)
    for _key, g in df.groupby(keys, sort=False) if keys else [((), df)]:
        name = label(g.iloc[0], keys)
        ok = g[~over.loc[g.index]]
        if ok.empty:
            lines.append(f"**{name}**: no page size recommended, every run is overloaded")
            continue
        skipped = len(g) - len(ok)
        note = f"; {skipped} overloaded run(s) left out" if skipped else ""
        lines.append(f"**{name}**: {recommend(ok)}{note}")
    return lines


def summary_lines(df: pd.DataFrame, axes: Mapping[str, Sequence[Any]] | None,
                  left_out: Mapping[str, str],
                  off_scale: Mapping[str, Sequence[str]] | None = None, *,
                  recommend: PageSizeRule) -> list[str]:
    """The report's opening bullets (Markdown); `off_scale`: figure -> the overloaded points
    it marked at an axis edge instead of letting them set the range (reports.offscale)."""
    named = with_axis_values(df, axes)
    lines = best_page_sizes(named, recommend, axes)
    over = overloaded_mask(named)
    if "overloaded" in named.columns:
        if over.any():
            keys = ["policy", *[k for k in ("page_size", *series_keys(named, None, axes))
                                if k != "policy" and k in named.columns]]
            keys = list(dict.fromkeys(keys))
            cells = [label(r, keys) + _reason(r) for _, r in ordered(named[over], axes)
                     .iterrows()]
            lines.append(f"**overloaded** ({len(cells)} of {len(named)} runs; their latency "
                         f"is the backlog, not the page size): " + "; ".join(cells))
            lines.append("the figures draw overloaded points hollow and take their axis "
                         "ranges from the servable runs")
        else:
            lines.append("no run is overloaded")
    for fig, points in (off_scale or {}).items():
        if points:
            lines.append(f"figure {fig}: off-scale (overloaded, an arrow at the axis edge): "
                         + "; ".join(points))
    for fig, why in left_out.items():
        lines.append(f"figure {fig} left out: {why}")
    return lines or [f"{len(df)} run(s); one page size, so no page-size recommendation"]


def table(df: pd.DataFrame, axes: Mapping[str, Sequence[Any]] | None = None
          ) -> tuple[list[str], list[list[str]]]:
    """The results table: identity columns that vary (policy always), then the metrics, in
    friendly names, rows by policy then page size, every number in one format."""
    df = ordered(with_axis_values(df, axes), axes)
    cols = [c for c in FRIENDLY if c in df.columns
            and (c not in IDENTITY or c == "policy" or df[c].astype(str).nunique() > 1)]
    rows = [[fmt_number(v) if c != "overloaded" else ("yes" if truthy(v) else "no")
             for c, v in zip(cols, r, strict=True)]
            for r in df[cols].itertuples(index=False)]
    return [FRIENDLY[c] for c in cols], rows


__all__ = ["FRIENDLY", "PageSizeRule", "best_page_sizes", "overloaded_mask", "summary_lines",
           "table"]
