"""kvcore type-checks clean with mypy at its default strictness (configured in pyproject.toml),
so CI's pytest run covers it. The first run in a fresh checkout analyses torch's and numpy's
annotations (about a minute on a small machine); later runs reuse .mypy_cache."""

from __future__ import annotations

from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[2]


def test_kvcore_is_mypy_clean() -> None:
    stdout, stderr, status = api.run(
        ["--config-file", str(ROOT / "pyproject.toml"), str(ROOT / "kvcore")]
    )
    assert status == 0, f"mypy kvcore:\n{stdout}{stderr}"
