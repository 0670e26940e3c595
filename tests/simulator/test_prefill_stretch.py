"""Prefill stretches (simulator/fastforward/) change nothing: a reserving policy's
chunked-prefill iterations taken many at once give exactly the summary and request frame of
stepping (max_steps_per_stretch=1), whatever closes admission (a refused head, a
prefill budget the chunks use up, a full batch), and the differential fuzz's cases that take
them agree too. Cost: about 1.5 s."""

from __future__ import annotations

import pytest

from simulator.fastforward.steps import chunk_entries
from simulator.run import SimResult, simulate
from tests.simulator.engine_fuzz import describe, run_case
from tests.simulator.helpers import assert_same_results, config, identical, mixed, replace
from workloads.request import Workload

LONG = identical(10, 400, 40, spacing_s=0.02)  # long prompts, many 32-token chunks each
MIXED = mixed()


def _both(workload: Workload, **kw) -> tuple[SimResult, int, int]:
    """The run with stretches and the stepped one, compared; the prefill stretches taken and
    the iterations they covered."""
    cfg = config(check_invariants=True, check_every=1, **kw)
    taken = [0, 0]

    def sink(t0: float, t1: float, chunks: object, rids: object, steps: int) -> None:
        if chunks and steps >= 2:
            taken[0] += 1
            taken[1] += steps

    a = simulate(workload, cfg, event_sink=sink)
    b = simulate(workload, replace(cfg, max_steps_per_stretch=1))
    assert a.summary["iterations"] == b.summary["iterations"]
    assert_same_results(a, b)
    return a, taken[0], taken[1]


CASES = {
    # contiguous-max reserves the whole 512-token context: two fit, the third is refused
    "refused-head": dict(policy="contiguous-max", kv_tokens=1100, chunked_prefill_size=32),
    # room for all, but each prefill's chunk uses the whole budget: nobody is asked
    "budget-spent": dict(policy="contiguous-oracle", kv_tokens=8192, chunked_prefill_size=32,
                         max_prefill_tokens=32),
    # a full batch (one running or prefilling request at a time)
    "full-batch": dict(policy="contiguous-pow2", kv_tokens=8192, chunked_prefill_size=32,
                       max_running_requests=1),
    # two prefills under way at once, the second's chunk cut by the budget
    "two-prefills": dict(policy="contiguous-oracle", kv_tokens=1400, chunked_prefill_size=48,
                         max_prefill_tokens=80, page_size=1, placement="best-fit"),
}


@pytest.mark.parametrize("name", CASES)
def test_prefill_stretches_equal_stepping(name: str) -> None:
    a, stretches, steps = _both(LONG, **CASES[name])
    assert stretches >= 2 and steps >= 2 * stretches  # it did take them
    assert a.summary["requests_completed"] == LONG.num_requests


def test_prefill_stretches_equal_stepping_in_a_window() -> None:
    """A measurement window that starts and ends inside prefill stretches (the refused-head
    case takes them over 0.88-1.02 s and 2.06-2.20 s)."""
    a, stretches, _ = _both(LONG, warmup_s=0.95, duration_s=2.1, **CASES["refused-head"])
    assert stretches >= 2
    assert (a.summary["window_start_s"], a.summary["window_end_s"]) == (0.95, 2.1)


def test_prefill_stretches_equal_stepping_on_the_mixed_stream() -> None:
    """Sessions, shared prefixes, bursts and a roofline's float step times."""
    _, stretches, _ = _both(MIXED, policy="contiguous-max", kv_tokens=1100,
                            chunked_prefill_size=16, latency="roofline", page_size=1)
    assert stretches >= 1


@pytest.mark.parametrize("seed", (39, 52, 65, 136))  # chunks of 8, 32, 256, 32
def test_fuzz_cases_with_prefill_stretches_agree(seed: int) -> None:
    outcome = run_case(seed, time_limit_s=30.0)
    assert outcome.ok, f"{describe(seed)}: {outcome.kind}: {outcome.detail}"
    assert outcome.prefill_stretches >= 1, f"{describe(seed)}: no prefill stretch taken"


@pytest.mark.parametrize("page_size", (1, 4, 16))
def test_chunk_entries_count_pages_begun(page_size: int) -> None:
    lens0, rooms = [0, 5, 15, 33], [32, 1, 7, 1]
    got = chunk_entries(lens0, rooms, 6, page_size)

    def pages(w: int) -> int:
        return sum(1 for start in range(0, w, page_size))  # pages a row of w tokens began

    base = sum(pages(w) for w in lens0)
    assert got == [sum(pages(w + j * d) for w, d in zip(lens0, rooms, strict=True)) - base
                   for j in range(1, 7)]
