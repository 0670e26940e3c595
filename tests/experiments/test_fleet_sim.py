"""The simulated fleet rows (experiments/validation/fleet_sim.py): the row builders on made-up
outcomes, so each verdict is seen to follow the comparison (a reversed order, a moved knee, a
reversed hit-rate gap is not reproduced), and the stage cut on a tiny real fleet run. Seconds.
"""

from __future__ import annotations

import math

import pytest

from experiments.validation import fleet_sim
from experiments.validation.fleet_rows import PER_QPS, SUMMARY, awaiting_rows
from experiments.validation.fleet_sim import (
    LADDERS,
    LLMD_OUTPUT_BAND_PCT,
    NOT_SIMULATED,
    SGLANG_ROUTERS,
    TIERS,
    RouterOutcome,
    llmd_rows,
    published_on_stages,
    published_output_noise_pct,
    scale_factor,
    sglang_rows,
    tiers_hold,
)
from reports.validation_report import NOT_REPRODUCED, REPRODUCED
from workloads.ladder import parse_ladder

SETUP = "llm-d 73-capacity"


def _stages(setup: str) -> tuple[float, ...]:
    return tuple(float(s.rate) for s in parse_ladder(LADDERS[setup])[1:])


def _published_like(setup: str) -> dict[str, RouterOutcome]:
    """Outcomes equal to the published per-QPS rows on the stages run (what a perfect
    simulation would give), the run's p90 from the report's summary."""
    stages = _stages(setup)
    out = {}
    for router in PER_QPS[setup]:
        rows = published_on_stages(setup, router, stages)
        out[router] = RouterOutcome(router, stages, tuple(r[1] for r in rows),
                                    tuple(r[3] for r in rows), SUMMARY[setup][router][2])
    return out


def _by_name(rows: list[dict]) -> dict[str, dict]:
    return {r["name"]: r for r in rows}


@pytest.mark.parametrize("setup", list(LADDERS))
def test_the_published_numbers_themselves_are_reproduced(setup: str) -> None:
    rows = llmd_rows(setup, _published_like(setup))
    assert len(rows) == 4 + 2 + 4 + 1
    assert all(r["section"] == f"{setup} (scaled)" for r in rows)
    assert all("scaled: stages" in r["note"] for r in rows)
    assert all(r["kind"] == REPRODUCED for r in rows), [
        (r["name"], r["kvsim"], r["reference"]) for r in rows if r["kind"] != REPRODUCED]


def test_a_reversed_order_is_not_reproduced() -> None:
    outcomes = _published_like(SETUP)
    o = outcomes
    swapped = dict(o, precise=RouterOutcome("precise", o["precise"].qps, o["random"].output_tok_s,
                                            o["precise"].ttft_p90_s, o["random"].run_ttft_p90_s),
                   random=RouterOutcome("random", o["random"].qps, o["precise"].output_tok_s,
                                        o["random"].ttft_p90_s, o["precise"].run_ttft_p90_s))
    rows = _by_name(llmd_rows(SETUP, swapped))
    assert rows["routers' order by output tok/s"]["kind"] == NOT_REPRODUCED
    assert rows["routers' order by TTFT p90"]["kind"] == NOT_REPRODUCED
    assert rows["precise: output tok/s, mean over the stages run"]["kind"] == NOT_REPRODUCED
    # random and load are one tier: swapping them alone keeps the order
    tie = dict(o, random=o["load"], load=o["random"])
    rows = _by_name(llmd_rows(SETUP, tie))
    assert rows["routers' order by output tok/s"]["kind"] == REPRODUCED


def test_tiers() -> None:
    tiers = TIERS[SETUP]
    good = {"precise": 3.0, "estimated": 2.0, "random": 1.0, "load": 1.5}
    assert tiers_hold(good, tiers, higher_first=True)
    assert not tiers_hold(good, tiers, higher_first=False)
    assert not tiers_hold({**good, "estimated": 1.2}, tiers, higher_first=True)
    assert not tiers_hold({**good, "estimated": math.nan}, tiers, higher_first=True)


def test_a_moved_knee_or_throughput_outside_the_band_is_not_reproduced() -> None:
    o = _published_like(SETUP)
    est = o["estimated"]
    never = RouterOutcome("estimated", est.qps, est.output_tok_s,
                          tuple(min(p, 9.0) for p in est.ttft_p90_s), est.run_ttft_p90_s)
    rows = _by_name(llmd_rows(SETUP, {**o, "estimated": never}))
    knee = rows["estimated: knee QPS (first stage with TTFT p90 > 10 s)"]
    assert (knee["reference"], knee["kvsim"], knee["kind"]) == ("40", "never", NOT_REPRODUCED)
    f = 1 + LLMD_OUTPUT_BAND_PCT / 100 * 1.05  # just outside the band
    faster = RouterOutcome("estimated", est.qps, tuple(v * f for v in est.output_tok_s),
                           est.ttft_p90_s, est.run_ttft_p90_s)
    row = _by_name(llmd_rows(SETUP, {**o, "estimated": faster}))[
        "estimated: output tok/s, mean over the stages run"]
    assert row["kind"] == NOT_REPRODUCED
    slow = RouterOutcome("precise", o["precise"].qps, o["precise"].output_tok_s,
                         o["precise"].ttft_p90_s, 5.0)
    rows = _by_name(llmd_rows(SETUP, {**o, "precise": slow}))
    row = rows["precise: TTFT p90 (s), the stages run"]
    assert row["kind"] == NOT_REPRODUCED


def test_the_band_is_the_published_runs_own_noise() -> None:
    # load's 3,866.5 - 4,973.3 tok/s at 40 QPS and above
    assert published_output_noise_pct() == pytest.approx(
        (4973.3 - 3866.5) / (4973.3 + 3866.5) * 100)
    assert 0 < scale_factor(SETUP) < 1 and 0 < scale_factor("llm-d 37-capacity") < 1


def _sglang(hit_ca: float, hit_rr: float, makespan_ca: float, makespan_rr: float
            ) -> dict[str, RouterOutcome]:
    ca, rr = list(SGLANG_ROUTERS)
    return {ca: RouterOutcome(ca, hit_rate=hit_ca, makespan_s=makespan_ca),
            rr: RouterOutcome(rr, hit_rate=hit_rr, makespan_s=makespan_rr)}


def test_sglang_rows_follow_the_comparison() -> None:
    rows = _by_name(sglang_rows(_sglang(0.75, 0.20, 10.0, 10.0 * 158_596 / 82_665)))
    assert len(rows) == 4
    assert all(r["kind"] == REPRODUCED for r in rows.values())
    # the gap reversed: round robin ahead of the cache-aware router
    rows = _by_name(sglang_rows(_sglang(0.20, 0.75, 10.0, 10.0)))
    assert rows["hit-rate gap, cache-aware - round robin (pts)"]["kind"] == NOT_REPRODUCED
    assert rows["throughput ratio, cache-aware / round robin"]["kind"] == NOT_REPRODUCED
    # right direction, wrong size
    rows = _by_name(sglang_rows(_sglang(0.80, 0.48, 10.0, 12.9)))
    gap = rows["hit-rate gap, cache-aware - round robin (pts)"]
    assert (gap["reference"], gap["kvsim"], gap["kind"]) == (55, 32.0, NOT_REPRODUCED)


def test_only_the_setups_not_simulated_await() -> None:
    rows = awaiting_rows(NOT_SIMULATED)
    assert rows and {r["setup"] for r in rows} == set(NOT_SIMULATED)
    assert all("not bundled" in r["note"] for r in rows)
    assert {r["setup"] for r in awaiting_rows()} > set(NOT_SIMULATED)


def test_the_stage_cut_on_a_small_fleet(monkeypatch) -> None:
    """A real 2-replica run of a 3-stage ladder: one figure per stage after the warm-up, the
    stages' rates in order, throughput and p90 finite, hit rates in [0, 1]."""
    monkeypatch.setitem(fleet_sim.SETUPS, "tiny", fleet_sim.SETUPS[SETUP].__class__(
        **{**vars(fleet_sim.SETUPS["llm-d 37-capacity"]), "name": "tiny", "replicas": 2,
           "model": "llama-3.1-8b", "tp": 1, "kv_tokens_per_replica": 65_536}))
    monkeypatch.setitem(fleet_sim.LADDERS, "tiny", "2x3,1x3,3x3")
    o = fleet_sim.simulate_router("tiny", "random", "random")
    assert o.qps == (1.0, 3.0)
    assert all(v > 0 for v in o.output_tok_s) and all(p >= 0 for p in o.ttft_p90_s)
    assert 0 <= o.hit_rate <= 1 and o.makespan_s > 0 and o.summary["replicas"] == 2
