"""The hybrid `vllm` policy's decode stretch against stepping, through the whole engine: small
hybrid cases of the differential fuzz (tests/simulator/engine_fuzz.py), each simulated with
the fast-forward and with `max_steps_per_stretch = 1`; summaries (the per-pool-kind columns
included) and request rows must be equal, and each case must take decode stretches, so
stepping is not compared with itself. The sliding-window cases decode past their 48-token
window (blocks leave it inside stretches); the Mamba cases cross block boundaries, where
mode `align` keeps a state block and frees the previous one a step later.

Cost: about 2 s of CPU (five cases, each run twice with invariants every iteration)."""

from __future__ import annotations

import pytest

from tests.simulator.engine_fuzz import HYBRID_COMBOS, HYBRID_SEED0, describe, run_case

#: vllm cases of the fuzz's hybrid seeds among the cheapest that take stretches: three on
#: fuzz-swa (window 48), two on fuzz-mamba (16-token blocks)
CASES = (1000049, 1000121, 1000128, 1000064, 1000136)


@pytest.mark.parametrize("seed", CASES)
def test_hybrid_vllm_stretches_equal_stepping(seed: int) -> None:
    policy, model = HYBRID_COMBOS[(seed - HYBRID_SEED0) % len(HYBRID_COMBOS)][:2]
    assert policy == "vllm"
    outcome = run_case(seed, time_limit_s=30.0)
    assert outcome.ok, f"{describe(seed)}: {outcome.kind}: {outcome.detail}"
    assert outcome.stretches >= 2, f"{describe(seed)}: too few stretches ({model})"


def test_the_cases_cover_both_layouts() -> None:
    models = {HYBRID_COMBOS[(s - HYBRID_SEED0) % len(HYBRID_COMBOS)][1] for s in CASES}
    assert models == {"fuzz-swa", "fuzz-mamba"}
