"""The quick validation run: the rows that must hold on any machine, each row's kind, the
report writer and the drift check behind `python -m experiments.validation --check`."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import validation
from reports.validation_report import (
    COLUMNS,
    CROSS_CHECK,
    IDENTITY,
    KINDS,
    NOT_REPRODUCED,
    REPRODUCED,
    parse_report_rows,
    render_validation_markdown,
    report_drift,
    summary_line,
    write_validation_report,
)

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
# Rows that agree with the paper by arithmetic or construction: never counted as reproduced.
IDENTITIES = {
    "opt-13b x1 a100-40gb KV slots (K)",
    "opt-66b x4 a100-40gb KV slots (K)",
    "opt-175b x8 a100-80gb KV slots (K)",
    "Orca (Max) batch size",
    "Orca (Max) external frag. & others",
    "Orca (Oracle) internal frag.",
    "vLLM everything else",
    # the latency rows at the modern profiles' calibration points (latency_rows.py)
    *(f"vLLM v0.19.1 batch-1 ITL at {n:,} input tokens (ms)"
      for n in (1_000, 4_000, 20_000, 100_000)),
    "SGLang PR #4832 prefill at page 64 (s)",
    "SGLang PR #4832 decode step at page 64 (ms)",
}
CROSS_CHECKS = {
    "identical requests, oracle+buddy: slack / held (%)",
    "identical requests, paged 16: rounding / held (%)",
    "contiguous-max concurrency, 15,728 slots",
    "contiguous-max concurrency, 10,000 slots",
    *(f"{w} hit rate, page {p} (%)" for w in ("k-shot", "chat") for p in (1, 16, 64)),
}


@pytest.fixture(scope="module")
def quick(quick_validation: pd.DataFrame) -> pd.DataFrame:
    return quick_validation


def test_quick_rows_pass(quick: pd.DataFrame) -> None:
    assert list(quick.columns) == list(COLUMNS)
    by_name = quick.set_index("name")
    for name in MUST_PASS:
        row = by_name.loc[name]
        assert bool(row["pass"]), f"{name}: reference {row['reference']}, kvsim {row['kvsim']}"
    # the paper's 9.7K for OPT-66B needs 21.3 GiB, not the 21 GB it prints: a known miss
    assert not bool(by_name.loc["opt-66b x4 a100-40gb KV slots (K)", "pass"])
    assert by_name.loc["Orca (Max) batch size", "kvsim"] == pytest.approx(7.0, abs=5e-3)
    fig2 = quick[quick.section == "Fig. 2"]
    assert fig2["rate"].notna().all() and fig2["queue_backlog"].notna().all()
    assert quick.attrs["notes"]


def test_every_row_has_an_honest_kind(quick: pd.DataFrame) -> None:
    assert set(quick["kind"]) <= set(KINDS)
    kinds = dict(zip(quick["name"], quick["kind"], strict=True))
    assert {n for n, k in kinds.items() if k == IDENTITY} == IDENTITIES
    assert {n for n, k in kinds.items() if k == CROSS_CHECK} == CROSS_CHECKS
    paper = quick[quick["kind"].isin((REPRODUCED, NOT_REPRODUCED))]
    assert len(paper) == len(quick) - len(IDENTITIES) - len(CROSS_CHECKS)
    # a paper row is "reproduced" exactly when it passes its tolerance
    assert ((paper["kind"] == REPRODUCED) == paper["pass"].astype(bool)).all()
    # Oracle's internal fragmentation is not in the paper: no made-up reference value
    oracle = quick.set_index("name").loc["Orca (Oracle) internal frag."]
    assert oracle["reference"] == "not shown" and pd.isna(oracle["difference"])


def test_beam_search_rows_are_judged_by_tolerance(quick: pd.DataFrame) -> None:
    beam = quick[quick["name"].str.contains("beam search")].set_index("name")
    assert len(beam) == 3
    saved = [beam.loc[f"Alpaca beam search k={k} memory saved (%)", "kvsim"] for k in (2, 4, 6)]
    assert 0 < saved[0] < saved[1] < saved[2] < 100
    for name, row in beam.iterrows():
        within = abs(row["kvsim"] - row["reference"]) <= validation.FIG15_TOL
        assert row["kind"] == (REPRODUCED if within else NOT_REPRODUCED), name
        assert "trend" not in row["tolerance"]
    assert "beam" in quick.attrs["notes"]["Fig. 15 beam search"]


def test_report_has_one_table_per_kind_and_the_counts(quick: pd.DataFrame, tmp_path) -> None:
    out = write_validation_report(quick, tmp_path / "docs" / "validation.md")
    text = out.read_text()
    header = "| " + " | ".join(c.replace("_", " ") for c in COLUMNS) + " |"
    assert text.count(header) == 3
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == len(quick) + 3 * 2
    assert all(line.count("|") == len(COLUMNS) + 1 for line in table)
    sections = [text.index(s) for s in ("## Paper rows simulated by kvsim",
                                        "## Analytic identities", "## Closed-form cross-checks",
                                        "## Method notes")]
    assert sections == sorted(sections)
    n_rep = int((quick["kind"] == REPRODUCED).sum())
    n_paper = int(quick["kind"].isin((REPRODUCED, NOT_REPRODUCED)).sum())
    line = summary_line(quick)
    assert line.startswith(f"Reproduced: {n_rep} of {n_paper} paper rows within tolerance")
    assert f"analytic identities: {len(IDENTITIES)} (" in line
    assert f"closed-form cross-checks: {len(CROSS_CHECKS)} of {len(CROSS_CHECKS)} pass" in line
    assert line in text
    assert not list(out.parent.glob(".validation.md.*"))  # no temporary file left behind


def test_drift_check(quick: pd.DataFrame) -> None:
    committed = render_validation_markdown(quick)
    assert report_drift(quick, committed) == []
    moved = quick.copy()
    moved.attrs = quick.attrs
    i = moved.index[moved["name"] == "Orca (Pow2) token states"][0]
    moved.at[i, "kvsim"] = moved.at[i, "kvsim"] + 0.004  # inside print precision
    assert report_drift(moved, committed) == []
    moved.at[i, "kvsim"] = moved.at[i, "kvsim"] + 0.5
    drift = report_drift(moved, committed)
    assert len(drift) == 1 and "Orca (Pow2) token states: kvsim" in drift[0]
    moved = quick.copy()
    moved.attrs = quick.attrs
    j = moved.index[moved["name"] == "vLLM everything else"][0]
    moved.at[j, "kind"] = REPRODUCED
    assert any("vLLM everything else: kind" in d for d in report_drift(moved, committed))
    assert any("no longer produced" in d for d in report_drift(quick.iloc[1:], committed))


def test_doc_generator_check_and_write(quick: pd.DataFrame, tmp_path, monkeypatch,
                                       capsys) -> None:
    monkeypatch.setattr(validation, "run_validation", lambda **_: quick)
    report = tmp_path / "validation.md"
    assert validation.main(["--out", str(report)]) == 0
    assert report.read_text() == render_validation_markdown(quick)
    assert validation.main(["--check", "--out", str(report)]) == 0
    report.write_text(report.read_text().replace("| Orca (Pow2) token states |",
                                                 "| Orca (Pow2) token states (old) |"))
    assert validation.main(["--check", "--out", str(report)]) == 1
    assert "row no longer produced" in capsys.readouterr().out
    assert validation.REPO_REPORT.parts[-2:] == ("docs", "validation.md")
    assert (validation.REPO_REPORT.parent.parent / "experiments" / "validation"
            / "__init__.py").is_file()


def test_committed_report_is_consistent() -> None:
    """docs/validation.md as committed: every row has a kind, paper rows pass exactly when they
    are reproduced, and its counts line agrees with its own rows (the values themselves are
    held to a fresh run by `python -m experiments.validation --check`)."""
    text = validation.REPO_REPORT.read_text(encoding="utf-8")
    rows = list(parse_report_rows(text).values())
    assert len(rows) >= 40
    kinds = [r["kind"] for r in rows]
    assert set(kinds) <= set(KINDS)
    for r in rows:
        if r["kind"] in (REPRODUCED, NOT_REPRODUCED):
            assert (r["pass"] == "yes") == (r["kind"] == REPRODUCED), r["name"]
    names = {r["name"] for r in rows}
    assert names >= IDENTITIES | CROSS_CHECKS
    assert {r["name"] for r in rows if r["kind"] == IDENTITY} == IDENTITIES
    cross = [r for r in rows if r["kind"] == CROSS_CHECK]
    ident = [r for r in rows if r["kind"] == IDENTITY]
    line = (f"Reproduced: {kinds.count(REPRODUCED)} of "
            f"{kinds.count(REPRODUCED) + kinds.count(NOT_REPRODUCED)} paper rows within "
            f"tolerance; not reproduced: {kinds.count(NOT_REPRODUCED)}; analytic identities: "
            f"{len(ident)} ({sum(r['pass'] == 'yes' for r in ident)} match the paper's printed "
            f"value); closed-form cross-checks: {sum(r['pass'] == 'yes' for r in cross)} of "
            f"{len(cross)} pass.")
    assert line in text
