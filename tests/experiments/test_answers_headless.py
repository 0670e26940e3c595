"""The use cases (experiments/answers/) and what they build on (experiments/options/,
experiments/execution/) import no command-line framework: neither typer nor rich (the
terminal's tables and colours, experiments/console/ and reports' views) is loaded by
importing them, so a library caller or a worker process gets the answers without the console.
Each module is imported alone in a fresh interpreter. About 30 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADLESS = ("answers", "options", "execution")
PRESENTATION = ("typer", "click", "rich")


def _modules() -> list[str]:
    out = []
    for folder in HEADLESS:
        for path in sorted((ROOT / "experiments" / folder).glob("*.py")):
            name = "" if path.stem == "__init__" else f".{path.stem}"
            out.append(f"experiments.{folder}{name}")
    return out


def _loaded(modules: list[str]) -> dict[str, list[str]]:
    """module -> the presentation packages that importing it alone, in a fresh interpreter,
    loads."""
    out = {}
    for m in modules:
        probe = (f"import json, sys, {m}; "
                 f"print(json.dumps([p for p in {PRESENTATION!r} if p in sys.modules]))")
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           cwd=ROOT, check=True)
        out[m] = json.loads(r.stdout)
    return out


def test_the_use_cases_are_found():
    mods = _modules()
    assert {"experiments.answers.runner", "experiments.answers.capacity",
            "experiments.options.run_options", "experiments.execution.executors"} <= set(mods)


@pytest.mark.parametrize("folder", HEADLESS)
def test_no_use_case_imports_the_console(folder: str):
    mods = [m for m in _modules() if m.startswith(f"experiments.{folder}")]
    loaded = _loaded(mods)
    assert {m: p for m, p in loaded.items() if p} == {}


def test_the_check_sees_the_console():
    """The same check on a console module finds typer: it would see a use case that
    imported one."""
    assert "typer" in _loaded(["experiments.console.command_errors"])[
        "experiments.console.command_errors"]
