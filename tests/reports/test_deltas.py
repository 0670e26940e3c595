"""Deltas against a baseline (reports/deltas.py): signs, percentages, better/worse, errors."""

from __future__ import annotations

import math

import pytest
from rich.console import Console

from reports.deltas import baseline_index, delta, delta_records, delta_table, verdict


def test_delta_and_verdict():
    assert delta(12.0, 10.0) == (2.0, pytest.approx(20.0))
    d, rel = delta(5, 0)
    assert d == 5 and math.isnan(rel)
    assert math.isnan(delta("n/a", 1.0)[0])
    assert verdict(1.0, "higher") == "better" and verdict(1.0, "lower") == "worse"
    assert verdict(-1.0, "lower") == "better" and verdict(0.0, "lower") == "same"


def test_records_and_table_against_the_chosen_baseline():
    rows = [{"throughput_tok_s": 100.0, "ttft_p99_s": 1.0},
            {"throughput_tok_s": 80.0, "ttft_p99_s": 0.5}]
    recs = delta_records(rows, ["paged", "vllm"], baseline=1)
    paged = {r["metric"]: r for r in recs if r["label"] == "paged"}
    assert paged["throughput_tok_s"]["delta"] == 20.0
    assert paged["throughput_tok_s"]["delta_pct"] == pytest.approx(25.0)
    assert paged["throughput_tok_s"]["verdict"] == "better"
    assert paged["ttft_p99_s"]["verdict"] == "worse"
    assert {r["metric"] for r in recs} == {"throughput_tok_s", "ttft_p99_s"}
    con = Console(width=160, record=True)
    con.print(delta_table(rows, ["paged", "vllm"], baseline=1))
    text = con.export_text()
    assert "vllm (baseline)" in text and "(+20.0, +25%)" in text and "(+0.500, +100%)" in text


def test_baseline_index():
    assert baseline_index(["a", "b"], None) == 0 and baseline_index(["a", "b"], "b") == 1
    with pytest.raises(ValueError, match="--baseline 'c'"):
        baseline_index(["a", "b"], "c")
