"""`--engine vllm|sglang` (issue 38, item 8): one flag sets the policy, admission, budget rule
and latency profile to the engine's defaults; an explicit option wins flag by flag, level by
level (defaults < --config < command line); every running command echoes it first; the
summary and config.json carry it, and a run without it keeps its columns and hash."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from cli import app
from experiments.options.engines import ENGINE_DEFAULTS, apply_engine, engine_header
from experiments.options.run_options import OPTIONS, RunOptions

SMALL = ["--workload", "kshot", "--num-requests", "8", "--max-context-len", "4096",
         "--gpu-mem-gib", "20"]
MEMBERS = ("policy", "admission", "budget", "latency_profile")


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args],
                              env={"COLUMNS": "240", "TERMINAL_WIDTH": "240"})


def test_each_engine_sets_its_four_defaults_with_a_source():
    for name, e in ENGINE_DEFAULTS.items():
        assert tuple(d.option for d in e.defaults) == MEMBERS
        assert all(d.option in OPTIONS and d.source for d in e.defaults)
        o = RunOptions.from_mapping({"engine": name})
        assert {m: o.resolved()[m] for m in MEMBERS} == e.values()
    assert OPTIONS["engine"].allowed() == list(ENGINE_DEFAULTS)


def test_engine_vllm_is_the_three_flag_vllm_run():
    """Same options, same config hash, same numbers as the three flags it replaces."""
    a = RunOptions.from_mapping({"engine": "vllm"})
    b = RunOptions.from_mapping({"policy": "vllm", "admission": "vllm", "budget": "vllm"})
    assert a.config_hash() == b.config_hash()
    assert {k: v for k, v in a.resolved().items() if k != "engine"} == b.resolved()
    assert a.resolved()["engine"] == "vllm" and "engine" not in b.resolved()


def test_an_explicit_option_wins_flag_by_flag():
    o = RunOptions.from_mapping({"engine": "vllm", "admission": "sglang"})
    assert (o.policy.policy, o.engine.admission, o.memory.budget) == ("vllm", "sglang", "vllm")
    assert o.engine_spec().latency_profile == "vllm-hopper"
    # a pool sized directly leaves the budget rule nothing to size; the profile stays vLLM's
    d = RunOptions.from_mapping({"engine": "vllm", "kv_tokens": 4096})
    assert d.memory.budget is None and d.engine_spec().latency_profile == "vllm-hopper"
    c = RunOptions.from_mapping({"engine": "vllm", "latency": "constant"})
    assert c.engine.latency_profile is None and c.policy.policy == "vllm"
    # an engine's own spelling implies its budget rule: explicit, it wins over --engine
    g = RunOptions.from_mapping({"engine": "sglang", "gpu_memory_utilization": 0.8})
    assert (g.memory.budget, g.policy.policy) == ("vllm", "paged")
    assert g.engine_spec().latency_profile == "sglang-hopper"


def test_the_engine_applies_at_the_level_it_was_given():
    file_level = {"engine": "vllm", "policy": "paged"}
    assert apply_engine([file_level, {}])["policy"] == "paged"  # the file's own option wins
    assert apply_engine([file_level, {"engine": "sglang"}])["admission"] == "sglang"
    saved = RunOptions.from_mapping({"engine": "vllm"}).to_dict()  # a saved config.json
    over = apply_engine([saved, {"engine": "sglang"}])
    assert {m: over[m] for m in ("policy", "admission", "budget")} == {
        "policy": "paged", "admission": "sglang", "budget": "sglang"}
    assert apply_engine([{"kv_tokens": 8}, {"engine": "vllm"}]).get("budget") is None


def test_the_header_names_what_it_set_and_what_was_given_instead():
    line = engine_header(RunOptions.from_mapping({"engine": "vllm", "policy": "paged"}).to_dict())
    assert line == ("engine: vllm (vLLM v0.19.1 defaults): --admission vllm, --budget vllm, "
                    "--latency-profile vllm-hopper; given instead: --policy paged")
    assert engine_header(RunOptions().to_dict()) is None


@pytest.mark.parametrize("command", ["sweep", "compare"])
def test_a_grid_list_is_named_as_given_instead_of_the_engines_value(command, tmp_path):
    # every cell runs the listed policies, never the engine's: the header must not claim it
    extra = {"sweep": ["--page-sizes", "16", "--no-plot"], "compare": []}[command]
    r = invoke(command, *SMALL, "--engine", "vllm", "--policies", "paged", *extra,
               "--out", tmp_path / command)
    assert r.exit_code == 0, r.output
    head = r.stdout.splitlines()[0]
    assert head.endswith("given instead: --policies paged"), head
    assert "--policy vllm" not in head


@pytest.mark.parametrize("command", ["run", "sweep", "compare", "plan", "capacity"])
def test_every_running_command_echoes_the_engine_first(command, tmp_path):
    extra = {"sweep": ["--page-sizes", "16", "--no-plot", "--out", tmp_path / "s"],
             "compare": ["--policies", "vllm,paged", "--out", tmp_path / "c"],
             "plan": [], "capacity": ["--steps", "0"], "run": []}[command]
    r = invoke(command, *SMALL, "--engine", "vllm", *extra)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0].startswith("engine: vllm (vLLM v0.19.1 defaults)")
    plain = invoke(command, *SMALL, *extra) if command in ("run", "plan") else None
    assert plain is None or "engine:" not in plain.stdout


def test_summary_and_config_carry_the_engine_only_when_given(tmp_path):
    r = invoke("run", *SMALL, "--engine", "vllm", "--policy", "paged", "--out", tmp_path / "e")
    assert r.exit_code == 0, r.output
    row = pd.read_csv(tmp_path / "e" / "summary.csv").iloc[0]
    assert (row["engine"], row["policy"], row["admission"]) == ("vllm", "paged", "vllm")
    doc = json.loads((tmp_path / "e" / "config.json").read_text())
    assert doc["options"]["engine"] == "vllm" and doc["resolved"]["engine"] == "vllm"
    r = invoke("run", *SMALL, "--out", tmp_path / "n")
    assert "engine" not in pd.read_csv(tmp_path / "n" / "summary.csv").columns
    # the saved config re-runs as it was; --engine on the command line overrides its defaults
    rerun = invoke("run", "--config", tmp_path / "e" / "config.json", "--engine", "sglang",
                   "--out", tmp_path / "r")
    assert rerun.exit_code == 0, rerun.output
    row = pd.read_csv(tmp_path / "r" / "summary.csv").iloc[0]
    assert (row["engine"], row["policy"], row["admission"]) == ("sglang", "paged", "sglang")


def test_an_unknown_engine_is_one_line():
    r = invoke("run", "--engine", "trtllm")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "--engine" in r.stderr
