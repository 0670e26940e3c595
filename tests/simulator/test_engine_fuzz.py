"""The engine's differential fuzz (tests/simulator/engine_fuzz.py): every combination of
policy x admission x schedule x preemption once in the suite, the full sweep (thousands of
cases) under `--run-slow` or `python benchmarks/fuzz_engine.py`."""

from __future__ import annotations

import pytest

from tests.simulator.engine_fuzz import COMBOS, describe, make_case, run_case

FAST_SLICE = range(len(COMBOS))  # each combination once


@pytest.mark.parametrize("seed", FAST_SLICE)
def test_fuzz_case(seed: int) -> None:
    outcome = run_case(seed, time_limit_s=30.0)
    assert outcome.ok, f"{describe(seed)}: {outcome.kind}: {outcome.detail}"


def test_the_slice_covers_every_combination() -> None:
    seen = set()
    for seed in FAST_SLICE:
        _, cfg = make_case(seed)
        seen.add((cfg.policy.policy, cfg.engine.admission, cfg.engine.schedule,
                  cfg.engine.preempt))
    assert seen == set(COMBOS)


@pytest.mark.slow
def test_full_fuzz_sweep() -> None:
    """The sweep the reliability doc reports (5,040 cases, about 30 minutes on one core)."""
    bad = [o for o in map(run_case, range(len(COMBOS), len(COMBOS) * 71)) if not o.ok]
    assert not bad, "\n".join(f"{describe(o.seed)}: {o.kind}: {o.detail}" for o in bad[:20])
