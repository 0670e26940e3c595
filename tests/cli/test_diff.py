"""`kvsim compare` deltas and `kvsim diff RUN_A RUN_B` through the CLI."""

from __future__ import annotations

import re

import pandas as pd

from tests.cli.conftest import TINY
from tests.cli.test_commands import assert_png_not_blank


def test_compare_prints_and_saves_deltas_against_the_baseline(invoke, tmp_path):
    out = tmp_path / "cmp"
    r = invoke("compare", *TINY, "--policies", "paged,vllm,contiguous-max",
               "--baseline", "vllm", "--out", out)
    assert r.exit_code == 0, r.output
    assert "Deltas against vllm" in r.stdout and "vllm (baseline)" in r.stdout
    d = pd.read_csv(out / "deltas.csv")
    assert set(d["label"]) == {"paged", "vllm", "contiguous-max"}
    frag = d[(d["label"] == "contiguous-max") & (d["metric"] == "internal_frag_pct")].iloc[0]
    assert frag["delta"] > 0 and frag["verdict"] == "worse"  # max-length reservation
    assert (d[d["label"] == "vllm"]["delta"].fillna(0) == 0).all()
    r = invoke("compare", *TINY, "--policies", "paged,vllm", "--baseline", "nope",
               "--out", tmp_path / "x")
    assert r.exit_code == 2 and "--baseline 'nope'" in r.output


def test_diff_of_two_compares(invoke, tmp_path):
    a, b = tmp_path / "big", tmp_path / "small"
    for d, pool in ((a, "4096"), (b, "1024")):
        r = invoke("compare", *TINY, "--policies", "paged,vllm", "--kv-tokens", pool,
                   "--out", d)
        assert r.exit_code == 0, r.output
    out = tmp_path / "diff"
    r = invoke("diff", a, b, "--out", out)
    assert r.exit_code == 0, r.output
    assert "kv_tokens: 4096 -> 1024" in r.stdout and "big (baseline)" in r.stdout
    d = pd.read_csv(out / "diff.csv")
    assert set(d["policy"]) == {"paged", "vllm"}
    sa, sb = pd.read_csv(a / "summary.csv"), pd.read_csv(b / "summary.csv")
    row = d[(d["policy"] == "paged") & (d["metric"] == "token_states_pct")].iloc[0]
    want_a = sa[sa["policy"] == "paged"]["token_states_pct"].iloc[0]
    want_b = sb[sb["policy"] == "paged"]["token_states_pct"].iloc[0]
    assert row["a"] == want_a and row["b"] == want_b and row["delta"] == want_b - want_a
    assert want_b > want_a  # the same tokens in a quarter of the pool
    assert_png_not_blank(out / "diff_metrics.png")
    assert_png_not_blank(out / "diff_latency_cdf.png")


def test_diff_of_two_sweeps_overlays_page_size_curves(invoke, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, extra in ((a, []), (b, ["--kv-tokens", "2048"])):
        r = invoke("sweep", *TINY, "--page-sizes", "1,16", "--policies", "paged,vllm",
                   "--no-progress", "--no-plot", *extra, "--out", d)
        assert r.exit_code == 0, r.output
    out = tmp_path / "diff"
    r = invoke("diff", a, b, "--out", out, "--label-a", "roomy", "--label-b", "tight")
    assert r.exit_code == 0, r.output
    d = pd.read_csv(out / "diff.csv")
    assert len(d.drop_duplicates(["policy", "page_size"])) == 4
    assert_png_not_blank(out / "diff_normalized_latency_s_vs_page_size.png")


def test_diff_errors_name_the_argument(invoke, tmp_path):
    r = invoke("diff", tmp_path / "none", tmp_path, "--out", tmp_path / "d")
    assert r.exit_code == 2 and "RUN_A" in r.output
    a = tmp_path / "a"
    assert invoke("compare", *TINY, "--policies", "paged", "--out", a).exit_code == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    r = invoke("diff", a, empty, "--out", tmp_path / "d")
    assert r.exit_code == 2 and "RUN_B" in r.output and "summary.csv" in r.output


def test_diff_words_at_another_load_and_near_zero_base(invoke, tmp_path):
    """Issue 26 item 7 end to end: runs offered another load get no better / worse (the
    table's caption says why and diff.csv says "other load"), and a delta of a near-zero base
    prints absolute only (no "+189754 %"). Two tiny runs, about 3 s."""
    import shutil

    a, b = tmp_path / "slow", tmp_path / "fast"
    for d, rate in ((a, "2"), (b, "8")):
        r = invoke("run", *TINY, "--rate", rate, "--out", d)
        assert r.exit_code == 0, r.output
    r = invoke("diff", a, b, "--out", tmp_path / "d1")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())  # the caption wraps at the terminal's width
    assert "not better or worse: fast (8 req/s) ran at another offered load than slow " \
        "(2 req/s)" in text
    d = pd.read_csv(tmp_path / "d1" / "diff.csv")
    moved = d[d["delta"].fillna(0) != 0]
    assert len(moved) and set(moved["verdict"]) == {"other load"}  # no better / worse

    # the same load, a hit rate of 0.00001 against 0.019: the delta is absolute only
    lo, hi = tmp_path / "lo", tmp_path / "hi"
    for d, hit in ((lo, 0.00001), (hi, 0.019)):
        shutil.copytree(a, d)
        s = pd.read_csv(d / "summary.csv")
        s["prefix_hit_rate"] = hit
        s.to_csv(d / "summary.csv", index=False)
    r = invoke("diff", lo, hi, "--out", tmp_path / "d2")
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if "prefix hit rate" in ln)
    assert "0.019 (+0.019)" in line and "%" not in line
    assert "not better or worse" not in r.stdout
    d = pd.read_csv(tmp_path / "d2" / "diff.csv").set_index("metric")
    assert d.loc["prefix_hit_rate", "verdict"] == "better"  # same load: judged
    assert pd.isna(d.loc["prefix_hit_rate", "delta_pct"])
    assert "better" not in set(d.drop(index="prefix_hit_rate")["verdict"].dropna())


def test_compare_zero_base_prints_an_absolute_delta(invoke, tmp_path):
    """Issue 26 item 7 through `kvsim compare`: against a baseline that caches nothing (hit
    rate 0) a policy's hit rate delta is absolute only, no percent of zero; the runs share
    one offered load, so they are judged and no load caption is printed. About 2 s."""
    out = tmp_path / "cmp"
    chat = [a for i, a in enumerate(TINY) if "--input-len" not in (a, TINY[i - 1])]  # unread
    r = invoke("compare", *chat, "--workload", "chat", "--policies", "contiguous-max,paged",
               "--out", out)
    assert r.exit_code == 0, r.output
    # the row, which the test terminal's width may wrap onto a second line
    deltas = r.stdout[r.stdout.index("Deltas against contiguous-max"):]
    row_text = deltas[deltas.index("prefix hit rate"):deltas.index("token states")]
    assert re.search(r"\(\+0\.\d{3}\)", row_text) and "%" not in row_text
    assert "not better or worse" not in r.stdout
    d = pd.read_csv(out / "deltas.csv").set_index(["label", "metric"])
    row = d.loc[("paged", "prefix_hit_rate")]
    assert row["baseline"] == 0 and row["delta"] > 0 and pd.isna(row["delta_pct"])
    assert row["verdict"] == "better"
