"""Issue 17 item 5: the engines' own option names, early checks (TP against the model's
heads, a writable --out, a model directory), the latency calibration options, and a
progress bar that moves per simulated request."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from experiments.execution.progress import RequestBar
from experiments.options.run_options import RunOptions
from kvcore.model.memory import MemorySpec, check_tp
from kvcore.model.presets import get_model
from reports.io import check_writable
from simulator.latency import make_latency_model

TINY = ["--workload", "kshot", "--num-requests", "6", "--kv-tokens", "8192",
        "--max-context-len", "4096", "--latency", "roofline"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "240", "TERMINAL_WIDTH": "240"})


def test_engine_spellings_set_the_same_options():
    o = RunOptions.from_mapping({"block_size": 32, "max_num_seqs": 8,
                                 "gpu_memory_utilization": 0.8})
    assert (o.policy.page_size, o.engine.max_running_requests) == (32, 8)
    assert (o.memory.mem_fraction, o.memory.budget) == (0.8, "vllm")
    s = RunOptions.from_mapping({"mem-fraction-static": 0.85})
    assert (s.memory.mem_fraction, s.memory.budget) == (0.85, "sglang")
    assert s.resolved_kv_tokens() == RunOptions.from_mapping(
        {"mem_fraction": 0.85, "budget": "sglang"}).resolved_kv_tokens()


@pytest.mark.parametrize("values, needle", [
    ({"gpu_memory_utilization": 0.8, "budget": "sglang"}, "implies --budget vllm"),
    ({"mem_fraction": 0.8, "mem_fraction_static": 0.7}, "same option"),
    ({"page_size": 16, "block_size": 32}, "same option"),
])
def test_engine_spellings_that_contradict_are_errors(values, needle):
    with pytest.raises(ValueError, match=needle) as e:
        RunOptions.from_mapping(values)
    assert "\n" not in str(e.value)


def test_engine_spellings_on_the_command_line(tmp_path):
    r = invoke("plan", "--gpu-memory-utilization", "0.8", "--block-size", "32", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["budget_rule"] == "vllm" and doc["page_size"] == 32
    r = invoke("plan", "--mem-fraction-static", "0.8", "--budget", "vllm")
    assert r.exit_code == 2 and "--mem-fraction-static" in r.output
    r = invoke("run", *TINY, "--max-num-seqs", "2", "--chunked-prefill-size", "512",
               "--out", str(tmp_path / "seqs"))
    assert r.exit_code == 0, r.output
    row = json.loads((tmp_path / "seqs" / "config.json").read_text())["options"]
    assert (row["max_running_requests"], row["chunked_prefill_size"]) == (2, 512)
    cfg = tmp_path / "exp.toml"
    cfg.write_text("gpu-memory-utilization = 0.7\nblock-size = 64\n")
    r = invoke("plan", "--config", str(cfg), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["budget_rule"] == "vllm"
    # vLLM's default backend (FLASH_ATTN) runs multiples of 16: block 8 is refused, one line
    cfg.write_text("gpu-memory-utilization = 0.7\nblock-size = 8\n")
    r = invoke("plan", "--config", str(cfg), "--json")
    assert r.exit_code == 2 and "multiples of 16" in r.output, r.output


def test_prefix_caching_switch_maps_onto_the_policy():
    off = RunOptions.from_mapping({"policy": "vllm", "enable_prefix_caching": False})
    assert off.policy.policy == "paged-nocache"
    assert off.config_hash() == RunOptions.from_mapping({"policy": "paged-nocache"}).config_hash()
    assert RunOptions.from_mapping({"policy": "paged", "enable_prefix_caching": True}
                                   ).policy.policy == "paged"
    with pytest.raises(ValueError, match="--enable-prefix-caching needs a policy"):
        RunOptions.from_mapping({"policy": "contiguous-max", "enable_prefix_caching": True})
    r = invoke("run", *TINY, "--policy", "vllm", "--no-enable-prefix-caching")
    assert r.exit_code == 0, r.output
    assert "policy paged-nocache" in r.output


@pytest.mark.parametrize("model, tp, ok", [
    ("llama-3.1-8b", 2, True), ("llama-3.1-8b", 8, True), ("llama-3.1-8b", 16, True),
    ("llama-3.1-8b", 3, False), ("llama-3.1-8b", 64, False),  # 32 attention heads
    ("qwen2.5-7b", 4, True), ("qwen2.5-7b", 8, False),  # 28 heads: 8 does not divide
    ("opt-13b", 8, True), ("opt-13b", 16, False),  # 40 heads
    ("deepseek-v3", 16, True),  # MLA: one latent per rank, only the 128 heads count
])
def test_tp_must_divide_the_heads(model, tp, ok):
    if ok:
        check_tp(get_model(model), tp)
        assert MemorySpec(model=model, tp=tp).tp == tp
    else:
        with pytest.raises(ValueError, match=f"--tp {tp} does not") as e:
            MemorySpec(model=model, tp=tp)
        assert "\n" not in str(e.value)


def test_kv_heads_must_split_or_replicate_evenly():
    m = get_model("llama-3.1-8b")
    from dataclasses import replace

    odd = replace(m, id="odd", num_heads=24, num_kv_heads=6)
    check_tp(odd, 3)  # 6 KV heads, 2 per rank
    check_tp(odd, 12)  # replicated twice
    with pytest.raises(ValueError, match="6 KV heads"):
        check_tp(odd, 4)  # 24 heads split, but 6 KV heads neither split nor replicate evenly
    r = invoke("run", *TINY, "--tp", "3")
    assert r.exit_code == 2 and "--tp 3" in r.output


def test_model_directory_holding_config_json(tmp_path):
    d = tmp_path / "Llama-local"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(get_model("llama-3.1-8b").to_hf_config()))
    spec = MemorySpec(model_config=str(d))
    assert spec.model_config == str(d / "config.json")
    assert spec.model_preset().num_kv_heads == 8
    r = invoke("plan", "--model-config", str(d), "--json")
    assert r.exit_code == 0, r.output
    empty = tmp_path / "empty"
    empty.mkdir()
    r = invoke("plan", "--model-config", str(empty))
    assert r.exit_code == 2 and "without a config.json" in r.output


def _unwritable_dir(tmp_path: Path) -> Path:
    """A directory no one can create a file in, root included (the suite runs as root in CI):
    procfs refuses new files to every user; elsewhere (no /proc) a directory without write
    permission, which stops every user but root."""
    if Path("/proc/self").is_dir():
        return Path("/proc")
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    return ro


def test_out_must_be_writable_before_simulating(tmp_path):
    check_writable(tmp_path / "new" / "deeper")  # created later: its parent is writable
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        check_writable(blocker / "sub")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        check_writable(blocker)
    ro = _unwritable_dir(tmp_path)
    with pytest.raises(ValueError, match="not writable"):
        check_writable(ro / "out")
    for cmd in (["run", *TINY], ["sweep", *TINY, "--no-progress"],
                ["compare", *TINY, "--policies", "paged"],
                ["plan", *TINY, "--page-sizes", "16"]):
        r = invoke(*cmd, "--out", str(ro / "out"))
        assert r.exit_code == 2 and "not writable" in r.output, cmd
        assert not (ro / "out").exists()
        r = invoke(*cmd, "--out", str(blocker / "out"))  # its parent is a regular file
        assert r.exit_code == 2 and "is a file, not a directory" in r.output, cmd


def test_out_under_a_file_fails_before_any_simulation(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    for cmd in (["run", *TINY], ["compare", *TINY, "--policies", "paged"],
                ["plan", *TINY, "--page-sizes", "16"]):
        r = invoke(*cmd, "--out", str(blocker / "out"))
        assert r.exit_code == 2 and "--out" in r.output and "is a file" in r.output, cmd


def test_latency_calibration_options():
    # the overrides default to the profile's constants (sglang-hopper under the default rule)
    base = RunOptions()
    assert base.engine.page_head_overhead_s is None and base.engine.iteration_overhead_s is None
    assert base.engine_spec().latency_profile == "sglang-hopper"
    lm = make_latency_model("roofline", "llama-3.1-8b", "h100")
    assert (lm.page_head_overhead_s, lm.iteration_overhead_s) == (1.5e-9, 5e-3)
    slow = RunOptions.from_mapping({"iteration_overhead_s": 0.02, "page_head_overhead_s": 3e-9})
    assert slow.config_hash() != base.config_hash()
    got = slow.engine_spec().latency_constants(16)
    assert (got["page_head_overhead_s"], got["iteration_overhead_s"]) == (3e-9, 0.02)
    assert got["mbu"] == 0.936  # the rest stays the profile's
    with pytest.raises(ValueError, match="--iteration-overhead-s is an option of --latency "
                                         "roofline"):
        RunOptions.from_mapping({"latency": "constant", "iteration_overhead_s": 0.1})
    with pytest.raises(ValueError, match="--page-head-overhead-s must be in"):
        RunOptions.from_mapping({"page_head_overhead_s": -1.0})


def test_latency_calibration_moves_the_latency(tmp_path):
    import pandas as pd

    def latency(*extra: str) -> float:
        out = tmp_path / ("_".join(extra) or "base")
        r = invoke("run", *TINY, *extra, "--out", str(out))
        assert r.exit_code == 0, r.output
        return float(pd.read_csv(out / "summary.csv")["normalized_latency_s"].iloc[0])

    base = latency()
    assert latency("--iteration-overhead-s", "0.05") > base * 2
    assert latency("--page-size", "1", "--page-head-overhead-s", "1e-7") > \
        latency("--page-size", "1")


def test_request_bar_moves_per_request(tmp_path):
    from experiments.answers.runner import simulate_options
    from experiments.options.grid import cells

    runs = cells(RunOptions.from_mapping({"workload": "kshot", "num_requests": 5,
                                          "kv_tokens": 8192, "max_context_len": 4096}),
                 {"policy": ["paged", "vllm"]})
    bar = RequestBar(len(runs), enabled=False)
    seen = []
    for r in runs:
        simulate_options(r, progress=bar)
        seen.append(bar.done)
    bar.close()
    assert seen == [5, 10]  # per request, over both runs
    assert bar.total == 10


def test_help_has_examples_and_a_panel_per_spec():
    r = invoke("run", "--help")
    assert r.exit_code == 0
    for panel in ("Workload", "Policy", "Memory and model", "Engine", "Output", "Examples:"):
        assert panel in r.output, panel
    for flag in ("--block-size", "--gpu-memory-utilization", "--mem-fraction-static",
                 "--max-num-seqs", "--enable-prefix-caching", "--page-head-overhead-s",
                 "--iteration-overhead-s", "--latency-profile", "--attention-backend",
                 "--max-concurrency"):
        assert flag in r.output, flag
    for cmd in ("sweep", "compare", "plan", "plot", "report"):
        assert "Examples:" in invoke(cmd, "--help").output, cmd


def test_every_cli_example_parses():
    """Each example in --help names options that exist (checked by parsing, not running)."""
    from cli import EXAMPLES

    for text in EXAMPLES.values():
        for line in text.splitlines()[1:]:
            words = line.split("#")[0].split()
            if not words:
                continue
            assert words[0] == "kvsim"
            flags = [w for w in words if w.startswith("--")]
            cmd = words[1]
            r = invoke(cmd, "--help")
            assert r.exit_code == 0
            for f in flags:
                assert f in r.output, (cmd, f)
