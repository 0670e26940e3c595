"""`kvsim validate`: prints the report, writes a file only when --out is given."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import validation
from reports.validation_report import render_validation_markdown, summary_line

# the full validation run is a session fixture (about 4 minutes of one core): under
# `-n` (pyproject addopts) both of its users share one worker, so it is computed once
pytestmark = pytest.mark.xdist_group("validation")


def test_validate_writes_nothing_in_the_cwd_by_default(invoke, validation_run: pd.DataFrame,
                                                       tmp_path, monkeypatch) -> None:
    # the session fixture ran run_validation() for real in an empty directory; here the
    # command around it runs in another one
    monkeypatch.setattr(validation, "run_validation", lambda **_: validation_run)
    monkeypatch.chdir(tmp_path)
    r = invoke("validate", "--quick")
    assert r.exit_code == 0, r.output
    assert list(tmp_path.iterdir()) == []
    assert "## Paper rows simulated by kvsim" in r.stdout
    assert summary_line(validation_run) in r.stdout

    out = tmp_path / "elsewhere" / "report.md"
    r = invoke("validate", "--quick", "--out", out)
    assert r.exit_code == 0, r.output
    assert out.read_text() == render_validation_markdown(validation_run)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere"]
