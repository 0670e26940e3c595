"""`kvsim plan`'s modes as functions returning result objects (no simulation runs here: the
static plan, the request's checks and the host-sizing answer's words; about 1 s)."""

from __future__ import annotations

import pytest

from experiments.answers.host_sizing import HostSizing, SizingStep
from experiments.answers.plan_modes import PlanAnswer, PlanRequest, make_plan
from experiments.answers.planning import static_plan
from experiments.options.run_options import RunOptions


def test_static_plan_alone_is_the_planner_and_says_nothing_more():
    opts = RunOptions.from_mapping({"model": "llama-3.1-8b", "gpu": "h100"})
    answer = make_plan(opts, PlanRequest())
    assert answer.capacity is None and answer.study is None
    assert answer.to_dict() == static_plan(opts).to_dict()
    assert answer.lines() == []


@pytest.mark.parametrize(("req", "needle"), [
    (PlanRequest(jobs=0), "--jobs"), (PlanRequest(steps=13), "--steps"),
    (PlanRequest(context_len=0), "--context-len"), (PlanRequest(tolerance=-1), "--tolerance"),
    (PlanRequest(study=True, seeds=tuple(range(65))), "--seeds"),
    (PlanRequest(page_sizes="0"), "--page-size")])
def test_plan_request_refuses_a_bad_flag_before_anything_runs(req, needle):
    with pytest.raises(ValueError, match=needle):
        make_plan(RunOptions(), req)


def test_plan_answer_lines_keep_the_parts_order():
    plan = static_plan(RunOptions())
    answer = PlanAnswer(plan, size_notes=("note",))
    assert answer.lines() == ["note"]


def test_host_sizing_report_lines():
    steps = (SizingStep(0.0, 0.0, 0.1, 0.0, 0.5), SizingStep(2.0, 3.5, 0.4, 0.3, 0.25))
    res = HostSizing(0.4, 0.6, steps[1], steps)
    lines = res.report_lines("out/x")
    assert lines[0] == "ideal reuse of the workload: 0.6000; target 0.4000"
    assert "host memory needed: 3.50 GiB per rank (--hicache-ratio 2)" in lines
    assert lines[-1] == "results: out/x/summary.csv"
    none = HostSizing(0.4, 0.6, None, steps[:1]).report_lines()
    assert none[-1] == "not reached even with an unbounded host tier"
