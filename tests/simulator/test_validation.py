"""The quick validation run: the rows that must hold on any machine, and the report writer."""

from __future__ import annotations

import pandas as pd
import pytest

from simulator.validation import COLUMNS, run_validation, write_validation_report

MUST_PASS = (
    "opt-13b x1 a100-40gb KV slots (K)",
    "opt-175b x8 a100-80gb KV slots (K)",
    "identical requests, oracle+buddy: slack / held (%)",
    "identical requests, paged 16: rounding / held (%)",
    "contiguous-max concurrency, 15,728 slots",
    "contiguous-max concurrency, 10,000 slots",
    "k-shot hit rate, page 1 (%)",
    "k-shot hit rate, page 16 (%)",
    "k-shot hit rate, page 64 (%)",
    "chat hit rate, page 1 (%)",
    "Orca (Max) batch size",
    "Orca (Max) external frag. & others",
    "vLLM token states",
)


@pytest.fixture(scope="module")
def quick() -> pd.DataFrame:
    return run_validation(quick=True)


def test_quick_rows_pass(quick: pd.DataFrame) -> None:
    assert list(quick.columns) == list(COLUMNS)
    by_name = quick.set_index("name")
    for name in MUST_PASS:
        row = by_name.loc[name]
        assert bool(row["pass"]), f"{name}: published {row['published']}, kvsim {row['kvsim']}"
    # the paper's 9.7K for OPT-66B needs 21.3 GiB, not the 21 GB it prints: a known miss
    assert not bool(by_name.loc["opt-66b x4 a100-40gb KV slots (K)", "pass"])
    assert by_name.loc["Orca (Max) batch size", "kvsim"] == pytest.approx(7.0, abs=5e-3)
    fig2 = quick[quick.section == "Fig. 2"]
    assert fig2["rate"].notna().all() and fig2["queue_backlog"].notna().all()
    assert quick.attrs["notes"]


def test_report_is_a_markdown_table(quick: pd.DataFrame, tmp_path) -> None:
    out = write_validation_report(quick, tmp_path / "docs" / "validation.md")
    text = out.read_text()
    header = "| " + " | ".join(c.replace("_", " ") for c in COLUMNS) + " |"
    assert header in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == len(quick) + 2
    assert all(line.count("|") == len(COLUMNS) + 1 for line in table)
    assert "## Method notes" in text
    assert not list(out.parent.glob(".validation.md.*"))  # no temporary file left behind
