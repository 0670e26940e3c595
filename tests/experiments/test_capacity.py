"""The sustainable-rate search (experiments/answers/capacity.py): the bisection against a known
threshold, and real simulations through `kvsim capacity`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.answers.capacity import MAX_BRACKET, check_steps, find_sustainable_rate, scaled
from experiments.options.run_options import RunOptions


def _threshold_sim(limit: float, calls: list[float]):
    """A summary row overloaded exactly above `limit` req/s (the rate is the --rate given):
    the search logic in isolation; the real verdict is tested in tests/simulator."""

    def sim(o: RunOptions) -> dict:
        rate = float(o.workload.rate)
        calls.append(rate)
        return {"rate_req_s": rate, "overloaded": rate > limit, "overload_reason": "x",
                "throughput_tok_s": rate * 10}

    return sim


BASE = RunOptions.from_mapping({"workload": "sharegpt", "rate": 4.0, "num_requests": 20})


@given(limit=st.floats(0.01, 200.0), steps=st.integers(0, 6))
@settings(max_examples=60, deadline=None)
def test_the_answer_is_servable_and_within_the_bracket_precision(limit, steps):
    calls: list[float] = []
    cap = find_sustainable_rate(BASE, steps=steps, simulate=_threshold_sim(limit, calls))
    assert cap.flag == "--rate" and cap.overloaded_at_start == (limit < 4.0)
    assert cap.rate_req_s is not None and cap.rate_req_s <= limit  # a servable probe
    assert limit < cap.rate_req_s * 2 ** (1 / 2 ** steps) * (1 + 1e-9)  # within precision
    assert cap.flag_value == pytest.approx(cap.rate_req_s)
    assert len(calls) == len(cap.probes) <= 1 + MAX_BRACKET + steps
    assert cap.input_tok_s > 0 and cap.output_tok_s > 0


def test_no_sustainable_rate_when_every_probe_is_overloaded():
    cap = find_sustainable_rate(BASE, steps=2, simulate=_threshold_sim(1e-9, []))
    assert cap.multiplier is None and cap.rate_req_s is None
    assert len(cap.probes) == 1 + MAX_BRACKET and all(p.overloaded for p in cap.probes)


def test_a_trace_is_scaled_by_rate_scale():
    opts = RunOptions.from_mapping({"workload": "mooncake-conv", "num_requests": 20})
    assert scaled(opts, "--rate-scale", 0.5).workload.rate_scale == 0.5
    seen: list[float] = []

    def sim(o: RunOptions) -> dict:
        seen.append(o.workload.rate_scale)
        return {"rate_req_s": o.workload.rate_scale, "overloaded": o.workload.rate_scale > 0.3,
                "overload_reason": "", "throughput_tok_s": 1.0}

    cap = find_sustainable_rate(opts, steps=1, simulate=sim)
    assert cap.flag == "--rate-scale" and seen[:3] == [1.0, 0.5, 0.25]
    assert cap.flag_value == pytest.approx(0.25 * 2 ** 0.5 if 0.25 * 2 ** 0.5 <= 0.3 else 0.25)


@pytest.mark.parametrize("bad", [-1, 13, 1.5, True])
def test_steps_are_checked(bad):
    with pytest.raises(ValueError, match="--steps"):
        check_steps(bad)


def test_kvsim_capacity_on_a_real_simulation(tmp_path):
    from typer.testing import CliRunner

    from cli import app

    args = ["capacity", "--workload", "sharegpt", "--num-requests", "40", "--rate", "50",
            "--model", "opt-13b", "--gpu", "a100-40gb", "--kv-tokens", "12000",
            "--max-context-len", "4096", "--steps", "2"]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    probes = d["probes"]
    assert d["overloaded_at_start"] and probes[0]["overloaded"]
    assert d["rate_req_s"] is not None and d["rate_req_s"] < 50
    found = [p for p in probes if p["flag_value"] == d["flag_value"]]
    assert found and not found[0]["overloaded"]
    # the answer re-simulated with `kvsim run` is servable: the same verdict as the search
    run = CliRunner().invoke(app, ["run", *args[1:-2], "--rate", str(d["flag_value"]),
                                   "--out", str(tmp_path / "r")])
    assert run.exit_code == 0 and "overloaded" not in run.output
    r = CliRunner().invoke(app, ["capacity", "--steps", "99"])
    assert r.exit_code == 2 and "--steps" in r.output


def test_with_an_slo_capacity_is_goodput_and_names_the_binding_target():
    """Servable (queue drains) up to 8 req/s, but TTFT p99 meets 2 s only up to 3 req/s: the
    answer is the highest rate meeting the SLO, and the TTFT target binds."""
    from experiments.options.run_options import RunOptions

    opts = RunOptions.from_mapping({"rate": 4.0, "slo_ttft_p99": 2.0})
    assert opts.output.slo_percentile == 99.0 and opts.output.slo_ttft == 2.0

    def sim(o):
        rate = o.workload.rate
        met = rate <= 3.0
        return {"rate_req_s": rate, "overloaded": rate > 8.0, "overload_reason": "queue",
                "throughput_tok_s": 1.0, "slo_met": met, "slo_attainment": 0.995 if met else 0.9,
                "slo_binding": None if met else "TTFT <= 2 s"}

    cap = find_sustainable_rate(opts, steps=4, simulate=sim)
    assert 3.0 * 2 ** (-1 / 16) <= cap.rate_req_s <= 3.0
    assert cap.binding == "TTFT <= 2 s" and cap.slo == "99 % of requests: TTFT <= 2 s"
    assert any("SLO missed" in p.reason for p in cap.probes)


def test_slo_columns_count_every_request_and_name_the_binding_target():
    import pandas as pd

    from experiments.answers.slo import slo_columns

    req = pd.DataFrame({"status": ["completed"] * 3 + ["rejected"],
                        "ttft_s": [0.5, 1.0, 3.0, float("nan")],
                        "tpot_s": [0.01, float("nan"), 0.01, float("nan")]})
    c = slo_columns(req, 2.0, 0.05, 50.0)
    assert c["slo_ttft_attainment"] == 0.5 and c["slo_tpot_attainment"] == 0.75
    assert c["slo_attainment"] == 0.5 and c["slo_met"] is True and c["slo_binding"] is None
    c = slo_columns(req, 2.0, 0.05, 99.0)
    assert c["slo_met"] is False and c["slo_binding"] == "TTFT <= 2 s"
    assert slo_columns(req, None, None, 99.0)["slo_met"] is None
    only = slo_columns(req, 2.0, None, 99.0)  # one target: it binds, the other is NaN
    assert only["slo_binding"] == "TTFT <= 2 s" and only["slo_tpot_attainment"] != 0.5


def test_the_static_page_size_table_uses_the_workloads_lengths():
    """plan --workload: the expected rounding per page size is over the workload's own
    lengths, not the single maximum context (131,072 for Llama-3.1-8B rounds to 0.0 at every
    power-of-two page) (issue 26 item 8; milliseconds: no simulation)."""
    from experiments.answers.planning import static_plan
    from experiments.options.run_options import RunOptions

    opts = RunOptions.from_mapping({"workload": "sharegpt", "num_requests": 50,
                                    "model": "llama-3.1-8b", "gpu": "h100"})
    plain = static_plan(opts).to_dict()["page_sizes"]
    traced = static_plan(opts, with_workload=True).to_dict()["page_sizes"]
    key = next(k for k in plain[0] if "frag" in k and "token" in k)
    assert all(row[key] == 0 for row in plain)
    assert any(row[key] > 0 for row in traced)


def test_capacity_tells_a_missed_slo_from_overload_and_prints_small_rates():
    """Issue 38 item 7: at the start rate (4 req/s) the queue drains but TTFT misses the SLO:
    `overloaded_at_start` is false and `slo_met_at_start` false (it said overloaded); each
    probe keeps both verdicts; a rate below 1 token/s prints as itself, not "0"."""
    from reports.overload_view import capacity_lines, probe_line

    opts = RunOptions.from_mapping({"rate": 4.0, "slo_ttft_p99": 2.0})

    def sim(o):
        rate = o.workload.rate
        met = rate <= 3.0
        return {"rate_req_s": rate, "overloaded": rate > 8.0, "overload_reason": "queue",
                "throughput_tok_s": 0.42 * rate, "slo_met": met,
                "slo_attainment": 0.995 if met else 0.9,
                "slo_binding": None if met else "TTFT <= 2 s"}

    cap = find_sustainable_rate(opts, steps=2, simulate=sim)
    d = cap.to_dict()
    assert d["overloaded_at_start"] is False and d["slo_met_at_start"] is False
    first = d["probes"][0]
    assert first["overloaded"] is False and first["slo_met"] is False
    assert probe_line(cap.probes[0]).strip().startswith("misses the SLO at 4")
    small = replace(cap, input_tok_s=0.3, output_tok_s=0.42, throughput_tok_s=0.4)
    line = capacity_lines(small)[-1]
    assert "0.3 prompt + 0.42 output tokens/s" in line and "generated 0.4 tok/s" in line
    assert " 0 output" not in line
    over = find_sustainable_rate(opts, steps=1, simulate=lambda o: {
        **sim(o), "overloaded": True, "overload_reason": "queue"})
    assert over.overloaded_at_start and over.slo_met_at_start is False
    assert "no sustainable rate found: still overloaded at --rate" in capacity_lines(over)[-1]


def test_the_slo_counts_requests_a_run_ended_without_finishing(tmp_path):
    """A run cut off with requests queued: they have no row, yet they met no target; the
    attainment counts them (every request of the run in the denominator)."""
    from typer.testing import CliRunner

    from cli import app

    out = tmp_path / "r"
    r = CliRunner().invoke(app, ["run", "--workload", "mooncake-conv", "--num-requests", "300",
                                 "--rate", "100", "--no-drain", "--slo-ttft-p99", "1000",
                                 "--no-progress", "--out", str(out)])
    assert r.exit_code == 0, r.output
    import pandas as pd

    row = pd.read_csv(out / "summary.csv").iloc[0]
    assert row["slo_ttft_attainment"] <= row["requests_completed"] / 300
    assert not bool(row["slo_met"])
    assert "SLO missed (99 % of requests: TTFT <= 1000 s)" in " ".join(r.output.split())


def test_run_with_an_slo_prints_whether_it_was_met():
    """Issue 38 item 7: `run --slo-ttft-p99 2 --slo-tpot-p99 0.05` printed nothing about the
    SLO; now one line says met or missed, the attainments and, when missed, which target
    binds."""
    from typer.testing import CliRunner

    from cli import app

    base = ["run", "--workload", "sharegpt", "--num-requests", "30", "--no-progress"]
    r = CliRunner().invoke(app, [*base, "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.05"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert ("SLO met (99 % of requests: TTFT <= 2 s and TPOT <= 0.05 s): 100.0% of all "
            "requests met every target (TTFT <= 2 s 100.0%, TPOT <= 0.05 s 100.0%)") in text
    r = CliRunner().invoke(app, [*base, "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.001"])
    text = " ".join(r.output.split())
    assert "SLO missed (99 % of requests: TTFT <= 2 s and TPOT <= 0.001 s)" in text
    assert "TPOT <= 0.001 s binds" in text
    r = CliRunner().invoke(app, base)
    assert "SLO" not in r.output
