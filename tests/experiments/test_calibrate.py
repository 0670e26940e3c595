"""`kvsim calibrate` recovers known constants from synthetic benchmark files generated with
the real latency model, and names file and field for malformed input.

Cost: about 4 s (a few fits of a few hundred observations, one tiny `kvsim run`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from cli import app
from experiments.answers.calibrate import Iteration, Observation, fit_profile
from simulator.latency import make_latency_model
from simulator.latency_profiles import PROFILES, LatencyProfile, load_profile, roofline_constants
from simulator.overload import unloaded_prefill_s

# the truth: vllm-hopper's held constants (request, page cost), other efficiencies and cost
TRUTH = replace(PROFILES["vllm-hopper"], name="truth", mfu=0.55, mbu=0.8,
                iteration_overhead_s=2.5e-3)


def bench_doc(truth: LatencyProfile, backend: str, n: int = 24, seed: int = 0) -> dict:
    """What a closed-loop (concurrency 1) benchmark of an engine running `truth` saves."""
    lm = make_latency_model("roofline", "llama-3.1-8b", "h100",
                            **roofline_constants(truth, None, 16))
    rng = np.random.default_rng(seed)
    inputs = [int(x) for x in rng.integers(256, 16000, n)]
    outputs = [int(x) for x in rng.integers(20, 80, n)]
    return {
        "backend": backend, "max_concurrency": 1, "request_rate": "inf",
        "input_lens": inputs, "output_lens": outputs,
        "ttfts": [unloaded_prefill_s(lm, i, 8192, 16) for i in inputs],
        "itls": [[lm.iteration_time((), [i + j], 16) for j in range(1, o)]
                 for i, o in zip(inputs, outputs, strict=True)],
    }


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_vllm_bench_json_recovers_the_constants(tmp_path: Path):
    f = tmp_path / "vllm.json"
    f.write_text(json.dumps(bench_doc(TRUTH, "vllm")))
    out = tmp_path / "mine.toml"
    r = invoke("calibrate", str(f), "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "fit error" in r.output and "held" in r.output
    p = load_profile(str(out))
    assert p.engine == "vllm" and p.attention_backend == "fa3"
    for k in ("mfu", "mbu", "iteration_overhead_s"):
        assert getattr(p, k) == pytest.approx(getattr(TRUTH, k), rel=0.01), k
    # batch 1 and one page size cannot tell request or page cost apart: held at the base's
    assert p.request_overhead_s == TRUTH.request_overhead_s
    # the profile file drives a run, and the run says which profile it used
    run_out = tmp_path / "run"
    r = invoke("run", "--workload", "sharegpt", "--num-requests", "5", "--budget", "vllm",
               "--latency-profile", str(out), "--out", str(run_out), "--no-progress")
    assert r.exit_code == 0, r.output
    row = pd.read_csv(run_out / "summary.csv").iloc[0]
    assert row["latency_profile"] == str(out) and row["attention_backend"] == "fa3"


def test_sglang_json_lines_read_the_last_run(tmp_path: Path):
    truth = replace(TRUTH, engine="sglang")
    older = bench_doc(replace(truth, mbu=0.5), "sglang", seed=1)
    f = tmp_path / "sglang.jsonl"
    f.write_text(json.dumps(older) + "\n" + json.dumps(bench_doc(truth, "sglang")) + "\n")
    out = tmp_path / "s.json"
    r = invoke("calibrate", str(f), "--out", str(out))
    assert r.exit_code == 0, r.output
    p = load_profile(str(out))
    assert p.engine == "sglang" and p.mbu == pytest.approx(0.8, rel=0.01)


def test_step_csv_with_noise_recovers_every_constant(tmp_path: Path):
    truth = LatencyProfile("t", "sglang", "fa3", mfu=0.6, mbu=0.85, request_overhead_s=40e-6,
                           iteration_overhead_s=1.5e-3, page_head_overhead_s=3e-10)
    rng = np.random.default_rng(3)
    rows, obs = [], []
    for _ in range(300):
        ps, b = int(rng.choice([1, 16, 64])), int(rng.choice([1, 8, 32, 128]))
        ctx, pre = int(rng.integers(200, 30000)), int(rng.choice([0, 0, 0, 4096]))
        lm = make_latency_model("roofline", "llama-3.1-8b", "h100",
                                **roofline_constants(truth, None, ps))
        t = lm.iteration_time([(pre, 0)] if pre else [], [ctx] * b, ps)
        t *= 1 + rng.normal(0, 0.01)
        rows.append({"batch_size": b, "context_len": ctx, "step_time_ms": t * 1e3,
                     "page_size": ps, "prefill_tokens": pre})
        obs.append(Observation((Iteration(((pre, 0),) if pre else (), (ctx,) * b, ps),), t,
                               ""))
    f = tmp_path / "steps.csv"
    pd.DataFrame(rows).to_csv(f, index=False)
    out = tmp_path / "steps.toml"
    r = invoke("calibrate", str(f), "--out", str(out))
    assert r.exit_code == 0, r.output
    p = load_profile(str(out))
    for k in ("mfu", "mbu", "iteration_overhead_s", "request_overhead_s",
              "page_head_overhead_s"):
        assert getattr(p, k) == pytest.approx(getattr(truth, k), rel=0.05), k
    fit = fit_profile(obs, PROFILES["sglang-hopper"], "llama-3.1-8b", "h100")
    assert len(fit.fitted) == 5 and 0.005 < fit.rms_error < 0.02  # the 1 % noise


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.pop("itls"), "field 'itls' missing"),
    (lambda d: d.update(max_concurrency=None), "field 'max_concurrency' is None"),
    (lambda d: d.update(ttfts=d["ttfts"][:-1]), "field 'ttfts' has 23 entries"),
    (lambda d: d["itls"].__setitem__(2, [0.01, -1]), "request 2: field 'itls'"),
])
def test_malformed_benchmark_files_name_file_and_field(tmp_path: Path, mutate, needle):
    doc = bench_doc(TRUTH, "vllm")
    mutate(doc)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    r = invoke("calibrate", str(f), "--out", str(tmp_path / "p.toml"))
    assert r.exit_code == 2 and needle in r.output and str(f) in r.output, r.output
    assert not (tmp_path / "p.toml").exists()


def test_malformed_csv_names_line_and_column(tmp_path: Path):
    f = tmp_path / "bad.csv"
    f.write_text("batch_size,context_len,step_time_s\n4,1000,0.01\n4,lots,0.01\n")
    r = invoke("calibrate", str(f), "--out", str(tmp_path / "p.toml"))
    assert r.exit_code == 2 and f"{f}:3: column 'context_len'" in r.output, r.output
    f.write_text("batch,step\n1,2\n")
    r = invoke("calibrate", str(f), "--out", str(tmp_path / "p.toml"))
    assert r.exit_code == 2 and "needs columns batch_size" in r.output
    r = invoke("calibrate", str(f), "--out", str(tmp_path / "p.yaml"))
    assert r.exit_code == 2 and ".toml or .json" in r.output


def _batch_one_doc(truth: LatencyProfile, seed: int) -> dict:
    """Batch-1 decode at one prompt length (1,024 tokens), 1 % noise: every step reads the
    same weights, so memory time and the per-iteration cost are both constants."""
    lm = make_latency_model("roofline", "llama-3.1-8b", "h100",
                            **roofline_constants(truth, None, 16))
    rng = np.random.default_rng(seed)
    outputs = [int(x) for x in rng.integers(20, 80, 24)]
    return {"backend": "vllm", "max_concurrency": 1, "input_lens": [1024] * 24,
            "output_lens": outputs, "ttfts": [None] * 24,
            "itls": [[lm.iteration_time((), [1024 + j], 16) * float(rng.normal(1, 0.01))
                      for j in range(1, o)] for o in outputs]}


def test_an_unidentifiable_constant_is_held_with_its_reason(tmp_path: Path):
    """Issue 38 item 9: batch-1 data at one context length printed "mbu 1 (fitted)": 100 %
    of HBM bandwidth, the least-squares value clipped at its bound, from data that measures
    only memory time + iteration cost together. mbu is now held at the base profile's value
    and says why; the iteration cost takes up the rest."""
    truth = replace(PROFILES["vllm-hopper"], mbu=0.95, iteration_overhead_s=1e-4)
    f = tmp_path / "b1.json"
    f.write_text(json.dumps(_batch_one_doc(truth, seed=1)))
    r = invoke("calibrate", str(f), "--out", str(tmp_path / "b1.toml"))
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.strip().startswith("mbu"))
    assert "(held: not identifiable" in line and "iteration_overhead_s" in line
    assert "(fitted)" not in line
    p = load_profile(str(tmp_path / "b1.toml"))
    assert p.mbu == PROFILES["vllm-hopper"].mbu  # the base's, not 1


def test_a_constant_pushed_to_its_bound_is_held_there_and_says_so():
    """Decode steps 20 % faster than the roofline at full bandwidth allows: the
    least-squares efficiency exceeds 1, is held at 1 and reported as held at its bound, never
    as fitted."""
    truth = replace(TRUTH, mbu=1.0)
    lm = make_latency_model("roofline", "llama-3.1-8b", "h100",
                            **roofline_constants(truth, None, 16))
    obs = [Observation((Iteration((), (ctx,) * b, 16),),
                       0.8 * lm.iteration_time((), [ctx] * b, 16), f"{b}x{ctx}")
           for b in (1, 8, 32) for ctx in (500, 2000, 8000, 16000)]
    fit = fit_profile(obs, PROFILES["vllm-hopper"], "llama-3.1-8b", "h100")
    assert fit.profile.mbu == 1.0 and "mbu" not in fit.fitted
    assert fit.held["mbu"].startswith("at its bound 1")
