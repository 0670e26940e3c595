"""The published fleet figures (experiments/validation/fleet_rows.py): the data is whole and
consistent with itself, the knees follow from the tables, each setup's workload is a built-in
one, and the per-pod pool check plans what the report ran. Milliseconds."""

from __future__ import annotations

import math

import pytest

from experiments.validation.fleet_rows import (
    PER_QPS,
    PER_QPS_COLUMNS,
    SETUPS,
    SUMMARY,
    awaiting_rows,
    figures,
    knee_qps,
    pool_check,
    pool_rows,
)
from reports.validation_report import parse_report_rows, render_validation_markdown
from workloads import build_workload, list_workloads
from workloads.ladder import parse_ladder
from workloads.registry import LLMD_37_CAPACITY, LLMD_73_CAPACITY
from workloads.spec import WorkloadSpec


def test_headline_figures_as_the_issue_quotes_them():
    s = SUMMARY["llm-d 73-capacity"]
    assert (s["precise"][0], s["precise"][2]) == (8730.0, 0.542)
    assert (round(s["estimated"][0]), round(s["estimated"][2], 1)) == (6944, 31.1)
    assert (s["random"][0], round(s["random"][2], 1)) == (4428.7, 92.6)
    assert (s["load"][0], round(s["load"][2], 1)) == (4266.4, 94.9)
    # the routers' order: precise > estimated > random > load in throughput, the reverse in p90
    order = sorted(s, key=lambda r: -s[r][0])
    assert order == ["precise", "estimated", "random", "load"]
    assert order == sorted(s, key=lambda r: s[r][2])


def test_per_qps_tables_follow_the_ladders():
    """Every router has one row per ladder stage after the warm-up, in QPS order."""
    for setup, ladder in (("llm-d 73-capacity", LLMD_73_CAPACITY),
                          ("llm-d 37-capacity", LLMD_37_CAPACITY)):
        rates = sorted({st.rate for st in parse_ladder(str(ladder["ladder"]))[1:]})
        for table in PER_QPS[setup].values():
            assert [row[0] for row in table] == rates
            assert all(len(row) == len(PER_QPS_COLUMNS) for row in table)


def test_knees():
    knees = {(s, r): knee_qps(t) for s, rs in PER_QPS.items() for r, t in rs.items()}
    assert knees == {
        ("llm-d 73-capacity", "precise"): None, ("llm-d 73-capacity", "estimated"): 40.0,
        ("llm-d 73-capacity", "random"): 20.0, ("llm-d 73-capacity", "load"): 20.0,
        ("llm-d 37-capacity", "precise"): None, ("llm-d 37-capacity", "default"): 20.0,
        ("llm-d 37-capacity", "random"): 4.0, ("llm-d 37-capacity", "load"): 4.0}
    assert knee_qps(((1.0, 0, 0, 9.9, 0, 0), (2.0, 0, 0, 10.1, 0, 0))) == 2.0


def test_every_setup_names_its_source_and_a_workload_kvsim_has():
    names = list_workloads()
    for s in SETUPS.values():
        assert s.source.where and s.source.version and s.source.table
        assert s.routers
        if not s.workload.startswith("Mooncake"):  # the toolagent trace is not bundled
            assert s.workload in names
    w = build_workload(WorkloadSpec(name=SETUPS["llm-d 73-capacity"].workload))
    assert w.requests[0].prompt_len == 7_200
    sources = {f.source for f in figures()}
    assert None not in sources and len(sources) == 4
    assert all(not math.isnan(f.value) or "never" in f.derived for f in figures())


def test_pool_check_plans_the_reports_replicas():
    c = pool_check("llm-d 73-capacity")
    assert (c.published, c.kvsim) == (307_328, 312_528)
    assert c.kv_gib_per_gpu_published == pytest.approx(37.516, abs=1e-3)
    c = pool_check("llm-d 37-capacity")
    assert (c.published, c.kvsim) == (461_376, 469_840)
    rows = pool_rows()
    assert [r["pass"] for r in rows] == [False, False]
    assert all(r["kind"] == "not reproduced" and "GiB" in r["note"] for r in rows)


def test_awaiting_rows_render_apart_from_the_counted_rows():
    import pandas as pd

    from reports.validation_report import COLUMNS

    df = pd.DataFrame(pool_rows(), columns=list(COLUMNS))
    df.attrs["awaiting"] = awaiting_rows()
    text = render_validation_markdown(df)
    assert "## Fleet rows awaiting the fleet simulation" in text
    assert "| llm-d 73-capacity | load | output_tok_s | 4,266.4 |" in text
    assert "| Dynamo KV router A/B | router ON | TTFT avg (ms) | 2,586 |" in text
    # the drift check reads only the counted rows
    assert set(parse_report_rows(text)) == {(r["section"], r["name"]) for r in pool_rows()}
