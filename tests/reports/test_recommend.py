"""The page-size recommendation, read from sweep rows, and its rendering."""

from __future__ import annotations

import pandas as pd
import pytest

from kvcore.memory import MemorySpec
from kvcore.planner import plan
from reports.recommend import recommend_page_size


def test_recommend_page_size():
    df = pd.DataFrame({
        "page_size": [1, 4, 16, 32, 64, 128, 16, 32],
        "normalized_latency_s": [0.20, 0.12, 0.100, 0.101, 0.101, 0.104, 0.100, 0.101],
        "prefix_hit_rate": [0.50, 0.50, 0.495, 0.492, 0.48, 0.45, 0.495, 0.492],
    })
    rec = recommend_page_size(df)
    assert rec.page_size == 32 and rec.within_tolerance
    assert rec.best_latency_page_size == 16 and rec.best_hit_rate == pytest.approx(0.5)
    assert [row["page_size"] for row in rec.rows] == [1, 4, 16, 32, 64, 128]
    assert recommend_page_size(df, tolerance=0.05).page_size == 64
    with pytest.raises(ValueError, match="lack"):
        recommend_page_size(df.drop(columns=["prefix_hit_rate"]))
    with pytest.raises(ValueError, match="--tolerance"):
        recommend_page_size(df, tolerance=float("nan"))


def test_plan_view_renders():
    from rich.console import Console

    from reports.plan_view import render_plan_all, render_recommendation

    console = Console(width=160, record=True)
    console.print(render_plan_all(plan(MemorySpec(model="opt-13b", gpu="a100-40gb",
                                                  kv_mem_gib=12))))
    df = pd.DataFrame({"page_size": [1, 16], "normalized_latency_s": [0.2, 0.1],
                       "prefix_hit_rate": [0.5, 0.5]})
    console.print(render_recommendation(recommend_page_size(df)))
    text = console.export_text()
    assert "15,728" in text and "819,200 B" in text and "Recommended page size: 16" in text


def test_an_overloaded_run_is_never_recommended():
    df = pd.DataFrame({"page_size": [1, 16, 64], "normalized_latency_s": [0.3, 0.1, 0.101],
                       "prefix_hit_rate": [0.5, 0.5, 0.5],
                       "overloaded": [False, True, False],
                       "overload_reason": ["", "backlog: 50 of 100", ""]})
    rec = recommend_page_size(df)
    # 16 has the best latency but is overloaded: the best servable latency is 64's
    assert rec.page_size == 64 and rec.overloaded and not rec.all_overloaded
    assert rec.best_latency_page_size == 64
    row16 = next(r for r in rec.rows if r["page_size"] == 16)
    assert row16["fails"] == ["servable"] and "backlog: 50 of 100" in row16["why"]
    every = recommend_page_size(df.assign(overloaded=["True", "True", "True"]))  # CSV strings
    assert every.page_size is None and every.all_overloaded
    assert "overloaded" in every.reason and every.to_dict()["recommended_page_size"] is None
    assert all(r["fails"] == ["servable"] for r in every.rows)


def test_when_no_page_size_meets_every_rule_each_failure_is_named():
    df = pd.DataFrame({"page_size": [1, 16, 256], "normalized_latency_s": [0.2, 0.15, 0.1],
                       "prefix_hit_rate": [0.22, 0.20, 0.04], "overloaded": False})
    rec = recommend_page_size(df)
    assert rec.page_size is None and not rec.within_tolerance and not rec.overloaded
    fails = {r["page_size"]: r["fails"] for r in rec.rows}
    assert fails == {1: ["latency"], 16: ["latency", "hit rate"], 256: ["hit rate"]}
    assert "256 fails hit rate" in rec.reason and "1 fails latency" in rec.reason
    from rich.console import Console

    from reports.plan_view import recommendation_notes, render_recommendation

    console = Console(width=200, record=True)
    console.print(render_recommendation(rec))
    text = console.export_text()
    assert "No page size recommended" in text and "fails latency, hit rate" in text
    assert any("hit rate 0.04 < 0.22" in line for line in recommendation_notes(rec))


def test_a_wide_summary_read_back_raises_no_performance_warning(tmp_path):
    """A summary.csv of 150 columns (wider than pandas' 100-block threshold), read back and
    recommended from, leaks no PerformanceWarning into plan / report (issue 26 item 8)."""
    import warnings

    from reports.io import read_csv_or_empty

    wide = pd.DataFrame({"page_size": [16, 32], "normalized_latency_s": [1.0, 1.0],
                         "prefix_hit_rate": [0.5, 0.5], "overloaded": [False, False],
                         **{f"c{i}": ["x", 1.5] for i in range(150)}})
    wide.to_csv(tmp_path / "summary.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        df = read_csv_or_empty(tmp_path / "summary.csv")
        df.assign(extra=1)
        assert recommend_page_size(df, 0.02).page_size == 32
