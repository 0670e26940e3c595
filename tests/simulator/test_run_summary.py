"""The summary is a typed record (simulator/run_summary.py `RunSummary`) whose field names are
summary.csv's columns: the recorded summary.csv header, after the options, is exactly the
record's columns (reports/schema.py METRICS first, then the rest in the record's order); the
mapping view and `from_columns` give back the same columns in the same order. Cost: about
2 s (two small runs)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from reports.schema import METRICS
from simulator.config import FLAT_FIELDS, SimConfig
from simulator.run import simulate
from simulator.run_summary import NAMES, OPTIONAL, RunSummary, is_pool_column
from workloads import build_workload
from workloads.spec import WorkloadSpec

RECORDED = Path(__file__).resolve().parents[1] / "data" / "recorded_summaries.csv"


def _run(**flat) -> RunSummary:
    w = build_workload(WorkloadSpec(name="azure-conv", num_requests=30, seed=2,
                                    max_context_len=4096))
    return simulate(w, SimConfig.of(kv_tokens=20000, max_context_len=4096, **flat)).summary


def test_the_recorded_header_is_the_records_columns() -> None:
    """A full-attention run's summary columns, as summary_row (experiments/answers/runner.py) lays
    them out, are the recorded summary.csv header from capacity_slots on (the options, which
    the engine's echo of its config stands for, come before)."""
    with RECORDED.open() as f:
        header = next(csv.reader(f))
    own = [c for c in _run(policy="paged", page_size=16).columns() if c not in FLAT_FIELDS]
    expected = ["capacity_slots", *(m for m in METRICS if m not in FLAT_FIELDS),
                *(c for c in own if c not in METRICS and c != "capacity_slots")]
    start = header.index("capacity_slots")
    assert header[start:start + len(expected)] == expected
    assert set(METRICS) <= set(NAMES)  # every metric the reports lead with is a field


def test_mapping_view_and_from_columns_keep_the_columns() -> None:
    s = _run(policy="paged", page_size=1, model="qwen3.5-4b")  # a hybrid: pools, rule losses
    cols = s.columns()
    assert any(is_pool_column(c) for c in cols) and s.effective_page_size == 1
    assert s.reuse_gap_state is not None and s.reuse_gap_window is None
    assert "reuse_gap_window" not in cols  # an absent optional field is no column
    assert list(s) == list(cols) and dict(s.items()) == cols
    assert s["ttft_p99_s"] == s.ttft_p99_s
    again = RunSummary.from_columns(cols)
    assert list(again.columns()) == list(cols)
    with pytest.raises(ValueError, match="no_such_column"):
        RunSummary.from_columns({**cols, "no_such_column": 1})


def test_optional_fields_are_the_ones_a_run_may_lack() -> None:
    """Only the columns some runs lack default to None: a required one missing is a
    TypeError when the record is built, never a silent absence."""
    assert {"effective_page_size", "ideal_hit_rate", "sim_wall_s",
            "shared_tier_hit_rate"} <= OPTIONAL
    assert not {"ttft_p99_s", "capacity_slots", "overloaded", "kernel_page_size"} & OPTIONAL
    cols = _run(policy="paged", page_size=16).columns()
    del cols["ttft_p99_s"]
    with pytest.raises(TypeError, match="ttft_p99_s"):
        RunSummary.from_columns(cols)


def test_the_fleets_rules_name_the_records_fields() -> None:
    """The cluster summary's rule per column and the replica rows read the record's columns
    by name (simulator/fleet/summary.py): each name is a field, so a renamed field fails here
    rather than falling back to a rule-less combine or a NaN in a replica row."""
    from simulator.fleet.summary import REPLICA_COLUMNS, RULES

    assert set(RULES) <= set(NAMES)
    own = {"replica", "requests_routed", "ttft_p90_s", "tpot_p90_s", "itl_p90_s"}
    assert set(REPLICA_COLUMNS) - own <= set(NAMES)
