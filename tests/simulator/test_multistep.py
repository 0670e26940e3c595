"""Multi-step decode stretches change nothing: stepping one iteration at a time
(max_steps_per_stretch=1) gives exactly the same summary and requests frame, bit for bit,
across policies, admission modes, preemption modes and page sizes."""

from __future__ import annotations

import pytest

from simulator.run import simulate
from tests.simulator.helpers import (
    ADMISSIONS,
    CONTIGUOUS_POLICIES,
    PAGED_POLICIES,
    assert_same_results,
    config,
    identical,
    mixed,
    replace,
)

MIXED = mixed()
# every request decodes to its max_new_tokens: SGLang's ratio under-estimates, so it retracts
PRESSURE = identical(24, 40, 150, spacing_s=0.05)

ODD = ((1, "recompute"), (64, "swap"))
EVEN = ((16, "swap"), (64, "recompute"))
CASES = [
    (pol, adm, ps, pre)
    for i, (pol, adm) in enumerate((p, a) for p in PAGED_POLICIES for a in ADMISSIONS)
    for ps, pre in (ODD if i % 2 else EVEN)
] + [(pol, "reserve", ps, "recompute") for pol in CONTIGUOUS_POLICIES for ps in (1, 16)]


def _both(workload, cfg):
    a = simulate(workload, cfg)
    b = simulate(workload, replace(cfg, max_steps_per_stretch=1))
    assert a.summary["iterations"] == b.summary["iterations"]
    assert_same_results(a, b)
    return a, b


@pytest.mark.parametrize("policy,admission,page_size,preempt", CASES,
                         ids=[f"{p}-{a}-ps{s}-{m}" for p, a, s, m in CASES])
def test_stretches_equal_stepping(policy, admission, page_size, preempt):
    cfg = config(policy=policy, admission=admission, page_size=page_size, preempt=preempt,
                 kv_tokens=1024, placement="buddy" if page_size == 1 else "first-fit",
                 schedule="lpm" if preempt == "swap" else "fcfs", check_invariants=False)
    _both(MIXED, cfg)


@pytest.mark.parametrize("admission", ADMISSIONS)
def test_stretches_equal_stepping_under_preemption(admission):
    cfg = config(admission=admission, kv_tokens=1024, check_invariants=False)
    a, _ = _both(PRESSURE, cfg)
    if admission != "reserve":
        assert a.summary["preemptions"] > 0


def test_stretches_equal_stepping_in_a_window():
    """A window that starts and ends in the middle of decode stretches (warmup, duration)."""
    cfg = config(kv_tokens=1024, warmup_s=0.37, duration_s=1.91, schedule="lpm",
                 check_invariants=False)
    _both(MIXED, cfg)


def test_stretches_do_take_many_steps():
    """Most steps go in stretches, and the timeline is stepping's all the same (a stretch
    samples at each step start where stepping samples an iteration)."""
    cfg = config(kv_tokens=1024, check_invariants=False, timeline_interval_s=1e-9)
    stretched = [0, 0]  # stretches, their steps

    def sink(t0: float, t1: float, chunks: object, rids: object, steps: int) -> None:
        if steps >= 2:
            stretched[0] += 1
            stretched[1] += steps

    a = simulate(MIXED, cfg, event_sink=sink)
    b = simulate(MIXED, replace(cfg, max_steps_per_stretch=1))
    assert a.summary["iterations"] == b.summary["iterations"]
    assert stretched[1] > a.summary["iterations"] / 2 and stretched[1] >= 3 * stretched[0]
    assert len(a.timeline_rows) >= a.summary["iterations"]  # every step sampled
    assert a.timeline_rows == b.timeline_rows
