"""The interactive page beside the PNGs: every sweep metric as an SVG chart, values on hover,
a checkbox per policy that shows or hides its lines in every chart.

Why a small page of our own rather than plotly: the page needs three things (lines, a hover
value, a per-policy toggle), which take about a hundred lines of plain JavaScript; plotly's
bundle is about 3.5 MB inlined into every results directory (and into docs/gallery), and
would be a new dependency of the package for one page. Everything, data included, is inline,
so the file works offline and can be mailed around like the HTML report.

The lines are grouped and ordered as the PNGs are (reports.series); numbers use the report's
one format (`fmt_number`, mirrored in the script), ticks sit at round values (`nice_ticks`,
mirrored too), and overloaded points are hollow and left out of the fitted range, as on the
PNGs.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from reports.io import atomic_write_text
from reports.series import label, ordered, overloaded_mask, series_keys, with_axis_values

# metric column -> chart title, in page order
METRICS: dict[str, str] = {
    "normalized_latency_s": "normalized latency (s / output token)",
    "throughput_tok_s": "throughput (tokens / s)",
    "prefix_hit_rate": "prefix hit rate",
    "internal_frag_pct": "internal fragmentation (% of KV)",
    "token_states_pct": "token-state share (% of KV)",
    "ttft_p99_s": "TTFT p99 (s)",
    "tpot_p99_s": "TPOT p99 (s)",
    "queue_backlog": "requests still queued at the window's end",
    # fleet runs only (simulator/fleet/summary.py)
    "ttft_p90_s": "TTFT p90 (s)",
    "load_imbalance": "load imbalance (max / mean requests per replica)",
}
X_LABELS = {"page_size": "page size (tokens)", "rate_req_s": "request rate (req / s)",
            "replicas": "replicas", "policy": "policy"}
LOG_SPAN = 100.0  # as reports.plots: two decades or more go on a log axis


def fmt_number(v: Any) -> str:
    """The one number format of the report and the page: thousands grouped and no decimals
    from 1,000 up, else four significant digits; '-' for a missing value."""
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]: a step of 1, 2 or 5 x 10^k for about `n` ticks
    (Heckbert's "nice numbers", Graphics Gems I, 1990), from the step below lo to the step
    above hi. The page's script computes the same (niceTicks) each time it redraws, since
    the range changes with the policies shown; this is the reference its test checks."""
    if not hi > lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    f = raw / mag
    step = (1 if f <= 1 else 2 if f <= 2 else 5 if f <= 5 else 10) * mag
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    digits = max(1 - math.floor(math.log10(step)), 0)  # the step's decimals, one spare
    return [round(k * step, digits) + 0.0 for k in range(first, last + 1)]


def x_column(summary: pd.DataFrame) -> str:
    """The x axis: page size when it varies, else the rate, else the replicas (a fleet
    sweep) when it varies, else policy."""
    for col in ("page_size", "rate_req_s", "replicas"):
        if col in summary.columns and summary[col].nunique() > 1:
            return col
    return "page_size" if "page_size" in summary.columns else "policy"


def _wide(values: np.ndarray) -> bool:
    v = values[np.isfinite(values)]
    return bool(v.size and (v > 0).all() and v.max() / v.min() >= LOG_SPAN)


def page_data(summary: pd.DataFrame, axes: Mapping[str, Sequence[Any]] | None = None
              ) -> dict[str, Any]:
    """What the page draws: the x axis, the policies, and per metric one series per line
    (seeds averaged; each point [x, y, overloaded]), in the figures' order."""
    df = ordered(with_axis_values(summary, axes), axes)
    x = x_column(df)
    keys = series_keys(df, x, axes)
    policies = [str(p) for p in dict.fromkeys(df["policy"])] if "policy" in df.columns else []
    groups = list(df.groupby(keys, sort=False)) if keys else [((), df)]
    over_rows = overloaded_mask(df).to_numpy()
    charts = []
    for metric, title in METRICS.items():
        if metric not in df.columns:
            continue
        values = pd.to_numeric(df[metric], errors="coerce").to_numpy(dtype=float)
        if not np.nan_to_num(values).any():
            continue  # zero everywhere: no chart (the report says so)
        series = []
        for _key, g in groups:
            y = pd.to_numeric(g[metric], errors="coerce")
            mean = y.groupby(g[x], sort=False).mean()
            over = overloaded_mask(g).groupby(g[x], sort=False).any()
            points = [[p if isinstance(p, str) else float(p), float(v), bool(over.get(p))]
                      for p, v in mean.items() if np.isfinite(v)]
            row = g.iloc[0]
            series.append({"name": label(row, keys), "policy": str(row.get("policy", "")),
                           "points": points})
        servable = values[~over_rows] if (~over_rows).any() else values  # as the PNGs
        charts.append({"metric": metric, "title": title, "log": _wide(servable),
                       "series": series})
    return {"x": x, "x_label": X_LABELS.get(x, x), "x_log2": x == "page_size",
            "policies": policies, "charts": charts}


_STYLE = """body{font-family:sans-serif;margin:1.5em;color:#222}
#legend label{margin-right:1.2em;cursor:pointer;white-space:nowrap}
.chart{display:inline-block;margin:6px;vertical-align:top}
.chart h3{font-size:13px;margin:4px 0 0 50px}
svg text{font-size:10px;fill:#444}
#tip{position:fixed;pointer-events:none;background:#fff;border:1px solid #888;
padding:3px 6px;font-size:12px;display:none;box-shadow:1px 1px 3px #aaa}"""

# draws each chart from the JSON payload; a checkbox per policy shows or hides its lines
# everywhere, and the charts are redrawn so their axes fit the policies shown
_SCRIPT = r"""
const D = JSON.parse(document.getElementById('kvsim-data').textContent);
const COLORS = ['#2b6cb0','#e53e3e','#38a169','#d69e2e','#805ad5','#dd6b20','#319795',
                '#b83280','#4a5568'];
const DASHES = ['', '6,3', '2,3', '8,3,2,3'];
const W = 480, H = 280, L = 64, R = 12, T = 10, B = 40;
const NS = 'http://www.w3.org/2000/svg';
function fmt(v) {
  if (typeof v !== 'number') return String(v);
  if (!isFinite(v)) return '-';
  if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString('en-US');
  return String(Number(v.toPrecision(4)));
}
function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
// "nice numbers" ticks (Heckbert, Graphics Gems I, 1990): a step of 1, 2 or 5 x 10^k giving
// about five ticks, the axis widened to whole steps; mirrored by nice_ticks() in Python
function niceStep(span, n) {
  const raw = span / Math.max(n - 1, 1);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}
function niceTicks(lo, hi, n) {
  if (!(hi > lo)) hi = lo + 1;
  const step = niceStep(hi - lo, n);
  const out = [];
  for (let k = Math.floor(lo / step + 1e-9); k <= Math.ceil(hi / step - 1e-9); k++)
    out.push(Number((k * step).toFixed(Math.min(Math.max(1 - Math.floor(Math.log10(step)), 0),
                                                 100))));
  return out;
}
function scale(lo, hi, a, b, f) {
  const flo = f(lo), fhi = f(hi), span = (fhi - flo) || 1;
  return v => a + (f(v) - flo) / span * (b - a);
}
const tip = document.getElementById('tip');
const hidden = new Set();  // policies unticked in the legend
function draw(chart) {
  const box = document.createElement('div');
  box.className = 'chart';
  box.dataset.metric = chart.metric;
  box.innerHTML = '<h3></h3>';
  box.querySelector('h3').textContent = chart.title;
  const svg = el('svg', {width: W, height: H}, box);
  document.getElementById('charts').appendChild(box);
  // the axes fit the policies shown: hiding one with large values rescales the rest
  const series = chart.series.filter(s => !hidden.has(s.policy));
  if (!series.length) {
    const t = el('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle'}, svg);
    t.textContent = 'no policy selected';
    return;
  }
  const xs = [...new Set(series.flatMap(s => s.points.map(p => p[0])))];
  const cat = xs.some(v => typeof v === 'string');
  if (!cat) xs.sort((a, b) => a - b);
  // overloaded points (p[2]) are hollow and do not set the range when a servable one exists;
  // beyond it they sit at the edge, their value on hover
  const all = series.flatMap(s => s.points);
  const ok = all.filter(p => !p[2]);
  const ys = (ok.length ? ok : all).map(p => p[1]);
  let ylo = Math.min(...ys), yhi = Math.max(...ys);
  if (!chart.log) { ylo = Math.min(0, ylo); yhi = yhi === ylo ? ylo + 1 : yhi; }
  const fy = chart.log ? Math.log10 : (v => v);
  if (chart.log) {  // whole decades
    ylo = 10 ** Math.floor(Math.log10(ylo));
    yhi = 10 ** Math.ceil(Math.log10(yhi));
    if (yhi === ylo) yhi = ylo * 10;
  }
  // a linear axis widens to the round ticks around its values
  const yTicks = chart.log ? null : niceTicks(ylo, yhi, 5);
  if (yTicks) { ylo = yTicks[0]; yhi = yTicks[yTicks.length - 1]; }
  const sy = scale(ylo, yhi, H - B, T, fy);
  const linX = !cat && !D.x_log2;  // a measured rate: round ticks, not the raw values
  const xTicks = linX ? niceTicks(xs[0], xs[xs.length - 1], 5) : xs;
  const fx = cat ? (v => xs.indexOf(v)) : (D.x_log2 ? Math.log2 : (v => v));
  const sx = cat ? scale(0, Math.max(xs.length - 1, 1), L + 20, W - R - 20, v => v)
                 : scale(xTicks[0], xTicks[xTicks.length - 1], L + 10, W - R - 10, fx);
  const px = v => cat ? sx(xs.indexOf(v)) : sx(v);
  el('line', {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: '#888'}, svg);
  el('line', {x1: L, y1: T, x2: L, y2: H - B, stroke: '#888'}, svg);
  for (const v of xTicks) {
    const t = el('text', {x: px(v), y: H - B + 14, 'text-anchor': 'middle', 'class': 'xtick'},
                 svg);
    t.textContent = cat ? v : fmt(v);
  }
  const xl = el('text', {x: (L + W) / 2, y: H - 6, 'text-anchor': 'middle'}, svg);
  xl.textContent = D.x_label;
  let yt = [];
  if (chart.log) {  // the axis runs over whole decades: a tick at each power of ten
    for (let e = Math.round(Math.log10(ylo)); e <= Math.round(Math.log10(yhi)); e++)
      yt.push(Number((10 ** e).toPrecision(12)));
  } else {
    yt = yTicks;
  }
  for (const v of yt) {
    el('line', {x1: L, x2: W - R, y1: sy(v), y2: sy(v), stroke: '#eee'}, svg);
    const t = el('text', {x: L - 4, y: sy(v) + 3, 'text-anchor': 'end', 'class': 'ytick'},
                 svg);
    t.textContent = fmt(v);
  }
  series.forEach(s => {
    const pi = Math.max(D.policies.indexOf(s.policy), 0);
    const i = chart.series.indexOf(s);  // dashes keyed on the full list: stable on toggles
    const nth = chart.series.slice(0, i).filter(o => o.policy === s.policy).length;
    const color = COLORS[pi % COLORS.length];
    const g = el('g', {'class': 'series', 'data-policy': s.policy, 'data-name': s.name}, svg);
    const py = v => sy(Math.min(Math.max(v, ylo), yhi));
    const pts = s.points.map(p => px(p[0]) + ',' + py(p[1])).join(' ');
    el('polyline', {points: pts, fill: 'none', stroke: color, 'stroke-width': 2,
                    'stroke-dasharray': DASHES[nth % DASHES.length]}, g);
    for (const p of s.points) {
      const c = el('circle', {cx: px(p[0]), cy: py(p[1]), r: 4, fill: p[2] ? '#fff' : color,
                              stroke: color, 'stroke-width': 1.5, 'data-x': p[0],
                              'data-y': p[1], 'data-overloaded': p[2] ? 1 : 0}, g);
      c.addEventListener('mousemove', ev => {
        tip.textContent = s.name + ' | ' + D.x + ' ' + (cat ? p[0] : fmt(p[0])) + ': ' +
          fmt(p[1]) + (p[2] ? ' (overloaded)' : '');
        tip.style.display = 'block';
        tip.style.left = (ev.clientX + 12) + 'px';
        tip.style.top = (ev.clientY + 12) + 'px';
      });
      c.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
    }
  });
}
function redraw() {
  document.getElementById('charts').innerHTML = '';
  D.charts.forEach(draw);
}
function legend() {
  const box = document.getElementById('legend');
  D.policies.forEach((p, i) => {
    const lab = document.createElement('label');
    lab.style.color = COLORS[i % COLORS.length];
    const cb = document.createElement('input');
    cb.type = 'checkbox';
    cb.checked = true;
    cb.dataset.policy = p;
    cb.addEventListener('change', () => {
      if (cb.checked) hidden.delete(p); else hidden.add(p);
      redraw();
    });
    lab.appendChild(cb);
    lab.appendChild(document.createTextNode(' ' + p));
    box.appendChild(lab);
  });
}
legend();
redraw();
"""


def render_page(data: Mapping[str, Any], title: str) -> str:
    """The self-contained HTML page for `data` (page_data's shape)."""
    payload = json.dumps(data, allow_nan=False).replace("</", "<\\/")
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<p>Hover a point for its value; untick a policy to hide its lines. Hollow points are "
        "overloaded runs: the axes are fitted to the servable ones, and an overloaded point "
        "beyond them sits at the edge.</p>",
        "<div id='legend'></div><div id='charts'></div><div id='tip'></div>",
        f"<script type='application/json' id='kvsim-data'>{payload}</script>",
        f"<script>{_SCRIPT}</script></body></html>", ""])


def write_interactive(path: str | Path, summary: pd.DataFrame,
                      axes: Mapping[str, Sequence[Any]] | None = None,
                      title: str = "kvsim: interactive figures") -> Path:
    """Write the page atomically; returns its path."""
    return atomic_write_text(path, render_page(page_data(summary, axes), title))


__all__ = ["METRICS", "fmt_number", "nice_ticks", "page_data", "render_page", "write_interactive",
           "x_column"]
