"""Every command through the CLI runner, good and bad arguments."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from reports.schema import METRICS, PARTS_PCT
from tests.cli.conftest import TINY

# k-shot draws its own prompts: TINY without --input-len (refused there)
KSHOT_TINY = [a for i, a in enumerate(TINY) if "--input-len" not in (a, TINY[i - 1])]

FIXTURES = Path(__file__).resolve().parents[1] / "workloads" / "fixtures"


def assert_png_not_blank(path: Path) -> None:
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50
    assert float(np.var(img)) > 0


def test_default_run_prints_the_breakdown(invoke):
    r = invoke("run")
    assert r.exit_code == 0, r.output
    for needle in ("token states", "internal frag.", "free", "TTFT p50 / p99", "sharegpt"):
        assert needle in r.stdout


def test_run_writes_outputs_and_events(invoke, tmp_path):
    out, ev = tmp_path / "run", tmp_path / "events.json"
    r = invoke("run", *TINY, "--out", out, "--events", ev)
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "summary.csv")
    assert len(df) == 1 and df.columns[0] == "config_hash"
    for col in ("policy", "placement", "page_size", "workload", "seed", "rate_req_s", "model",
                "gpu", "kv_tokens", "admission", "schedule", *METRICS):
        assert col in df.columns, col
    assert list(df.columns).index("requests_completed") > list(df.columns).index("schedule")
    assert df[list(PARTS_PCT)].sum(axis=1).iloc[0] == pytest.approx(100.0, abs=1e-6)
    assert df.kv_tokens.iloc[0] == 4096 and df.max_context_len.iloc[0] == 2048
    req = pd.read_parquet(out / "requests.parquet")
    assert len(req) == 12 and (req.config_hash == df.config_hash.iloc[0]).all()
    assert len(pd.read_parquet(out / "timeline.parquet")) > 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config_hash"] == df.config_hash.iloc[0]
    trace = json.loads(ev.read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    assert {e["cat"] for e in spans} == {"prefill", "decode"}
    assert all(e["dur"] >= 0 for e in spans)
    assert {e["tid"] for e in spans if e["cat"] == "prefill"} == set(req.request_id)
    counters = [e for e in trace if e["ph"] == "C" and e["name"].startswith("KV memory")]
    assert counters and set(counters[0]["args"]) >= {"token_states", "free"}
    # config.json re-runs the same configuration
    r2 = invoke("run", "--config", out / "config.json", "--out", tmp_path / "again")
    assert r2.exit_code == 0, r2.output
    assert pd.read_csv(tmp_path / "again" / "summary.csv").config_hash.iloc[0] == \
        df.config_hash.iloc[0]


def test_toml_config_and_flag_override(invoke, tmp_path):
    toml = tmp_path / "exp.toml"
    toml.write_text('policy = "vllm"\npage-size = 32\nnum_requests = 12\nkv_tokens = 4096\n'
                    'latency = "constant"\nmax_context_len = 2048\n')
    r = invoke("run", "--config", toml, "--page-size", "8", "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    row = pd.read_csv(tmp_path / "o" / "summary.csv").iloc[0]
    assert (row.policy, row.page_size) == ("vllm", 8)
    toml.write_text('pagesize = 3\n')
    r = invoke("run", "--config", toml)
    assert r.exit_code == 2 and "pagesize" in r.stderr


def test_compare_plot_and_report(invoke, tmp_path):
    out = tmp_path / "cmp"
    r = invoke("compare", *TINY, "--policies", "paged,vllm,contiguous-pow2", "--out", out)
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "summary.csv")
    assert list(df.policy) == ["paged", "vllm", "contiguous-pow2"]
    for name in ("breakdown.png", "latency_cdf.png", "memory_timeline.png"):
        assert_png_not_blank(out / "figures" / name)
    r = invoke("plot", out, "--out", tmp_path / "figs")
    assert r.exit_code == 0, r.output
    assert_png_not_blank(tmp_path / "figs" / "breakdown.png")
    r = invoke("report", out)
    assert r.exit_code == 0, r.output
    md = (out / "report.md").read_text()
    assert "| policy" in md and "figures/breakdown.png" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3


def test_listings_one_line_each(invoke):
    from kvcore.model.presets import GPUS, MODELS
    from kvcore.policies import policy_names
    from workloads import list_workloads

    for cmd, names in (("models", MODELS), ("gpus", GPUS), ("workloads", list_workloads()),
                       ("policies", policy_names())):
        r = invoke(cmd)
        assert r.exit_code == 0, r.output
        lines = r.stdout.strip().splitlines()
        for n in names:
            assert sum(line.startswith(n + " ") for line in lines) == 1, (cmd, n)


def test_trace_stats(invoke):
    r = invoke("trace", "stats", FIXTURES / "burstgpt_sample.csv", "--page-size", "16")
    assert r.exit_code == 0, r.output
    assert "input" in r.stdout and "ideal prefix reuse at page size 16" in r.stdout
    r = invoke("trace", "stats", "kshot", "--num-requests", "20", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rows"] == 20
    r = invoke("trace", "stats", "/no/such/file.csv")
    assert r.exit_code == 2 and "no such file" in r.stderr


def test_plan_static_and_json(invoke):
    r = invoke("plan", "--model", "opt-13b", "--kv-mem-gib", "12", "--page-size", "1",
               "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["kv_tokens"] == 15728 and d["kv_bytes_per_token"] == 819200
    r = invoke("plan", "--model", "llama-3.1-70b", "--gpu", "h100", "--tp", "4")
    assert r.exit_code == 0 and "KV bytes per token" in r.stdout


def test_plan_recommends_a_page_size(invoke, tmp_path):
    out = tmp_path / "plan"
    r = invoke("plan", *KSHOT_TINY, "--workload", "kshot", "--prefix-len", "200",
               "--question-len", "20", "--page-sizes", "1,16,64", "--out", out, "--json")
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)["recommendation"]
    assert rec["page_size"] in (1, 16, 64) and len(rec["rows"]) == 3
    assert_png_not_blank(out / "figures" / "prefix_hit_rate_vs_page_size.png")


@pytest.mark.parametrize("flag, bar", [("--progress", True), ("--no-progress", False)])
def test_plan_progress_flag(invoke, tmp_path, flag, bar):
    """plan takes --progress / --no-progress like run and compare; the bar goes to stderr."""
    r = invoke("plan", *KSHOT_TINY, "--workload", "kshot", "--prefix-len", "200",
               "--question-len", "20", "--page-sizes", "1,16", "--out", tmp_path / "p", flag)
    assert r.exit_code == 0, r.output
    assert ("plan:" in r.stderr) == bar


@pytest.mark.parametrize("args, needle", [
    (["run", "--policy", "nope"], "--policy"),
    (["run", "--page-size", "abc"], "--page-size"),
    (["run", "--page-size", "0"], "--page-size"),
    (["run", "--kv-tokens", "100", "--kv-mem-gib", "3"], "at most one"),
    (["run", "--num-pages", "4", "--budget", "vllm"], "--budget"),
    (["run", "--budget", "tgi"], "--budget"),
    (["run", "--mem-fraction", "2", "--budget", "vllm"], "--mem-fraction"),
    (["run", "--workload", "nope"], "--workload"),
    (["run", "--trace", "/no/such/trace.csv"], "/no/such/trace.csv"),
    (["run", "--model", "gpt-5"], "--model"),
    (["run", "--model", "deepseek-v3", "--gpu", "rtx-4090"], "does not fit"),
    (["run", "--bogus"], "--bogus"),
    (["sweep", "--page-sizes", "1,x"], "--page-sizes"),
    (["sweep", "--policies", "paged,nope"], "--policy"),
    (["sweep", "--jobs", "0"], "--jobs"),
    (["compare", "--policies", "nope"], "--policy"),
    (["plot", "/no/such/dir"], "DIR"),
    (["report", "/no/such/dir"], "DIR"),
    (["trace", "stats", "x.csv", "--page-size", "0"], "--page-size"),
    (["nosuch"], "nosuch"),
])
def test_user_errors_exit_2_with_one_line(invoke, args, needle, tmp_path):
    r = invoke(*args, "--out", tmp_path) if args[0] in ("sweep", "compare") else invoke(*args)
    assert r.exit_code == 2, (args, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0] and "Traceback" not in r.output


def test_debug_shows_the_exception(invoke):
    r = invoke("--debug", "run", "--policy", "nope")
    assert r.exit_code != 0 and isinstance(r.exception, ValueError)


@pytest.mark.parametrize("bug", ["livelock", "invariant"])
def test_a_simulator_bug_exits_3_with_one_line(invoke, monkeypatch, bug):
    """A bug the engine catches in itself is not the user's mistake (status 2) and not a
    traceback either: status 3 and one line that says it is a bug, with the engine's message."""
    import simulator.run
    from kvcore.contract.validation import InvariantError
    from simulator.guard import LivelockError

    error = (LivelockError("livelock at t=1.0 s: 10001 preemptions") if bug == "livelock"
             else InvariantError("page 7 owned twice"))

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(simulator.run, "simulate", broken)
    r = invoke("run", *TINY)
    assert r.exit_code == 3, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "kvsim bug" in lines[0] and str(error) in lines[0]
    assert "Traceback" not in r.output


def test_empty_results_dir_is_a_user_error(invoke, tmp_path):
    r = invoke("report", tmp_path)
    assert r.exit_code == 2 and "summary.csv" in r.stderr


def test_trace_stats_length_only_trace_takes_a_rate(invoke):
    """A ShareGPT length file has no timestamps: --rate gives it Poisson arrivals."""
    import workloads

    path = str(Path(workloads.__file__).parent / "data"
               / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
    res = invoke("trace", "stats", path, "--rate", "2", "--num-requests", "200", "--json")
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    assert stats["rows"] == 200 and 1.0 < stats["rate"] < 4.0
    bad = invoke("trace", "stats", path, "--rate", "0")
    assert bad.exit_code == 2 and "--rate" in bad.output
