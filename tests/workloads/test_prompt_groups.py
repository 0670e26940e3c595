"""The benchmarks' grouped shared-prefix datasets (workloads/prompt_groups.py) and the named
workloads built on them: group sharing exactly as the harnesses define it, lengths, request
order (inference-perf replays its shuffled list per stage; SGLang sends each prompt once),
determinism by seed.

Cost: about 5 s.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads import build_workload
from workloads.errors import WorkloadError
from workloads.ladder import parse_ladder
from workloads.lengths import FixedLengths
from workloads.prompt_groups import PromptGroups, grouped_requests, shuffled_prompts
from workloads.registry import check_options_used
from workloads.spec import WorkloadSpec, unused_options

shapes = st.builds(PromptGroups, st.integers(1, 6), st.integers(1, 5), st.integers(0, 40),
                   st.integers(1, 20), st.integers(1, 30))


def _sets(w):
    return [(r.meta["group"], r.meta["prompt"]) for r in w.requests]


@settings(max_examples=50, deadline=None)
@given(shapes, st.integers(1, 60), st.integers(0, 2**31))
def test_group_sharing_exactly(groups, n, seed):
    """Every prompt is its group's system prompt (the same ids in all P prompts of the group,
    none shared across groups) then its own question (the same ids whenever resent); lengths
    are S + Q, outputs O with ignore-eos."""
    t = np.arange(n, dtype=float)
    w = grouped_requests(t, groups, "cycle-per-stage", seed)
    S, Q = groups.system_prompt_len, groups.question_len
    systems: dict[int, bytes] = {}
    questions: dict[int, bytes] = {}
    for r in w.requests:
        ids = r.prompt_ids()
        assert len(ids) == r.prompt_len == S + Q
        assert r.output_len == r.max_new_tokens == groups.output_len
        g, k = r.meta["group"], r.meta["prompt"]
        assert g == k // groups.prompts_per_group
        assert systems.setdefault(g, ids[:S].tobytes()) == ids[:S].tobytes()
        assert questions.setdefault(k, ids[S:].tobytes()) == ids[S:].tobytes()
    firsts = [w.requests[0].prompt_ids()]
    all_sys = {v for v in systems.values() if v}
    assert len(all_sys) == (len(systems) if S else 0)  # distinct groups never share
    assert len(set(questions.values())) == len(questions)
    assert firsts  # at least one request


@settings(max_examples=50, deadline=None)
@given(shapes, st.integers(0, 2**31), st.lists(st.integers(1, 80), min_size=1, max_size=4))
def test_inference_perf_order_replays_the_list_per_stage(groups, seed, counts):
    """Request n of each stage sends list[n mod G x P]: every run of G x P consecutive
    requests of a stage holds each prompt once (each group P times), and every stage starts
    from the list's head."""
    local = np.concatenate([np.arange(c) for c in counts])
    w = grouped_requests(np.arange(len(local), dtype=float), groups, "cycle-per-stage", seed,
                         local)
    perm = shuffled_prompts(groups, seed)
    got = np.array([r.meta["prompt"] for r in w.requests])
    assert np.array_equal(got, perm[local % groups.num_prompts])
    gp = groups.num_prompts
    start = 0
    for c in counts:
        stage = got[start:start + c]
        for i in range(0, c - gp + 1, gp):
            assert sorted(stage[i:i + gp]) == list(range(gp))
            per_group = Counter(k // groups.prompts_per_group for k in stage[i:i + gp])
            assert set(per_group.values()) == {groups.prompts_per_group}
        start += c


@settings(max_examples=40, deadline=None)
@given(shapes, st.integers(0, 2**31))
def test_sglang_order_sends_each_prompt_once(groups, seed):
    w = grouped_requests(np.zeros(groups.num_prompts), groups, "once", seed)
    got = [r.meta["prompt"] for r in w.requests]
    assert sorted(got) == list(range(groups.num_prompts))
    with pytest.raises(WorkloadError, match="once"):
        grouped_requests(np.zeros(groups.num_prompts + 1), groups, "once", seed)


def test_determinism_by_seed():
    groups = PromptGroups(8, 4, 16, 8, 4)
    a = _sets(grouped_requests(np.arange(64.0), groups, "cycle-per-stage", 5))
    b = _sets(grouped_requests(np.arange(64.0), groups, "cycle-per-stage", 5))
    c = _sets(grouped_requests(np.arange(64.0), groups, "cycle-per-stage", 6))
    assert a == b and a != c


def test_without_ignore_eos_outputs_end_early_but_max_tokens_stays():
    groups = PromptGroups(2, 2, 8, 4, 100, ignore_eos=False)
    w = grouped_requests(np.arange(10.0), groups, "cycle-per-stage", 0,
                         eos_lengths=FixedLengths(30))
    assert {(r.output_len, r.max_new_tokens) for r in w.requests} == {(30, 100)}
    w = grouped_requests(np.arange(10.0), groups, "cycle-per-stage", 0,
                         eos_lengths=FixedLengths(300))
    assert {(r.output_len, r.max_new_tokens) for r in w.requests} == {(100, 100)}


def test_resident_tokens_is_the_distinct_prompt_tokens():
    """G x (S + P x Q): the ids of one full set, counted once."""
    groups = PromptGroups(5, 3, 20, 7, 2)
    w = grouped_requests(np.arange(15.0), groups, "cycle-per-stage", 1)
    distinct = np.unique(np.concatenate([r.prompt_ids() for r in w.requests]))
    assert len(distinct) == groups.resident_tokens == 5 * (20 + 3 * 7)
    assert PromptGroups(150, 5, 6000, 1200, 1000).resident_tokens == 1_800_000


def test_llmd_73_capacity_as_the_report_defines_it():
    """The README's profile: 150 x 5, 6,000 / 1,200 / 1,000, Poisson stages 15x50 then 3 ... 60
    QPS; 17,084 requests; the warm-up sends one full set of 750; each stage restarts the list."""
    w = build_workload(WorkloadSpec(name="llmd-73-capacity"))
    sched = w.meta["ladder"]
    assert sched.kind == "poisson" and w.num_requests == 17_084
    assert [(s.rate, s.duration_s) for s in sched.stages] == [
        (s.rate, s.duration_s) for s in parse_ladder(
            "15x50,3x20,10x20,15x20,20x38,22x34,25x30,30x25,35x21,40x38,43x36,46x33,49x30,"
            "52x29,55x27,57x26,60x25")]
    r0 = w.requests[0]
    assert (r0.prompt_len, r0.output_len, r0.max_new_tokens) == (7200, 1000, 1000)
    warm = [r.meta["prompt"] for r in w.requests[:750]]
    assert sorted(warm) == list(range(750))
    s1 = sched.stages[1]
    assert [r.meta["prompt"] for r in w.requests[s1.first:s1.first + 60]] == warm[:60]


def test_llmd_37_capacity_constant_ladder():
    w = build_workload(WorkloadSpec(name="llmd-37-capacity"))
    sched = w.meta["ladder"]
    assert sched.kind == "constant" and w.num_requests == 6_830
    assert [s.span_s for s in sched.stages] == pytest.approx(
        [30, 210, 180, 120, 120, 90, 70, 60, 50, 50])
    assert w.requests[0].prompt_len == 9_000


@pytest.mark.parametrize("name", ["generated-shared-prefix", "sglang-v04-router"])
def test_sglang_v04_defaults(name):
    w = build_workload(WorkloadSpec(name=name))
    assert w.num_requests == 1024 and w.meta["arrival"] == "burst"
    assert {r.arrival_s for r in w.requests} == {0.0}
    assert {(r.prompt_len, r.output_len) for r in w.requests} == {(2048 + 128, 256)}
    assert len({r.meta["group"] for r in w.requests}) == 64


def test_options_reach_the_generator():
    w = build_workload(WorkloadSpec(name="shared-prefix", gsp_num_groups=3,
                                    gsp_prompts_per_group=2, gsp_system_prompt_len=10,
                                    gsp_question_len=5, gsp_output_len=7, num_requests=9,
                                    arrival="ladder", ladder="2x3,1x3", ladder_type="constant"))
    assert w.num_requests == 9 and w.meta["ladder"].kind == "constant"
    assert {(r.prompt_len, r.output_len) for r in w.requests} == {(15, 7)}
    w = build_workload(WorkloadSpec(name="generated-shared-prefix", arrival="poisson", rate=4.0,
                                    num_requests=10))
    assert w.num_requests == 10 and w.requests[-1].arrival_s > 0


@pytest.mark.parametrize("kw, words", [
    (dict(name="sharegpt", gsp_num_groups=4), "--gsp-num-groups"),
    (dict(name="sharegpt", ignore_eos=False), "--ignore-eos"),
    (dict(name="llmd-73-capacity", rate=3.0), "--rate"),
    (dict(name="sharegpt", ladder="3x20"), "--ladder"),
    (dict(name="shared-prefix", lengths="sharegpt"), "--lengths"),
])
def test_unused_options_are_refused(kw, words):
    spec = WorkloadSpec(**kw)
    with pytest.raises(WorkloadError) as e:
        check_options_used(spec, build_workload(spec))
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw, words", [
    (dict(name="sharegpt", arrival="ladder"), "needs --ladder"),
    (dict(name="chat", arrival="ladder", ladder="1x5"), "single requests"),
    (dict(name="generated-shared-prefix", arrival="poisson"), "needs --rate"),
    (dict(name="generated-shared-prefix", num_requests=2000), "once"),
])
def test_bad_combinations_get_one_line(kw, words):
    with pytest.raises(WorkloadError) as e:
        build_workload(WorkloadSpec(**kw))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_bad_values_at_the_spec():
    for kw in (dict(gsp_num_groups=0), dict(ladder="3y2"), dict(ladder_gap_s=-1.0),
               dict(ladder_type="burst")):
        with pytest.raises(WorkloadError):
            WorkloadSpec(**kw)


def test_rows_of_other_workloads_do_not_carry_the_new_options():
    """unused_options drops the ladder and gsp options from the row and hash of a run that
    never reads them (recorded summaries keep their columns), keeps them where read."""
    new = ["ladder", "ladder_type", "ladder_gap_s", "gsp_num_groups", "ignore_eos"]
    base = {k: None for k in new}
    assert set(unused_options({**base, "workload": "sharegpt"})) >= set(new)
    assert not set(unused_options({**base, "workload": "llmd-73-capacity"})) & set(new)
    sp = unused_options({**base, "workload": "shared-prefix"})
    assert "gsp_num_groups" not in sp and "ladder" in sp
    sp = unused_options({**base, "workload": "shared-prefix", "arrival": "ladder"})
    assert "ladder" not in sp
