"""A one-page Markdown and HTML report from a results directory (no re-simulation).

The HTML embeds its figures (base64 PNG), so it is one self-contained file to share.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from reports.io import atomic_write_text, read_csv_or_empty
from reports.plots import plot_dir

KEY_COLUMNS = (
    "policy", "placement", "page_size", "workload", "rate_req_s", "kv_tokens", "seed",
    "token_states_pct", "cached_pct", "reserved_pct", "internal_frag_pct",
    "external_frag_pct", "free_pct", "prefix_hit_rate", "throughput_tok_s",
    "normalized_latency_s", "ttft_p99_s", "tpot_p99_s", "requests_completed",
    "requests_rejected", "preemptions",
)  # fmt: skip
CAPTIONS = {
    "breakdown.png": "Where KV memory went, per run (time-weighted % of capacity).",
    "internal_frag_pct_vs_page_size.png": "Internal fragmentation against page size.",
    "token_states_pct_vs_page_size.png": "Share of KV holding live token states.",
    "prefix_hit_rate_vs_page_size.png": "Prefix hit rate against page size.",
    "normalized_latency_s_vs_page_size.png": "Normalized latency against page size.",
    "throughput_tok_s_vs_page_size.png": "Throughput against page size.",
    "latency_vs_rate.png": "Normalized latency against request rate.",
    "memory_timeline.png": "The memory breakdown over simulated time.",
    "latency_cdf.png": "TTFT and TPOT distributions.",
}


def _cell(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def _table(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    cols = [c for c in KEY_COLUMNS if c in df.columns]
    varying = [c for c in cols[:7] if df[c].astype(str).nunique() > 1]
    show = [c for c in cols if c not in cols[:7] or c in varying or c == "policy"]
    return show, [[_cell(v) for v in row] for row in df[show].itertuples(index=False)]


def _facts(d: Path, df: pd.DataFrame) -> list[tuple[str, str]]:
    cfg_path = d / "config.json"
    facts = []
    if cfg_path.exists():
        cfg = json.loads(cfg_path.read_text())
        facts.append(("command", f"kvsim {cfg.get('command', '?')}"))
        axes = cfg.get("axes")
        if axes:
            facts.append(("grid", "; ".join(f"{k} = {v}" for k, v in axes.items())))
    for key in ("workload", "model", "gpu", "tp", "kv_tokens", "memory_rule", "admission",
                "schedule", "latency"):
        if key in df.columns:
            vals = sorted({str(v) for v in df[key]})
            facts.append((key, ", ".join(vals) if len(vals) <= 6 else f"{len(vals)} values"))
    facts.append(("runs", str(len(df))))
    return facts


def build_report(results: str | Path, **plot_kw) -> tuple[Path, Path]:
    """Draw the figures into DIR/figures and write DIR/report.md and DIR/report.html."""
    d = Path(results)
    df = read_csv_or_empty(d / "summary.csv")
    if df.empty:
        raise ValueError(f"DIR {str(d)!r} has no summary.csv with rows (expected the --out "
                         "directory of kvsim run / sweep / compare)")
    figs = plot_dir(d, d / "figures", **plot_kw)
    facts = _facts(d, df)
    cols, rows = _table(df)
    title = f"kvsim report: {d.name}"
    md = [f"# {title}", ""]
    md += [f"- **{k}**: {v}" for k, v in facts]
    md += ["", "## Results", "", "| " + " | ".join(cols) + " |",
           "|" + "|".join("---" for _ in cols) + "|"]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", "Breakdown columns are time-weighted % of KV capacity and add up to 100.", "",
           "## Figures", ""]
    for f in figs:
        md += [f"![{f.stem}](figures/{f.name})", "", f"*{CAPTIONS.get(f.name, f.stem)}*", ""]
    md_path = atomic_write_text(d / "report.md", "\n".join(md) + "\n")

    h = ["<!doctype html><html><head><meta charset='utf-8'>",
         f"<title>{html.escape(title)}</title><style>",
         "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}",
         "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;",
         "padding:2px 6px;text-align:right}th{background:#f3f3f3}",
         "figure{display:inline-block;margin:8px}img{max-width:520px}</style></head><body>",
         f"<h1>{html.escape(title)}</h1><ul>"]
    h += [f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in facts]
    h += ["</ul><h2>Results</h2><table><tr>"]
    h += [f"<th>{html.escape(c)}</th>" for c in cols]
    h += ["</tr>"]
    for r in rows:
        h += ["<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>"]
    h += ["</table><p>Breakdown columns are time-weighted % of KV capacity.</p>",
          "<h2>Figures</h2>"]
    for f in figs:
        b64 = base64.b64encode(f.read_bytes()).decode("ascii")
        h += [f"<figure><img alt='{html.escape(f.stem)}' src='data:image/png;base64,{b64}'>",
              f"<figcaption>{html.escape(CAPTIONS.get(f.name, f.stem))}</figcaption></figure>"]
    h += ["</body></html>"]
    html_path = atomic_write_text(d / "report.html", "\n".join(h) + "\n")
    return md_path, html_path
