"""Figures that tell the truth (issue 26, item 6): overloaded points are hollow, named in the
legend and kept from setting the axis range (off-scale ones are marked at the edge and named
under the axis and in the report summary); hit-rate axes start at 0 with the trace's ideal
as a reference line; the memory timeline is a post-step that drops during idle gaps; the
interactive page's ticks are round (1 / 2 / 5 x 10^k). About 2 s in all (matplotlib Agg, no
simulation)."""

from __future__ import annotations

import json
import math
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.colors import to_hex

from experiments.answers.recommend import page_size_sentence
from reports.interactive import nice_ticks, page_data, render_page
from reports.offscale import OVERLOADED_LABEL
from reports.plots import (
    TIMELINE_PARTS,
    host_tier_figure,
    latency_vs_rate_figure,
    plot_results,
    timeline_figure,
    vs_page_size_figure,
)
from reports.report_summary import summary_lines
from reports.schema import PARTS_PCT

SIZES = (1, 4, 16, 64, 256)
JAM = 13.0  # s/token of the overloaded cell: the backlog, not the page size


def sweep(jam: float = JAM) -> pd.DataFrame:
    """Two policies over five page sizes; paged at 256 is overloaded with a huge latency."""
    rows = []
    for pol in ("paged", "vllm"):
        for ps in SIZES:
            over = pol == "paged" and ps == 256
            r = {"policy": pol, "page_size": ps, "overloaded": over,
                 "normalized_latency_s": jam if over else 0.02 + ps * 1e-4,
                 "prefix_hit_rate": 0.010 + 1e-5 * ps, "ideal_hit_rate": 0.4,
                 "throughput_tok_s": 900.0 + ps}
            r.update({p: 10.0 for p in PARTS_PCT})
            rows.append(r)
    return pd.DataFrame(rows)


def legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_overloaded_point_is_hollow_and_does_not_set_the_axis():
    notes: list[str] = []
    fig = vs_page_size_figure(sweep(), "normalized_latency_s", notes=notes)
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert hi < 0.1 < JAM  # fitted to the servable 0.02-0.046, not squashed by 13 s/token
    assert lo > 0.0
    assert ax.get_yscale() == "linear"  # 13 / 0.02 spans decades, but only the jam does
    assert OVERLOADED_LABEL in legend_texts(ax)
    hollow = [ln for ln in ax.get_lines() if ln.get_gid() == "overloaded"]
    assert len(hollow) == 1 and hollow[0].get_markerfacecolor() == "none"
    assert list(hollow[0].get_xdata()) == [256.0]
    edge = [ln for ln in ax.get_lines() if ln.get_gid() == "off-scale"]
    assert len(edge) == 1 and edge[0].get_ydata()[0] == hi  # marked at the top edge
    assert notes == ["paged at page 256 (13)"]
    assert "off-scale" in ax.get_xlabel() and "paged at page 256" in ax.get_xlabel()
    plt.close(fig)


def test_servable_figure_has_no_overload_marks():
    df = sweep().assign(overloaded=False)
    df.loc[df["normalized_latency_s"] == JAM, "normalized_latency_s"] = 0.05
    notes: list[str] = []
    fig = vs_page_size_figure(df, "normalized_latency_s", notes=notes)
    ax = fig.axes[0]
    assert OVERLOADED_LABEL not in legend_texts(ax)
    assert not [ln for ln in ax.get_lines() if ln.get_gid() in ("overloaded", "off-scale")]
    assert notes == [] and ax.get_ylim()[1] >= 0.05
    plt.close(fig)


def test_every_point_overloaded_sets_the_range_itself():
    df = sweep().assign(overloaded=True)
    notes: list[str] = []
    fig = vs_page_size_figure(df, "normalized_latency_s", notes=notes)
    assert fig.axes[0].get_ylim()[1] >= JAM and notes == []
    plt.close(fig)


def test_hit_rate_axis_from_zero_with_the_ideal_line():
    fig = vs_page_size_figure(sweep(), "prefix_hit_rate")
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert lo == 0.0 and 0.4 <= hi <= 1.02  # not 0.010-0.013, which magnifies noise
    ideal = [ln for ln in ax.get_lines() if ln.get_label() == "ideal (trace)"]
    assert len(ideal) == 1 and set(ideal[0].get_ydata()) == {0.4}
    plt.close(fig)


def test_latency_vs_rate_leaves_the_overloaded_rate_off_scale():
    rows = [{"policy": "paged", "rate_req_s": r, "normalized_latency_s": lat,
             "ttft_p99_s": 1.0, "tpot_p99_s": 0.05, "overloaded": r == 8.0}
            for r, lat in ((1.0, 0.02), (2.0, 0.025), (4.0, 0.04), (8.0, 9.0))]
    notes: list[str] = []
    fig = latency_vs_rate_figure(pd.DataFrame(rows), notes=notes)
    ax = fig.axes[0]
    assert ax.get_ylim()[1] < 0.1 and ax.get_yscale() == "linear"
    assert OVERLOADED_LABEL in legend_texts(ax)
    assert notes == ["paged at 8 req/s (9)"]
    plt.close(fig)


def test_host_tier_figure_hit_rate_from_zero_and_ttft_fitted():
    rows = [{"hicache_ratio": h, "prefix_hit_rate": 0.1 + 0.01 * h, "device_hit_rate": 0.1,
             "host_hit_rate": 0.01 * h, "storage_hit_rate": 0.0, "ideal_hit_rate": 0.6,
             "ttft_p50_s": 2000.0 if h == 0 else 0.5, "ttft_p99_s": 2600.0 if h == 0 else 2.0,
             "overloaded": h == 0} for h in (0, 1, 4, 16)]
    notes: list[str] = []
    fig = host_tier_figure(pd.DataFrame(rows), notes)
    hit, ttft = fig.axes
    assert hit.get_ylim()[0] == 0.0 and hit.get_ylim()[1] >= 0.6
    assert any(ln.get_label() == "ideal reuse (trace)" for ln in hit.get_lines())
    lines = {ln.get_label(): ln for ln in hit.get_lines()}
    # one run: one color, the parts told apart by line style
    assert {to_hex(lines[p].get_color()) for p in ("total", "device", "host")} == {to_hex("C0")}
    assert [lines[p].get_linestyle() for p in ("total", "device", "host")] == ["-", "--", ":"]
    assert ttft.get_ylim()[1] < 10 and ttft.get_yscale() == "linear"
    assert OVERLOADED_LABEL in legend_texts(ttft)
    assert notes == ["TTFT p50 at host x0 (2,000)", "TTFT p99 at host x0 (2,600)"]
    plt.close(fig)


def test_host_tier_figure_draws_each_policy_never_their_mean():
    """Issue 38 item 2: `sweep --hicache-ratios 0,1,4,16 --policies paged,vllm` drew one
    "total" line, the mean over policies (0.064 at 0x = the mean of paged 0.061 and vllm
    0.067). Every policy (and write policy, when the rows differ in it) gets its own lines,
    holding its own values; seeds of one configuration are still averaged."""
    rows = []
    for pol, base in (("paged", 0.061), ("vllm", 0.067)):
        for wp in ("write_through", "write_back"):
            for h in (0, 1, 4, 16):
                for seed in (0, 1):
                    hit = base + 0.01 * h + (0.002 if wp == "write_back" else 0.0)
                    rows.append({"policy": pol, "hicache_write_policy": wp, "seed": seed,
                                 "hicache_ratio": h, "prefix_hit_rate": hit + 0.001 * seed,
                                 "device_hit_rate": base, "host_hit_rate": 0.01 * h,
                                 "storage_hit_rate": 0.0, "ttft_p50_s": 0.5,
                                 "ttft_p99_s": 2.0, "overloaded": False})
    fig = host_tier_figure(pd.DataFrame(rows), [])
    hit, ttft = fig.axes
    totals = {ln.get_label(): list(ln.get_ydata()) for ln in hit.get_lines()
              if ln.get_label().endswith(": total")}
    assert set(totals) == {f"{p}, hicache_write_policy={w}: total" for p in ("paged", "vllm")
                           for w in ("write_through", "write_back")}
    assert totals["paged, hicache_write_policy=write_through: total"][0] == pytest.approx(0.0615)
    assert totals["vllm, hicache_write_policy=write_back: total"][0] == pytest.approx(0.0695)
    assert not any(v == pytest.approx(0.064) for ys in totals.values() for v in ys[:1])
    assert sum(ln.get_label().endswith("TTFT p50") for ln in ttft.get_lines()) == 4
    plt.close(fig)


def test_report_summary_names_the_off_scale_points(tmp_path):
    df = sweep()
    off: dict[str, list[str]] = {}
    plot_results(df, tmp_path, off_scale=off)
    assert off == {"normalized_latency_s_vs_page_size.png": ["paged at page 256 (13)"]}
    lines = summary_lines(df, None, {}, off, recommend=page_size_sentence)
    assert any("hollow" in ln for ln in lines)
    assert any(ln.startswith("figure normalized_latency_s_vs_page_size.png: off-scale")
               and "paged at page 256 (13)" in ln for ln in lines)


def test_timeline_steps_down_during_an_idle_gap():
    """The engine writes a row at both ends of an idle gap (what is held while idle); the plot
    must draw it as a post-step: the drop holds until the next row, no carry, no ramp."""
    held = {"time_s": [0.0, 10.0, 50.0, 51.0], "token_states": [100, 0, 0, 100]}
    tl = pd.DataFrame({**held, **{p: [0, 0, 0, 0] for p in TIMELINE_PARTS[1:]}})
    fig = timeline_figure(tl)
    path = fig.axes[0].collections[0].get_paths()[0]  # the token-state layer
    assert path.contains_point((5.0, 50.0))
    assert not path.contains_point((30.0, 50.0))  # idle: nothing held, no stale carry
    assert not path.contains_point((50.9, 50.0))  # a step at 51, not a ramp from 50
    assert path.contains_point((51.5, 50.0)) or tl["time_s"].max() == 51.0
    plt.close(fig)


def _is_nice_step(step: float) -> bool:
    mag = 10.0 ** math.floor(math.log10(step) + 1e-9)
    return any(math.isclose(step, m * mag, rel_tol=1e-9) for m in (1, 2, 5, 10))


@settings(max_examples=100, deadline=None)
@given(st.floats(-1e6, 1e6), st.floats(1e-6, 1e6))
def test_nice_ticks_are_round_and_cover_the_range(lo, span):
    span = max(span, 1e-4 * abs(lo))  # a chart's range: not a sliver far from zero
    hi = lo + span
    t = nice_ticks(lo, hi)
    assert 2 <= len(t) <= 8
    steps = np.diff(t)
    slack = 1e-6 * steps[0]  # a value within a millionth of a step of a tick counts as on it
    assert t[0] <= lo + slack and t[-1] >= hi - slack
    assert np.allclose(steps, steps[0], rtol=1e-6)
    assert _is_nice_step(float(steps[0]))
    assert all(math.isclose(v / steps[0], round(v / steps[0]), abs_tol=1e-6) for v in t)


def test_nice_ticks_on_the_issue_values():
    assert nice_ticks(0, 0.06321) == [0.0, 0.02, 0.04, 0.06, 0.08]
    assert nice_ticks(0, 173.3) == [0.0, 50.0, 100.0, 150.0, 200.0]
    assert nice_ticks(0, 57.76) == [0.0, 20.0, 40.0, 60.0]


def test_page_marks_overloaded_points_and_uses_nice_ticks():
    data = page_data(sweep())
    lat = next(c for c in data["charts"] if c["metric"] == "normalized_latency_s")
    paged = next(s for s in lat["series"] if s["policy"] == "paged")
    assert paged["points"][-1] == [256.0, JAM, True]
    assert not lat["log"]  # decided on the servable points, like the PNG
    page = render_page(data, "t")
    assert "niceTicks(ylo, yhi, 5)" in page and "p[2] ? '#fff'" in page
    payload = re.search(r"id='kvsim-data'>(.*?)</script>", page).group(1)
    assert json.loads(payload) == data


def test_report_md_names_the_off_scale_point(tmp_path):
    """build_report passes what the figures left off-scale into the summary. About 2 s."""
    from reports.report import build_report

    sweep().to_csv(tmp_path / "summary.csv", index=False)
    md, _ = build_report(tmp_path, recommend=page_size_sentence)
    text = md.read_text()
    summary = text[text.index("## Summary"):text.index("## Setup")]
    assert "figure normalized_latency_s_vs_page_size.png: off-scale" in summary
    assert "paged at page 256 (13)" in summary and "hollow" in summary


def test_latency_cdf_keeps_an_overloaded_run_off_its_axis():
    """A servable run with TTFT 0.1-0.5 s and an overloaded one reaching 900 s: the overloaded
    run is dashed and marked, the x axis stops near 0.5 s (before: 0-900 s, the servable CDF a
    vertical line at 0), and the note names the off-scale run."""
    from reports.plots import cdf_figure

    rng = np.random.default_rng(0)
    rows = [{"config_hash": "ok", "status": "completed", "ttft_s": t, "tpot_s": 0.02}
            for t in rng.uniform(0.1, 0.5, 50)]
    rows += [{"config_hash": "hot", "status": "completed", "ttft_s": t, "tpot_s": 0.02}
             for t in rng.uniform(1.0, 900.0, 50)]
    notes: list[str] = []
    fig = cdf_figure(pd.DataFrame(rows), {"ok": "page 16", "hot": "page 1"},
                     frozenset({"hot"}), notes)
    ttft = fig.axes[0]
    assert ttft.get_xlim()[1] < 1.0
    labels = [ln.get_label() for ln in ttft.get_lines()]
    assert "page 1 (overloaded)" in labels and "page 16" in labels
    assert ttft.get_lines()[labels.index("page 1 (overloaded)")].get_linestyle() == "--"
    assert len(notes) == 1 and "TTFT CDF" in notes[0] and "off-scale" in notes[0]
    plain = cdf_figure(pd.DataFrame(rows), {"ok": "page 16", "hot": "page 1"})
    assert plain.axes[0].get_xlim()[1] > 800  # without the verdict every run sets the range


def test_cdf_points_are_exact_points_of_the_cdf_and_bounded():
    """Small: every value with its rank / n, as drawn before. Large: at most CDF_POINTS, each
    (x, y) a point of the full empirical CDF, the first and last values included."""
    from reports.plots import cdf_points

    v = np.sort(np.random.default_rng(1).uniform(0, 1, 50))
    x, y = cdf_points(v)
    assert np.array_equal(x, v) and np.array_equal(y, np.arange(1, 51) / 50)
    v = np.sort(np.random.default_rng(2).exponential(1.0, 100_003))
    x, y = cdf_points(v, limit=1000)
    assert len(x) <= 1000 and x[0] == v[0] and x[-1] == v[-1] and y[-1] == 1.0
    assert np.array_equal(np.searchsorted(v, x, side="right") / len(v), y)
