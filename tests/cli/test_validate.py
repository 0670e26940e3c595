"""`kvsim validate`: prints the report, writes a file only when --out is given."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import validation
from reports.validation_report import render_validation_markdown, summary_line


@pytest.fixture(scope="module")
def small_run() -> pd.DataFrame:
    """A real validation frame built as run_validation builds it, from the rows that need no
    simulation (Table 1, the hybrid models): this file tests the command around the run; the
    full run (about 4 minutes of one core) is computed once, for tests/experiments."""
    from experiments.validation import COLUMNS
    from experiments.validation.hybrid_rows import hybrid_rows
    from experiments.validation.vllm_paper import table1_rows

    rows = table1_rows() + hybrid_rows()
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in ("reference", "kvsim"):
        df[col] = pd.Series([r[col] for r in rows], dtype=object)
    df.attrs.update(notes={}, quick=True, wall_s=0.0)
    return df


def test_validate_writes_nothing_in_the_cwd_by_default(invoke, small_run: pd.DataFrame,
                                                       tmp_path, monkeypatch) -> None:
    # the command runs in an empty directory and must leave it empty
    monkeypatch.setattr(validation, "run_validation", lambda **_: small_run)
    monkeypatch.chdir(tmp_path)
    r = invoke("validate", "--quick")
    assert r.exit_code == 0, r.output
    assert list(tmp_path.iterdir()) == []
    assert "## Paper rows simulated by kvsim" in r.stdout
    assert summary_line(small_run) in r.stdout

    out = tmp_path / "elsewhere" / "report.md"
    r = invoke("validate", "--quick", "--out", out)
    assert r.exit_code == 0, r.output
    assert out.read_text() == render_validation_markdown(small_run)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere"]
