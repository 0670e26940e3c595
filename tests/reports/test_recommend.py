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
