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


def test_no_better_or_worse_across_offered_loads():
    """An overloaded run fed 30 % more requests shows 30 % more throughput: that is its offered
    load, not a better configuration, so no verdict (and a note says why)."""
    base = {"rate_req_s": 10.0, "throughput_tok_s": 1000.0, "ttft_p99_s": 1.0}
    more = {"rate_req_s": 13.0, "throughput_tok_s": 1300.0, "ttft_p99_s": 30.0}
    recs = delta_records([base, more], ["a", "b"])
    assert {r["verdict"] for r in recs if r["label"] == "b"} == {"other load"}
    same = dict(more, rate_req_s=10.05)  # within 1 %: comparable
    recs = delta_records([base, same], ["a", "b"])
    assert {r["metric"]: r["verdict"] for r in recs if r["label"] == "b"}[
        "throughput_tok_s"] == "better"
    from reports.deltas import load_note

    assert "13 req/s" in load_note([base, more], ["a", "b"])
    assert load_note([base, same], ["a", "b"]) is None
    text = _render(delta_table([base, more], ["a", "b"]))
    assert "not better or worse" in " ".join(text.split())


def test_percent_only_of_a_base_that_is_not_near_zero():
    d, rel = delta(0.02, 0.0000105)  # the "+189754 %"
    assert d == pytest.approx(0.0199895) and math.isnan(rel)
    d, rel = delta(0.02, 0.01)
    assert rel == pytest.approx(100.0)


def _render(table) -> str:
    con = Console(width=200, record=True)
    con.print(table)
    return con.export_text()


def test_a_shared_reuse_sentence_is_told_once_and_a_capped_admission_is_explained():
    from reports.deltas import admission_notes
    from reports.reuse_view import reuse_lines

    none = {"ideal_hit_rate": 0.0, "prefix_hit_rate": 0.0, "reuse_gap_alignment": 0.0,
            "reuse_gap_not_arrived": 0.0, "reuse_gap_capacity": 0.0}
    rows = [dict(none, policy=p) for p in ("paged", "vllm", "contiguous-max")]
    lines = reuse_lines(rows, ["paged", "vllm", "contiguous-max"])
    assert len(lines) == 1 and "all 3 runs alike" in lines[0]
    differ = [dict(rows[0]), dict(rows[1], prefix_hit_rate=0.1, ideal_hit_rate=0.2)]
    assert len(reuse_lines(differ, ["paged", "vllm"])) == 2
    rows[0]["avg_batch_size"], rows[2]["avg_batch_size"] = 30.0, 6.0
    notes = admission_notes(rows, ["paged", "vllm", "contiguous-max"])
    assert len(notes) == 1 and notes[0].startswith("contiguous-max: admission reserves")
    assert "avg 6.0 vs 30.0 for paged" in notes[0]
    rows[2]["policy"] = "contiguous-pow2"
    assert "next power of two" in admission_notes(rows, ["paged", "vllm", "pow2"])[0]
    rows[2]["avg_batch_size"] = 31.0  # its reservation capped nothing here: no note
    assert admission_notes(rows, ["paged", "vllm", "pow2"]) == []
