"""A QPS ladder whose stages wait for the drain (simulator/stage_gate.py) on a fleet: the
gate counts every replica's requests (a stage starts `gap` after the last request before it
ended, on whichever replica), and stepping and the fast-forward give identical results
whatever the router (one deciding ahead, one reading loads, one reading delayed KV events).

Cost: about 15 s (ten small fleets, each stepped and fast-forwarded).
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.config import SimConfig
from simulator.fleet import FleetSetup, simulate_fleet
from workloads import build_workload
from workloads.spec import WorkloadSpec

SETUPS = [FleetSetup(3, "round-robin"), FleetSetup(2, "least-load"),
          FleetSetup(3, "cache-aware"), FleetSetup(2, "llm-d-precise", None, 0.05),
          FleetSetup(3, "dynamo", None, 0.01)]


def _workload(seed: int):
    return build_workload(WorkloadSpec(
        name="shared-prefix", arrival="ladder", ladder="12x2,3x2,25x2",
        ladder_type="poisson" if seed % 2 else "constant", ladder_drain=True,
        gsp_num_groups=4, gsp_prompts_per_group=3, gsp_system_prompt_len=200,
        gsp_question_len=40, gsp_output_len=30, seed=seed, max_context_len=1024))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.router)
def test_a_fleets_stages_wait_for_the_whole_fleet_and_stepping_agrees(seed, setup):
    w = _workload(seed)
    cfg = SimConfig.of(policy="vllm", kv_tokens=900, page_size=16, max_context_len=1024,
                       latency="constant", check_invariants=True, check_every=1)
    stretches: list[int] = []
    fast = simulate_fleet(w, cfg, setup, event_sink=lambda t0, t1, chunks, rids, steps:
                          stretches.append(steps))
    assert max(stretches) >= 2  # the fast-forward ran
    stepped = simulate_fleet(w, cfg.replace(max_steps_per_stretch=1), setup)
    a = fast.requests.sort_values("request_id").reset_index(drop=True)
    b = stepped.requests.sort_values("request_id").reset_index(drop=True)
    assert a.equals(b)
    assert a.request_id.is_unique and len(a) == w.num_requests
    assert a.replica.nunique() == setup.replicas
    sched = w.meta["ladder"]
    gen = {r.request_id: r.arrival_s for r in w.requests}
    st = sched.stage_of(a.request_id.to_numpy())
    prev_end = None
    for k, row in enumerate(sched.stages):
        part = a[st == k]
        offsets = part.request_id.map(gen).to_numpy() - row.start_s
        start = row.start_s if prev_end is None else prev_end + sched.gap_s
        assert np.allclose(part.arrival_s.to_numpy(), start + offsets)
        prev_end = a[a.request_id < row.first + row.count].finish_s.max()
