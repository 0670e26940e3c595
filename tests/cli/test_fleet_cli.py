"""Fleets through the CLI: `run --replicas` with its replica files and figures, a sweep over
routers and replica counts, the planner's fleet answers, and every fleet mistake as exit
code 2 with one line naming the option."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.cli.test_commands import assert_png_not_blank

CHAT = ["--workload", "chat", "--num-requests", "40", "--kv-tokens", "4096",
        "--max-context-len", "2048", "--latency", "constant", "--no-progress"]


def test_run_a_fleet_writes_replicas_and_figures(invoke, tmp_path):
    out = tmp_path / "f"
    r = invoke("run", *CHAT, "--replicas", "3", "--router", "cache-aware", "--out", out)
    assert r.exit_code == 0, r.output
    assert "Replicas (cache-aware, 3 replicas)" in r.output
    assert "load imbalance" in r.output
    row = pd.read_csv(out / "summary.csv").iloc[0]
    assert row.replicas == 3 and row.router == "cache-aware"
    assert row.requests_completed + row.requests_rejected == row.requests_total
    assert 0 < row.router_match_pct <= 100
    reps = pd.read_csv(out / "replicas.csv")
    assert reps.replica.tolist() == [0, 1, 2]
    assert reps.requests_routed.sum() == row.requests_total
    req = pd.read_parquet(out / "requests.parquet")
    assert sorted(req.replica.unique()) == [i for i in range(3)
                                            if reps.requests_routed.iloc[i]]
    for name in ("replica_load.png", "router_hit_ttft.png"):
        assert_png_not_blank(out / "figures" / name)
    r = invoke("report", out)
    assert r.exit_code == 0, r.output
    assert "## Fleet" in (out / "report.md").read_text()


def test_one_replica_keeps_todays_columns(invoke, tmp_path):
    r = invoke("run", *CHAT, "--out", tmp_path / "one")
    assert r.exit_code == 0, r.output
    cols = pd.read_csv(tmp_path / "one" / "summary.csv").columns
    assert not {"replicas", "router", "load_imbalance"} & set(cols)
    assert not (tmp_path / "one" / "replicas.csv").exists()


def test_sweep_over_routers_and_replicas(invoke, tmp_path):
    out = tmp_path / "s"
    r = invoke("sweep", *CHAT, "--page-sizes", "16", "--replicas", "1,2",
               "--routers", "round-robin,session", "--out", out)
    assert r.exit_code == 0, r.output
    assert "3 to run" in r.output  # one replica: one run whatever the router
    df = pd.read_csv(out / "summary.csv")
    fleets = df[df.replicas.notna()]
    assert sorted(fleets.router) == ["round-robin", "session"]
    assert df.replicas.isna().sum() == 1
    assert_png_not_blank(out / "figures" / "router_hit_ttft.png")


def test_plan_answers_replicas_for_a_rate_and_knees(invoke):
    r = invoke("plan", "--workload", "sharegpt", "--num-requests", "80", "--kv-tokens",
               "4096", "--max-context-len", "2048", "--latency", "constant",
               "--replicas", "2", "--router", "least-load", "--replicas-for-rate", "20",
               "--slo-ttft-p90", "5", "--knee-routers", "round-robin,least-load",
               "--steps", "0", "--json", "--no-progress")
    assert r.exit_code == 0, r.output
    rate, knees = json.loads(r.stdout)
    assert rate["replicas"] >= 1 and rate["router"] == "least-load"
    assert [p["fails"] for p in rate["probes"]][-1] in (True, False)
    assert not any(p["fails"] for p in rate["probes"] if p["replicas"] == rate["replicas"])
    assert set(knees["knees"]) == {"round-robin", "least-load"}


@pytest.mark.parametrize("args,names", [
    (["--router", "cache-aware"], ["--router", "--replicas 2"]),
    (["--replicas", "0"], ["--replicas"]),
    (["--replicas", "2", "--router", "llm-d-precise", "--kv-event-delay-s", "-1"],
     ["--kv-event-delay-s"]),
    (["--replicas", "2", "--router", "round-robin", "--kv-event-delay-s", "0.1"],
     ["--kv-event-delay-s", "round-robin"]),
    (["--replicas", "2", "--router", "llm-d-precise", "--policy", "contiguous-max"],
     ["llm-d-precise", "contiguous-max"]),
    (["--replicas", "2", "--router", "llm-d", "--router-args", "precise=1",
      "--policy", "paged-nocache"], ["paged-nocache"]),
    (["--replicas", "2", "--router", "dynamo", "--model", "gpt-oss-20b"],
     ["dynamo", "gpt-oss-20b", "hybrid"]),
    (["--replicas", "2", "--router", "cache-aware", "--router-args", "nope=1"],
     ["--router-args", "cache-threshold"]),
    (["--replicas", "2", "--router", "dynamo", "--router-args", "router-temperature=x"],
     ["router_temperature"]),
    (["--replicas", "2", "--router", "nosuch"], ["--router"]),
])
def test_fleet_mistakes_are_one_line_exit_2(invoke, args, names):
    r = invoke("run", *CHAT, *args)
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in r.output
    for n in names:
        assert n in line, line
