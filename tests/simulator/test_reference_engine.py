"""The engine against the plain reference engine (reference_engine.py), request by request.

Cost: the CI slice (CI_CASES) runs each case through both engines, about 0.3 s a case on a
quiet core (the file: 20 s of CPU on a busy 2-core box); the hand-checked cases take
milliseconds. The larger sweep is `slow`
(`--run-slow`) and `python benchmarks/fuzz_engine.py --reference`.
"""

from __future__ import annotations

import pytest

import tests.simulator.reference_engine as reference
from tests.simulator.reference_cases import (
    REF_PAGE_SIZES,
    REF_POLICIES,
    compare_case,
    make_ref_case,
)
from tests.simulator.reference_engine import RefConfig, simulate_reference
from workloads.request import PromptSpec, Request, Workload, unique_prompt

CI_CASES = range(36)  # each policy 12 times; every page size, preemptions and cache hits
SWEEP = range(36, 1036)


@pytest.mark.parametrize("seed", CI_CASES)
def test_engine_matches_reference(seed: int) -> None:
    out = compare_case(seed)
    assert not out.differences, (f"{make_ref_case(seed).describe()}: "
                                 + "; ".join(out.differences[:10]))


def test_the_ci_cases_cover_the_subset() -> None:
    """Every policy at every page size, chunked and whole prefills under binding and
    non-binding budgets, and (from the reference alone) preemptions and prefix hits under
    each policy: the rules the comparison is for are exercised."""
    seen, preempted, hit, prefill = set(), set(), set(), set()
    for seed in CI_CASES:
        case = make_ref_case(seed)
        seen.add((case.ref.policy, case.ref.page_size))
        prefill.add((case.ref.chunked_prefill_size > 0, case.ref.max_prefill_tokens < 1 << 20))
        done = [r for r in simulate_reference(case.workload, case.ref).values()
                if r.status == "completed"]
        if any(r.preemptions for r in done):
            preempted.add(case.ref.policy)
        if any(r.cached_tokens for r in done):
            hit.add(case.ref.policy)
    assert {p for p, _ in seen} == set(REF_POLICIES)
    assert {ps for _, ps in seen} == set(REF_PAGE_SIZES)
    assert preempted == set(REF_POLICIES)
    assert hit == {"paged", "vllm"}
    assert prefill == {(False, False), (False, True), (True, False), (True, True)}


def test_the_comparison_sees_a_changed_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference that decodes 5 % slower, or preempts the oldest arrival instead of the
    newest, disagrees with the engine: the comparison is not vacuous."""
    seed = 4  # paged-nocache, chunked prefill, 10 preemptions
    assert not compare_case(seed).differences
    monkeypatch.setattr(reference, "DECODE_STEP_S", 0.021)
    assert compare_case(seed).differences
    monkeypatch.undo()
    monkeypatch.setattr(reference, "preempt_victim",
                        lambda d: min(d, key=lambda r: (r.arrival_s, r.rid)))
    out = compare_case(seed)
    assert out.preemptions and out.differences


def _one(rid: int, t: float, prompt: PromptSpec, out: int) -> Request:
    return Request(rid, t, prompt, out, out, seed=1)


def test_reference_times_by_hand() -> None:
    """One request, prompt 10, output 3: admitted at 0, first token after 10 prefill tokens
    (1 ms), finished after two decode steps (40 ms) (docs/latency.md, `constant`)."""
    w = Workload("one", [_one(0, 0.0, unique_prompt(1, 0, 10), 3)], seed=1)
    r = simulate_reference(w, RefConfig("paged", 4, 64, 4))[0]
    assert (r.admit_s, r.first_token_s, r.status) == (0.0, pytest.approx(1e-3), "completed")
    assert r.finish_s == pytest.approx(1e-3 + 0.04)
    assert (r.cached_tokens, r.preemptions) == (0, 0)


@pytest.mark.parametrize("policy, hit", [("paged", 8), ("paged-nocache", 0), ("vllm", 8)])
def test_reference_prefix_hit_by_hand(policy: str, hit: int) -> None:
    """The same 11-token prompt twice, page 4, the second after the first finished: the hit
    is the whole pages of prompt - 1 = 10 tokens, 8 (none without a cache)."""
    p = unique_prompt(1, 0, 11)
    w = Workload("two", [_one(0, 0.0, p, 2), _one(1, 1.0, p, 2)], seed=1)
    out = simulate_reference(w, RefConfig(policy, 4, 64, 4))
    assert out[1].cached_tokens == hit
    assert out[1].first_token_s == pytest.approx(1.0 + (11 - hit) * 1e-4)


def test_reference_preempts_the_latest_arrival_by_hand() -> None:
    """Two 4-token prompts, outputs of 20, page 4, 24 slots (6 pages): both admitted at 0
    (2 pages each), both need a third page at the 1st decode (written 4 -> 8: a page at 8),
    then the 5th page each at 12, 16... the pool runs out and the later arrival is preempted
    and recomputed (its prompt + generated tokens but the last)."""
    w = Workload("pair", [_one(0, 0.0, unique_prompt(1, 0, 4), 20),
                          _one(1, 0.0, unique_prompt(1, 1, 4), 20)], seed=1)
    out = simulate_reference(w, RefConfig("paged-nocache", 4, 24, 4))
    assert out[0].preemptions == 0 and out[1].preemptions >= 1
    assert out[1].recomputed_tokens > 0
    assert out[0].finish_s < out[1].finish_s


@pytest.mark.slow
def test_engine_matches_reference_sweep() -> None:
    """1,000 more cases (about 10 minutes on one core)."""
    bad = [o for o in map(compare_case, SWEEP) if o.differences]
    assert not bad, "\n".join(f"{make_ref_case(o.seed).describe()}: {o.differences[:3]}"
                              for o in bad[:10])
