"""Held-out overload cases through the CLI: a bundled Mooncake slice replayed far faster than
one GPU serves it is flagged in summary.csv and in the output, and `plan --trace` recommends
nothing and says why; the same slice at a servable rate gets a page size that meets every
rule (or the reason none does)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

TRACE = Path(__file__).resolve().parents[2] / "workloads" / "data" / \
    "mooncake_conversation_trace.jsonl"
SLICE = ["--model", "llama-3.1-8b", "--gpu", "h100", "--num-requests", "40"]
HEAVY = [*SLICE, "--rate-scale", "20"]
LIGHT = [*SLICE, "--rate-scale", "0.02"]


def test_an_overloaded_run_is_flagged_in_the_summary_and_the_output(invoke, tmp_path):
    r = invoke("run", "--no-progress", "--trace", TRACE, *HEAVY, "--out", tmp_path / "heavy")
    assert r.exit_code == 0, r.output
    row = pd.read_csv(tmp_path / "heavy" / "summary.csv").iloc[0]
    assert bool(row["overloaded"]) and "backlog" in row["overload_reason"]
    assert "warning: overloaded" in r.output and "kvsim capacity" in r.output
    assert r.output.count("warning: overloaded") == 1
    r = invoke("run", "--no-progress", "--trace", TRACE, *LIGHT, "--out", tmp_path / "light")
    assert r.exit_code == 0, r.output
    row = pd.read_csv(tmp_path / "light" / "summary.csv").iloc[0]
    assert not bool(row["overloaded"]) and "warning: overloaded" not in r.output
    text = " ".join(r.output.split())
    assert "of an ideal" in text and "to capacity" in text  # achieved vs ideal reuse


def test_plan_recommends_nothing_from_an_overloaded_run(invoke, tmp_path):
    out = tmp_path / "plan"
    args = ("plan", "--trace", TRACE, *HEAVY, "--page-sizes", "16,64", "--out", out)
    r = invoke(*args, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["recommended_page_size"] is None and d["overloaded"] is True
    assert d["recommendation"]["all_overloaded"]
    assert all(row["fails"] == ["servable"] for row in d["recommendation"]["rows"])
    r = invoke(*args)  # resumed from --out: the text, without simulating again
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "No page size recommended" in text and "Recommended page size" not in text
    assert "every page size's run is overloaded" in text
    assert "not recommending: the study ran at" in text and "--rate-scale 20" in text
    assert "--at-sustainable-rate" in text


def test_plan_recommends_a_page_size_meeting_its_rules_on_a_servable_load(invoke, tmp_path):
    r = invoke("plan", "--trace", TRACE, *LIGHT, "--page-sizes", "1,16,64",
               "--out", tmp_path / "plan", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    rec = d["recommendation"]
    assert d["overloaded"] is False
    if d["recommended_page_size"] is None:  # then it says which rule each candidate fails
        assert rec["reason"].startswith("no page size meets every rule")
        assert all(row["fails"] for row in rec["rows"])
    else:
        chosen = next(row for row in rec["rows"] if row["page_size"] == rec["page_size"])
        assert chosen["fails"] == [] and chosen["latency_within"] and chosen["hit_within"]
    for row in rec["rows"]:  # the reuse gap adds up to the ideal
        parts = (row["prefix_hit_rate"] + row["reuse_gap_alignment"]
                 + row["reuse_gap_not_arrived"] + row["reuse_gap_capacity"])
        assert abs(parts - row["ideal_hit_rate"]) < 1e-9


def test_sweep_and_compare_warn_once_for_overloaded_cells(invoke, tmp_path):
    r = invoke("sweep", "--trace", TRACE, *HEAVY, "--page-sizes", "16", "--no-plot",
               "--no-progress", "--out", tmp_path / "s")
    assert r.exit_code == 0, r.output
    assert r.output.count("warning: overloaded") == 1
    assert pd.read_csv(tmp_path / "s" / "summary.csv")["overloaded"].all()


def test_plan_at_the_sustainable_rate_says_which_rate_it_used(invoke, tmp_path):
    args = ["plan", "--workload", "sharegpt", "--num-requests", "40", "--rate", "500",
            "--latency", "constant", "--kv-tokens", "8192", "--max-context-len", "4096",
            "--page-sizes", "16,64", "--steps", "2"]
    r = invoke(*args, "--at-sustainable-rate", "--out", tmp_path / "p", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    cap, used = d["capacity"], d["study_rate"]
    assert cap["overloaded_at_start"] and used["flag"] == "--rate"
    assert used["value"] == cap["flag_value"] < 500
    assert d["rate_req_s"] == pytest.approx(cap["rate_req_s"])
    assert d["recommendation"]["rows"]  # studied at the found rate
    r = invoke(*args, "--at-sustainable-rate", "--out", tmp_path / "p")  # resumed: text
    text = " ".join(r.stdout.split())
    assert r.exit_code == 0 and "the page-size study ran at --rate" in text
    assert "the highest sustainable rate found, instead of 500" in text
    r = invoke(*args, "--find-rate", "--out", tmp_path / "q", "--json")  # search, study at 500
    d = json.loads(r.stdout)
    assert "study_rate" not in d and d["capacity"]["rate_req_s"] < 500
    assert d["overloaded"] and d["recommended_page_size"] is None
