"""The engine's differential fuzz (tests/simulator/engine_fuzz.py): every combination of
policy x admission x schedule x preemption twice in the suite, each case taking at least one
decode stretch; the full sweep (thousands of cases) under `--run-slow` or
`python benchmarks/fuzz_engine.py`.

Cost: the slice is 144 cases, each simulated twice with invariants every iteration: about
60 s of CPU on a busy 2-core box (the former slice, seeds 0-71: 29 s there, 25 s quiet); the
hybrid slice, 6 cases, about 8 s more there (hybrid policies step every decode).
"""

from __future__ import annotations

import pytest

from tests.simulator.engine_fuzz import (
    COMBOS,
    HYBRID_COMBOS,
    HYBRID_SEED0,
    describe,
    make_case,
    run_case,
)

#: Two seeds per combination c, of c + 72 j (j < 10): the first that take a decode stretch
#: (37 of seeds 0-287 take none, so stepping and the fast-forward would run the same code;
#: `python benchmarks/fuzz_engine.py --cases 288` lists them), passing over the 30 or so
#: whose two runs cost more than about 1 s of CPU when the combination has a cheaper one (the
#: sweep keeps them), and keeping seeds 28 and 35, the tiered cases that once disagreed.
#: 144 cases, 1,170 requests, 14 with a KV tier.
FAST_SLICE = (
    1, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
    28, 29, 30, 31, 32, 33, 35, 37, 39, 40, 41, 44, 47, 48, 50, 51, 52, 53, 54, 55, 56, 57, 58,
    59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 74, 76, 77, 78, 79, 81, 82, 84, 85,
    86, 87, 89, 90, 91, 92, 95, 96, 101, 105, 113, 114, 115, 117, 118, 119, 120, 121, 122, 123,
    124, 125, 126, 127, 128, 129, 130, 131, 132, 133, 134, 135, 137, 138, 139, 140, 141, 142,
    143, 145, 147, 152, 155, 160, 165, 169, 170, 172, 174, 175, 176, 178, 181, 183, 184, 186,
    187, 188, 189, 193, 208, 216, 218, 219, 224, 238, 243, 250, 251, 252, 254, 324, 326, 406,
)
PER_COMBO = 2
#: hybrid cases (engine_fuzz.HYBRID_COMBOS: policy x small hybrid model x admission x
#: schedule x preemption): one of each (policy, model) pair, among the cheapest of the first 72
#: (`python benchmarks/fuzz_engine.py` lists them). The hybrid `vllm` policy takes decode
#: stretches (kvcore/vllm/stretch.py), the SGLang layout steps one at a time;
#: tests/simulator/test_vllm_hybrid_stretch.py holds hybrid cases that must take stretches
HYBRID_SLICE = tuple(HYBRID_SEED0 + k for k in (11, 22, 28, 37, 53, 67))


@pytest.mark.parametrize("seed", FAST_SLICE)
def test_fuzz_case(seed: int) -> None:
    outcome = run_case(seed, time_limit_s=30.0)
    assert outcome.ok, f"{describe(seed)}: {outcome.kind}: {outcome.detail}"
    assert outcome.stretches >= 1, (f"{describe(seed)}: no decode stretch taken, so stepping "
                                    "was compared with itself")


@pytest.mark.parametrize("seed", HYBRID_SLICE)
def test_hybrid_fuzz_case(seed: int) -> None:
    outcome = run_case(seed, time_limit_s=30.0)
    assert outcome.ok, f"{describe(seed)}: {outcome.kind}: {outcome.detail}"
    assert outcome.requests >= 2


def test_the_hybrid_slice_covers_each_policy_and_model() -> None:
    pairs = [HYBRID_COMBOS[s - HYBRID_SEED0][:2] for s in HYBRID_SLICE]
    assert {p: pairs.count(p) for p in pairs} == dict.fromkeys(
        {c[:2] for c in HYBRID_COMBOS}, 1)
    _, cfg = make_case(HYBRID_SLICE[0])
    assert cfg.pool.model == "fuzz-swa" and cfg.tier.enabled is False


def test_the_slice_covers_every_combination_twice() -> None:
    seen: dict[tuple, int] = {}
    for seed in FAST_SLICE:
        _, cfg = make_case(seed)
        key = (cfg.policy.policy, cfg.engine.admission, cfg.engine.schedule,
               cfg.engine.preempt)
        seen[key] = seen.get(key, 0) + 1
    assert seen == dict.fromkeys(COMBOS, PER_COMBO)


@pytest.mark.slow
def test_full_fuzz_sweep() -> None:
    """The sweep the reliability doc reports (5,040 cases, about 30 minutes on one core)."""
    bad = [o for o in map(run_case, range(len(COMBOS), len(COMBOS) * 71)) if not o.ok]
    assert not bad, "\n".join(f"{describe(o.seed)}: {o.kind}: {o.detail}" for o in bad[:20])
