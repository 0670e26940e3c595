"""benchmarks/mutations.py: the named-mutation list stays anchored to the code (each original
text exactly once, so a refactor that moves it shows here first, not as a silent no-op
mutation), and the runner tells a killed mutation from a surviving one. About 3 s: one tiny
pytest run per outcome in a throwaway tree, no simulation."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import mutations as mut  # noqa: E402


def test_every_mutation_is_anchored_once_and_named_once() -> None:
    mut.check_list(REPO, mut.MUTATIONS)
    names = [m.name for m in mut.MUTATIONS]
    assert len(names) == len(set(names)) >= 15
    assert {m.file.split("/")[0] for m in mut.MUTATIONS} >= {"kvcore", "simulator",
                                                             "experiments"}
    for m in mut.MUTATIONS:
        assert m.original != m.replacement and m.tests, m.name


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "calc.py").write_text("def double(x):\n    return x * 2\n")
    (tmp_path / "test_calc.py").write_text(
        "from calc import double\n\n\ndef test_double():\n    assert double(3) == 6\n\n\n"
        "def test_zero():\n    assert double(0) == 0\n")
    return tmp_path


def test_runner_reports_killed_survived_and_drift(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    killed = mut.run_one(root, mut.Mutation("times-three", "calc.py", "x * 2", "x * 3",
                                            ("test_calc.py",)), timeout=120)
    assert (killed.status, killed.killed_by) == ("killed", "test_calc.py::test_double")
    survived = mut.run_one(root, mut.Mutation("x-plus-x", "calc.py", "x * 2", "x + x",
                                              ("test_calc.py",)), timeout=120)
    assert (survived.status, survived.killed_by) == ("survived", "")
    assert (root / "calc.py").read_text() == "def double(x):\n    return x * 2\n"  # restored
    drift = mut.Mutation("gone", "calc.py", "x * 4", "x * 5", ("test_calc.py",))
    gone = re.escape("gone: calc.py: original text found 0 times")
    with pytest.raises(mut.ListDrift, match=gone):
        mut.check_list(root, (drift,))
    missing = mut.Mutation("no-test", "calc.py", "x * 2", "x * 5", ("test_gone.py",))
    with pytest.raises(mut.ListDrift, match=re.escape("test file test_gone.py missing")):
        mut.check_list(root, (missing,))
