"""Latency profiles and attention backends through the CLI: the profile by budget rule, the
profile named in every output, page sizes a backend cannot run refused before any sweep cell
runs, and the memory-only note where the kernel walks page 1.

Cost: about 6 s (four tiny simulations of six requests).
"""

from __future__ import annotations

import pandas as pd
from typer.testing import CliRunner

from cli import app
from experiments.options.grid import page_sizes_for
from experiments.options.run_options import RunOptions

TINY = ["--workload", "kshot", "--num-requests", "6", "--kv-tokens", "8192",
        "--max-context-len", "4096", "--no-progress"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "240", "TERMINAL_WIDTH": "240"})


def test_profile_by_budget_rule_and_named_in_the_outputs(tmp_path):
    r = invoke("run", *TINY[:-1], "--latency-profile", "vllm-paper-2023", "--out",
               str(tmp_path / "a"))
    assert r.exit_code == 0, r.output
    assert "latency vllm-paper-2023, paged-attention-v1-2023" in r.output
    assert "ITL p50 / p99" in r.output
    row = pd.read_csv(tmp_path / "a" / "summary.csv").iloc[0]
    assert (row["latency_profile"], row["page_head_overhead_s"]) == ("vllm-paper-2023", 1.5e-9)
    assert row["itl_p50_s"] > 0
    opts = RunOptions.from_mapping({"budget": "vllm"})
    assert opts.resolved()["latency_profile"] == "vllm-hopper"
    assert opts.resolved()["attention_backend"] == "fa3"
    assert RunOptions().resolved()["latency_profile"] == "sglang-hopper"
    assert opts.config_hash() != RunOptions.from_mapping(
        {"budget": "vllm", "latency_profile": "vllm-paper-2023"}).config_hash()


def test_a_page_size_the_backend_cannot_run_stops_the_sweep_first(tmp_path):
    out = tmp_path / "s"
    r = invoke("sweep", "--workload", "kshot", "--num-requests", "6", "--budget", "vllm",
               "--page-sizes", "16,8", "--no-plot", "--no-progress", "--out", str(out))
    assert r.exit_code == 2, r.output
    assert "--page-size 8: vllm's fa3 attention backend runs multiples of 16" in r.output
    assert not (out / "summary.csv").exists()
    # the default list loses what the backend cannot run, and says so
    text, notes = page_sizes_for(RunOptions.from_mapping({"budget": "vllm"}), None)
    assert text == "16,32,64,128,256" and "page sizes 1, 2, 4, 8 left out" in notes[0]
    text, _ = page_sizes_for(RunOptions.from_mapping(
        {"budget": "vllm", "attention_backend": "flashinfer"}), None)
    assert text == "16,32,64"
    assert page_sizes_for(RunOptions(), "1,16") == ("1,16", [])


def test_page_one_inside_the_kernel_is_a_memory_only_page_size(tmp_path):
    out = tmp_path / "fi"
    r = invoke("sweep", *TINY, "--attention-backend", "flashinfer", "--page-sizes", "1,64",
               "--no-plot", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "page 1 inside the kernel: the page size is a memory-only choice" in r.output
    df = pd.read_csv(out / "summary.csv").sort_values("page_size")
    assert list(df.kernel_page_size) == [1, 1]
    assert list(df.attention_backend) == ["flashinfer", "flashinfer"]
