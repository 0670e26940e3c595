"""Reuse accounting on hybrid models (issue 38, item 4): the gap between the ideal and the hit
rate names each cause (page alignment, requests not yet arrived, sliding-window eviction, the
state-boundary rule, capacity), measured from the run by the policy's own match rules; the
causes add up to the ideal; the latency table and the reuse line read the same columns."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from experiments.answers.runner import simulate_options
from experiments.options.run_options import RunOptions
from reports.reuse_view import reuse_sentence
from reports.tables import latency_table

CAUSES = ("reuse_gap_alignment", "reuse_gap_not_arrived", "reuse_gap_window",
          "reuse_gap_state", "reuse_gap_capacity")
QWEN = {"model": "qwen3-next-80b-a3b", "gpu": "h200", "tp": 2, "latency": "constant",
        "max_context_len": 4096}


def row_of(**options) -> dict:
    return simulate_options(RunOptions.from_mapping({"num_requests": 40, **options}))[0]


def test_the_state_boundary_rule_is_named_where_it_cuts_every_hit():
    """The issue's case: a shared k-shot prefix on Qwen3-Next under SGLang's rules at page 1:
    no state is kept where the prefix ends, so the hit rate is 0 and the whole ideal is lost
    to the state-boundary rule (on main: "88 % to page alignment" in the table, "to
    capacity" in the line)."""
    row = row_of(**QWEN, workload="kshot", page_size=1, kv_tokens=60_000)
    assert row["prefix_hit_rate"] == 0 and row["ideal_hit_rate"] > 0.5
    assert row["reuse_gap_state"] == pytest.approx(row["ideal_hit_rate"], abs=1e-9)
    assert row["reuse_gap_alignment"] == row["reuse_gap_capacity"] == 0
    assert row["missed_reuse_pct"] == 0  # page 1: nothing is lost to pages at admission
    assert "reuse_gap_window" not in row  # no sliding-window layers
    line = reuse_sentence(row)
    pct = f"{row['reuse_gap_state']:.1%}"
    assert f"{pct} to the state-boundary rule" in line and "0.0% to capacity" in line
    out = io.StringIO()
    Console(file=out, width=200).print(latency_table([row]))
    table = {ln.split("│")[1].strip(): ln.split("│")[2].strip()
             for ln in out.getvalue().splitlines() if ln.count("│") == 3}
    assert table["reuse lost to the state-boundary rule"] == f"{row['reuse_gap_state']:.2%}"
    assert table["reuse lost to page alignment"] == "0.00%"
    assert table["reuse lost to capacity"] == "0.00%"


@pytest.mark.parametrize("options", [
    {**QWEN, "workload": "chat", "page_size": 1, "kv_tokens": 100_000, "max_mamba_cache_size": 9},
    {**QWEN, "workload": "kshot", "policy": "vllm", "kv_tokens": 20_000},
    {**QWEN, "workload": "chat", "policy": "vllm", "kv_tokens": 20_000,
     "mamba_cache_mode": "all"},
    {"model": "gpt-oss-20b", "workload": "chat", "kv_tokens": 6000, "latency": "constant",
     "max_context_len": 8192},
    {"model": "gpt-oss-20b", "workload": "chat", "kv_tokens": 6000, "latency": "constant",
     "max_context_len": 8192, "policy": "vllm"},
], ids=["qwen-paged-tight", "qwen-vllm-align", "qwen-vllm-all", "gptoss-paged", "gptoss-vllm"])
def test_the_causes_add_up_to_the_ideal(options):
    row = row_of(**options)
    parts = row["prefix_hit_rate"] + sum(row.get(c, 0.0) for c in CAUSES)
    assert parts == pytest.approx(row["ideal_hit_rate"], abs=1e-9)
    assert row.get("reuse_gap_window", 0) >= 0 and row.get("reuse_gap_state", 0) >= 0
    state = options["model"].startswith("qwen")
    assert ("reuse_gap_state" in row) == state and ("reuse_gap_window" in row) != state


def test_mamba_mode_none_loses_every_hit_to_the_state_rule():
    """vLLM turns prefix caching off for a model with state layers in mode none: the rule,
    not capacity, loses what an infinite cache would have hit."""
    row = row_of(**QWEN, workload="kshot", policy="vllm", kv_tokens=20_000,
                 mamba_cache_mode="none")
    assert row["prefix_hit_rate"] == 0 and row["reuse_gap_capacity"] == 0
    assert row["reuse_gap_state"] > 0.3


def test_a_full_attention_run_keeps_its_columns():
    row = row_of(workload="kshot", kv_tokens=8192, latency="constant", max_context_len=4096)
    assert "reuse_gap_state" not in row and "reuse_gap_window" not in row
    assert "the state-boundary rule" not in reuse_sentence(row)
