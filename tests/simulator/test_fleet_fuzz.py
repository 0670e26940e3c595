"""The fleet's differential fuzz (tests/simulator/fleet_fuzz.py): replicas behind random
routers, stepping against fast-forward, the router's view at every decision compared too;
every request ends once, a livelock fails instead of hanging. The sweep (hundreds of
cases) is `python benchmarks/fuzz_fleet.py`.

Cost: 26 cases of 2-4 replicas, each simulated twice with invariants every iteration:
about 20 s of CPU.
"""

from __future__ import annotations

import pytest

from simulator.fleet import ROUTERS
from tests.simulator.fleet_fuzz import fleet_case, run_fleet_case

#: at least two cases of each router that take a decode stretch (seeds 0-79), among them four with a
#: KV event delay and six with closed-loop sessions (`python benchmarks/fuzz_fleet.py`)
SLICE = (0, 1, 4, 5, 6, 10, 12, 13, 14, 18, 19, 20, 22, 23, 27, 29, 31, 32, 40, 53, 60, 62,
         68, 79)
#: cases with the benchmark client's --max-concurrency: a fleet then steps (a request is sent
#: when any replica finishes one), so they take no stretch
GATED = (15, 16)
#: hybrid-model cases (the engine fuzz's HYBRID_SEED0 on) behind routers reading no events
HYBRID = (1_000_000, 1_000_003, 1_000_007)


@pytest.mark.parametrize("seed", SLICE)
def test_fleet_fuzz_case(seed: int) -> None:
    outcome = run_fleet_case(seed, time_limit_s=30.0)
    assert outcome.ok, f"{fleet_case(seed).describe()}: {outcome.kind}: {outcome.detail}"
    assert outcome.stretches >= 1, "no decode stretch: stepping compared with itself"


@pytest.mark.parametrize("seed", GATED)
def test_gated_fleet_fuzz_case(seed: int) -> None:
    case = fleet_case(seed)
    assert case.cfg.engine.max_concurrency > 0
    outcome = run_fleet_case(seed, time_limit_s=30.0)
    assert outcome.ok, f"{case.describe()}: {outcome.kind}: {outcome.detail}"


@pytest.mark.parametrize("seed", HYBRID)
def test_hybrid_fleet_fuzz_case(seed: int) -> None:
    case = fleet_case(seed)
    outcome = run_fleet_case(seed, time_limit_s=30.0)
    assert outcome.ok, f"{case.describe()}: {outcome.kind}: {outcome.detail}"


def test_the_slice_covers_every_router_delays_and_sessions() -> None:
    cases = [fleet_case(s) for s in SLICE]
    routers = [c.setup.router for c in cases]
    assert all(routers.count(r) >= 2 for r in ROUTERS.names())
    assert sum(c.setup.kv_event_delay_s > 0 for c in cases) >= 4
    assert sum(bool(c.workload.sessions) for c in cases) >= 4
