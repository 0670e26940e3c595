"""Sweeps: one row per cell, resumable by config hash, figures from summary.csv."""

from __future__ import annotations

import pandas as pd

from experiments.answers.runner import pending_cells, run_cell
from experiments.options.grid import cells
from experiments.options.run_options import RunOptions
from tests.cli.conftest import TINY
from tests.cli.test_commands import assert_png_not_blank

GRID = ["--page-sizes", "1,16,64", "--policies", "paged,contiguous-pow2", "--no-progress"]


def _summary(out):
    return pd.read_csv(out / "summary.csv")


def test_sweep_grid_resume_and_changed_options(invoke, tmp_path):
    out = tmp_path / "sw"
    r = invoke("sweep", *TINY, *GRID, "--out", out)
    assert r.exit_code == 0, r.output
    df = _summary(out)
    assert len(df) == 6 and df.config_hash.is_unique
    cells_run = set(zip(df.policy, df.page_size, strict=True))
    assert cells_run == {(p, s) for p in ("paged", "contiguous-pow2") for s in (1, 16, 64)}
    for name in ("breakdown.png", "internal_frag_pct_vs_page_size.png",
                 "normalized_latency_s_vs_page_size.png",
                 "throughput_tok_s_vs_page_size.png", "token_states_pct_vs_page_size.png"):
        assert_png_not_blank(out / "figures" / name)
    hits = out / "figures" / "prefix_hit_rate_vs_page_size.png"
    if (df.prefix_hit_rate == 0).all():  # an all-zero figure is left out (the report says so)
        assert not hits.exists()
    else:
        assert_png_not_blank(hits)
    assert (out / "figures" / "interactive.html").stat().st_size > 0

    # a rerun skips everything
    r = invoke("sweep", *TINY, *GRID, "--out", out, "--no-plot")
    assert "0 to run, 6 already" in r.stdout
    assert _summary(out).equals(df)

    # a crash that lost a row: only that cell runs again, nothing duplicated
    lost = df.iloc[2]
    df.drop(index=2).to_csv(out / "summary.csv", index=False)
    r = invoke("sweep", *TINY, *GRID, "--out", out, "--no-plot")
    assert "1 to run, 5 already" in r.stdout
    again = _summary(out)
    assert len(again) == 6 and again.config_hash.is_unique
    assert set(again.config_hash) == set(df.config_hash)
    back = again[again.config_hash == lost.config_hash].iloc[0]
    assert back.token_states_pct == lost.token_states_pct  # deterministic

    # a grown grid runs only the new cells; a changed option reruns the cells it changes
    r = invoke("sweep", *TINY, *GRID[:2], "--policies", "paged,contiguous-pow2,vllm",
               "--no-progress", "--out", out, "--no-plot")
    assert "3 to run, 6 already" in r.stdout
    r = invoke("sweep", *TINY, *GRID, "--out", out, "--max-running-requests", "8",
               "--no-plot")
    assert "6 to run, 0 already" in r.stdout
    final = _summary(out)
    assert len(final) == 15 and final.config_hash.is_unique


def test_interrupted_sweep_subset_then_full(tmp_path):
    base = RunOptions.from_mapping({"num_requests": 8, "kv_tokens": 4096, "latency": "constant",
                                    "max_context_len": 2048})
    grid = cells(base, {"page_size": [1, 4, 16, 64]})
    summary = tmp_path / "summary.csv"
    # the first two cells finished before the "crash"
    pd.DataFrame([run_cell(c.to_dict()) for c in grid[:2]]).to_csv(summary, index=False)
    todo, skipped = pending_cells(grid, summary)
    assert skipped == 2 and [c.policy.page_size for c in todo] == [16, 64]
    # duplicates in a grid run once
    todo, _ = pending_cells(grid + grid, tmp_path / "none.csv")
    assert len(todo) == 4


def test_sweep_parallel_jobs_and_rates(invoke, tmp_path):
    out = tmp_path / "par"
    r = invoke("sweep", *TINY, "--page-sizes", "16", "--rates", "1,4,16", "--seeds", "0,1",
               "--jobs", "2", "--no-progress", "--out", out, "--slo-ttft", "5")
    assert r.exit_code == 0, r.output
    df = _summary(out)
    assert len(df) == 6 and sorted(df.rate_req_s.unique()) == [1.0, 4.0, 16.0]
    assert_png_not_blank(out / "figures" / "latency_vs_rate.png")


def test_sweep_axes_from_toml(invoke, tmp_path):
    toml = tmp_path / "grid.toml"
    toml.write_text('page_size = [4, 64]\npolicies = ["paged", "vllm"]\nnum_requests = 8\n'
                    'kv_tokens = 4096\nlatency = "constant"\nmax_context_len = 2048\n')
    out = tmp_path / "g"
    r = invoke("sweep", "--config", toml, "--out", out, "--no-progress", "--no-plot")
    assert r.exit_code == 0, r.output
    df = _summary(out)
    assert sorted(zip(df.policy, df.page_size, strict=True)) == [
        ("paged", 4), ("paged", 64), ("vllm", 4), ("vllm", 64)]
    toml.write_text("page_size = [4, 64]\n")
    r = invoke("run", "--config", toml)
    assert r.exit_code == 2 and "only kvsim sweep takes lists" in r.stderr
