"""docs/cli.md generated whole, the grid axes from the field metadata, and the spellings
above kvcore. Cost: about 2 s in all (no simulation runs; the typer app is built once)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli import app, cli_reference
from experiments.console.cli_reference import render
from experiments.options.grid import SWEEP_AXES
from experiments.options.run_options import OPTIONS, SPECS
from experiments.options.spellings import SPELLINGS, check_spellings
from kvcore.contract import fields as kvcore_fields

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_generated_whole():
    """The whole file, not a part of it: a panel left out of the generator (the host tier's
    was) or a hand edit fails here."""
    assert DOC.read_text(encoding="utf-8") == cli_reference(), (
        "docs/cli.md is not what the generator writes; regenerate it with: "
        "kvsim cli-reference > docs/cli.md (prose in experiments/console/cli_reference.md)")


def test_every_panel_and_command_is_in_the_doc():
    doc = DOC.read_text(encoding="utf-8")
    for o in OPTIONS.values():
        assert f"| `{o.flag}`" in doc, o.name
    assert "#### Host KV tier" in doc and "#### Grid axes" in doc
    for name in ("run", "sweep", "compare", "plan", "capacity", "trace stats", "calibrate"):
        assert f"| `kvsim {name}" in doc


def test_render_refuses_a_command_without_a_row_or_a_row_twice():
    with pytest.raises(ValueError, match="commands without a row: \\['nosuch'\\]"):
        render({"nosuch": "kvsim nosuch"}, template="no rows\n")
    with pytest.raises(ValueError, match="rows given twice: \\['run'\\]"):
        render({"run": "kvsim run"}, template="<<usage run>> <<usage run>>\n")
    with pytest.raises(ValueError, match="rows for no command: \\['gone'\\]"):
        render({}, template="<<usage gone>>\n")


def test_sweep_axes_are_the_fields_declared_axis():
    """Every axis comes from `axis=True` on its field; its list flag is the plural."""
    declared = {f.metadata.get("option") or f.name for cls in SPECS.values()
                for f in dataclasses.fields(cls) if f.metadata.get("axis")}
    assert set(SWEEP_AXES) == declared
    assert SWEEP_AXES["page_size"] == "--page-sizes" and SWEEP_AXES["policy"] == "--policies"
    assert SWEEP_AXES["kv_tokens"] == "--kv-tokens"
    assert list(SWEEP_AXES)[:2] == ["page_size", "policy"]


def test_every_axis_is_a_list_flag_of_sweep():
    sweep = typer.main.get_command(app).commands["sweep"]
    flags = {o for p in sweep.params for o in p.opts}
    assert set(SWEEP_AXES.values()) <= flags


def test_kv_tokens_is_one_list_flag_run_takes_one_value():
    r = CliRunner().invoke(app, ["run", "--kv-tokens", "1024,2048"])
    assert r.exit_code == 2
    assert "--kv-tokens '1024,2048': kvsim run runs one value; kvsim sweep" in r.output


def test_kvcore_fields_know_no_command_line():
    """Flag spellings and what they imply live above kvcore (experiments/options/spellings.py)."""
    params = inspect.signature(kvcore_fields.spec_field).parameters
    assert "flags" not in params and "implies" not in params
    f = {f.name: f for f in dataclasses.fields(SPECS["memory"])}["mem_fraction"]
    assert "flags" not in f.metadata and "implies" not in f.metadata
    assert OPTIONS["mem_fraction"].flags == SPELLINGS["mem_fraction"]


def test_check_spellings_refuses_an_unknown_option_or_a_twin(monkeypatch):
    check_spellings(set(OPTIONS))
    with pytest.raises(ValueError, match="SPELLINGS names 'duration_s', which is no option"):
        check_spellings({"page_size"})
    monkeypatch.setitem(SPELLINGS, "page_size", ("--block-size", "--block-size"))
    with pytest.raises(ValueError, match="spelling --block-size is given twice"):
        check_spellings(set(OPTIONS))
