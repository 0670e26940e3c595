"""A one-page Markdown and HTML report from a results directory (no re-simulation).

It opens with its summary (reports.report_summary: the best page size per policy and why,
overloaded runs, figures left out), then the facts of the run, the results table and the
figures. The HTML embeds its figures (base64 PNG), so it is one self-contained file to share;
both link the interactive page written beside the PNGs.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import pandas as pd

from reports.fleet_view import CAPTIONS as FLEET_CAPTIONS
from reports.fleet_view import report_section as fleet_section
from reports.io import atomic_write_text, check_writable, read_csv_or_empty
from reports.plots import left_out, plot_dir, saved_axes
from reports.pool_view import HEADER as POOL_HEADER
from reports.pool_view import pool_rows
from reports.report_summary import PageSizeRule, summary_lines, table

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
    **FLEET_CAPTIONS,
}


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
                "schedule", "latency", "latency_profile", "attention_backend",
                "kernel_page_size"):
        if key in df.columns:
            vals = sorted({str(v) for v in df[key]})
            facts.append((key, ", ".join(vals) if len(vals) <= 6 else f"{len(vals)} values"))
    facts.append(("runs", str(len(df))))
    return facts


def _md_inline(text: str) -> str:
    """Markdown bold (**x**) as HTML, the rest escaped."""
    parts = html.escape(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def build_report(results: str | Path, *, recommend: PageSizeRule,
                 **plot_kw) -> tuple[Path, Path]:
    """Draw the figures into DIR/figures and write DIR/report.md and DIR/report.html;
    `recommend` is the page-size rule the summary applies to each policy's rows."""
    d = Path(results)
    df = read_csv_or_empty(d / "summary.csv")
    if df.empty:
        raise ValueError(f"DIR {str(d)!r} has no summary.csv with rows (expected the --out "
                         "directory of kvsim run / sweep / compare)")
    check_writable(d, "DIR")  # report.md / .html and the figures go there
    axes = saved_axes(d)
    off_scale: dict[str, list[str]] = {}
    written = plot_dir(d, d / "figures", axes=axes, off_scale=off_scale, **plot_kw)
    figs = [f for f in written if f.suffix == ".png"]
    page = next((f for f in written if f.suffix == ".html"), None)
    summary = summary_lines(df, axes, left_out(df), off_scale, recommend=recommend)
    facts = _facts(d, df)
    cols, rows = table(df, axes)
    title = f"kvsim report: {d.name}"
    md = [f"# {title}", "", "## Summary", ""]
    md += [f"- {line}" for line in summary]
    md += ["", "## Setup", ""]
    md += [f"- **{k}**: {v}" for k, v in facts]
    md += ["", "## Results", "", "| " + " | ".join(cols) + " |",
           "|" + "|".join("---" for _ in cols) + "|"]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", "Breakdown columns are time-weighted % of KV capacity; the full rows are in "
           "summary.csv.", ""]
    pools = pool_rows(df.to_dict("records"))  # hybrid runs only
    if pools:
        md += ["## Pools per layer kind", "", "| " + " | ".join(POOL_HEADER) + " |",
               "|" + "|".join("---" for _ in POOL_HEADER) + "|"]
        md += ["| " + " | ".join(p) + " |" for p in pools] + [""]
    fleet_cols, fleet_rows, fleet_warnings = fleet_section(d, df)  # fleet runs only
    if fleet_rows:
        md += ["## Fleet", "", "| " + " | ".join(fleet_cols) + " |",
               "|" + "|".join("---" for _ in fleet_cols) + "|"]
        md += ["| " + " | ".join(r) + " |" for r in fleet_rows] + [""]
        md += [f"- {w}" for w in fleet_warnings] + ([""] if fleet_warnings else [])
    md += ["## Figures", ""]
    if page is not None:
        md += [f"Interactive version (hover values, toggle policies): "
               f"[figures/{page.name}](figures/{page.name})", ""]
    for f in figs:
        md += [f"![{f.stem}](figures/{f.name})", "", f"*{CAPTIONS.get(f.name, f.stem)}*", ""]
    md_path = atomic_write_text(d / "report.md", "\n".join(md) + "\n")

    h = ["<!doctype html><html><head><meta charset='utf-8'>",
         f"<title>{html.escape(title)}</title><style>",
         "body{font-family:sans-serif;max-width:1400px;margin:2em auto;color:#222}",
         ".wide{overflow-x:auto;max-width:100%}",
         "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;",
         "padding:2px 6px;text-align:right}th{background:#f3f3f3}",
         # each figure at the size it was drawn (its 8 pt legend readable), shrunk only to
         # the page's width: a fixed cap scaled a wide breakdown to half size
         "figure{display:inline-block;margin:8px;max-width:100%}",
         "img{max-width:100%;height:auto}</style></head><body>",
         f"<h1>{html.escape(title)}</h1><h2>Summary</h2><ul>"]
    h += [f"<li>{_md_inline(line)}</li>" for line in summary]
    h += ["</ul><h2>Setup</h2><ul>"]
    h += [f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in facts]
    h += ["</ul><h2>Results</h2><div class='wide'><table><tr>"]
    h += [f"<th>{html.escape(c)}</th>" for c in cols]
    h += ["</tr>"]
    for r in rows:
        h += ["<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>"]
    h += ["</table></div><p>Breakdown columns are time-weighted % of KV capacity; the full "
          "rows are in summary.csv.</p>"]
    if pools:
        h += ["<h2>Pools per layer kind</h2><table><tr>"]
        h += [f"<th>{html.escape(c)}</th>" for c in POOL_HEADER] + ["</tr>"]
        h += ["<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in p) + "</tr>"
              for p in pools]
        h += ["</table>"]
    if fleet_rows:
        h += ["<h2>Fleet</h2><table><tr>"]
        h += [f"<th>{html.escape(c)}</th>" for c in fleet_cols] + ["</tr>"]
        h += ["<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>"
              for r in fleet_rows]
        h += ["</table>"] + [f"<p>{html.escape(w)}</p>" for w in fleet_warnings]
    h += ["<h2>Figures</h2>"]
    if page is not None:
        h += [f"<p><a href='figures/{page.name}'>Interactive version</a> (hover values, "
              "toggle policies).</p>"]
    for f in figs:
        b64 = base64.b64encode(f.read_bytes()).decode("ascii")
        h += [f"<figure><img alt='{html.escape(f.stem)}' src='data:image/png;base64,{b64}'>",
              f"<figcaption>{html.escape(CAPTIONS.get(f.name, f.stem))}</figcaption></figure>"]
    h += ["</body></html>"]
    html_path = atomic_write_text(d / "report.html", "\n".join(h) + "\n")
    return md_path, html_path
