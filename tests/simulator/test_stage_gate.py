"""The QPS ladder's stage gate in a run (simulator/stage_gate.py): each stage starts `gap`
after the requests before it have all ended, its arrivals keeping their offsets; stepping and
the fast-forward give identical results; every request ends once. Without the drain the
generated times are kept.

Cost: about 10 s (a dozen small runs, each stepped and fast-forwarded).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulator.config import SimConfig
from simulator.run import simulate
from workloads import build_workload
from workloads.spec import WorkloadSpec


def _workload(seed: int, drain: bool = True, kind: str = "poisson"):
    return build_workload(WorkloadSpec(
        name="shared-prefix", arrival="ladder", ladder="12x2,3x2,25x2", ladder_type=kind,
        ladder_drain=drain, gsp_num_groups=4, gsp_prompts_per_group=3,
        gsp_system_prompt_len=200, gsp_question_len=40, gsp_output_len=30, seed=seed,
        max_context_len=1024))


def _stages(w, requests: pd.DataFrame) -> list[pd.DataFrame]:
    sched = w.meta["ladder"]
    st = sched.stage_of(requests.request_id.to_numpy())
    return [requests[st == k].sort_values("request_id") for k in range(len(sched.stages))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", ["vllm", "paged"])
def test_stages_wait_for_the_drain_and_stepping_agrees(seed, policy):
    w = _workload(seed, kind="poisson" if seed % 2 else "constant")
    cfg = SimConfig.of(policy=policy, kv_tokens=1500, page_size=16, max_context_len=1024,
                       latency="constant", check_invariants=True, check_every=1)
    stretches = []
    fast = simulate(w, cfg, event_sink=lambda t0, t1, chunks, rids, steps:
                    stretches.append(steps))
    assert max(stretches) >= 2  # the fast-forward ran, so the two runs are two codes
    stepped = simulate(w, cfg.replace(max_steps_per_stretch=1))
    a = fast.requests.sort_values("request_id").reset_index(drop=True)
    b = stepped.requests.sort_values("request_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    assert a.request_id.is_unique and len(a) == w.num_requests
    assert set(a.status) <= {"completed", "rejected"}
    sched = w.meta["ladder"]
    gen = {r.request_id: r.arrival_s for r in w.requests}
    prev_end = None
    for k, part in enumerate(_stages(w, a)):
        row = sched.stages[k]
        offsets = part.request_id.map(gen).to_numpy() - row.start_s
        if prev_end is None:
            assert np.allclose(part.arrival_s.to_numpy(), row.start_s + offsets)
        else:  # the stage's clock starts gap after the last request before it ended
            start = prev_end + sched.gap_s
            assert np.allclose(part.arrival_s.to_numpy(), start + offsets)
        prev_end = part.finish_s.max()
        ended = a[a.request_id < row.first + row.count].finish_s.max()
        assert prev_end == ended


def test_without_the_drain_the_generated_times_stay():
    w = _workload(3, drain=False)
    res = simulate(w, SimConfig.of(policy="vllm", kv_tokens=1500, max_context_len=1024,
                                   latency="constant"))
    got = res.requests.set_index("request_id").arrival_s
    assert all(got[r.request_id] == r.arrival_s for r in w.requests)


def test_the_gate_announces_no_arrival_while_it_holds():
    """next_due must not promise an arrival before the drain (a stretch could stop short,
    which is safe) nor later than the moved time (a stretch could run past it)."""
    import simpy

    from simulator.stage_gate import StageGate

    w = _workload(0)
    sched = w.meta["ladder"]
    env = simpy.Environment()
    gate = StageGate(env, sched)
    first = sched.stages[1].first
    assert not gate.opens_stage(0) and gate.opens_stage(first)
    gate.sent()
    proc = env.process(gate.open_next())
    env.run(until=5.0)
    assert gate.holding and gate.due(0.0) == np.inf
    gate.ended()
    env.run(until=6.0)
    assert proc.triggered and not gate.holding
    assert gate.due(sched.stages[1].start_s) == pytest.approx(5.0 + sched.gap_s)
