"""The validation suite's common ground: the row every check produces, its kinds, and the
OPT-13B / A100-40GB setting of the vLLM paper that most checks simulate.

Every row has a kind (reports.validation_report.KINDS), because agreement means different
things: a `reproduced` row is a published number the simulation could have missed; an
`analytic identity` agrees with the paper by arithmetic or construction and so is no evidence;
a `closed-form cross-check` has no paper number and tests the simulator against a formula.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reports.validation_report import (
    CROSS_CHECK,
    DERIVED,
    IDENTITY,
    KINDS,
    NOT_REPRODUCED,
    REPRODUCED,
)
from simulator.config import SimConfig
from simulator.run import simulate
from simulator.run_summary import RunSummary
from workloads.registry import build_workload
from workloads.request import Workload
from workloads.spec import WorkloadSpec

PAPER = "paper"  # make_row's kind for paper rows: resolved to REPRODUCED / NOT_REPRODUCED by `ok`
SLOTS = 15_728  # OPT-13B on one A100-40GB (Table 1)
MAX_CONTEXT_LEN = 2_048  # OPT's maximum position
BASE = dict(model="opt-13b", gpu="a100-40gb", kv_dtype="fp16", kv_tokens=SLOTS,
            max_context_len=MAX_CONTEXT_LEN)
ORCA = {
    "Orca (Max)": dict(policy="contiguous-max", placement="buddy", admission="reserve"),
    "Orca (Pow2)": dict(policy="contiguous-pow2", placement="buddy", admission="reserve"),
    "Orca (Oracle)": dict(policy="contiguous-oracle", placement="buddy", admission="reserve"),
}
VLLM = dict(policy="paged-nocache", page_size=16, admission="vllm")
SYSTEMS = {**ORCA, "vLLM": VLLM}
EXACT = 1e-9  # a closed form the simulation must meet exactly (float rounding only)
Z_SEEDS = 3.0  # standard deviations of seed noise a paper row's band allows


@dataclass(frozen=True)
class Tolerance:
    """A paper row's band and where it comes from, so it is never a bare number.

    `reading`: how precisely the published value can be read off the paper (half a unit of
    the last printed digit where the figure prints its numbers). `seed_sd`: the standard
    deviation of kvsim's value over seeds at the row's own scale, measured by
    `python -m experiments.validation.spread` (the figures are quoted where each Tolerance is
    defined). The paper's number is one run too, with seed noise of its own; taking it to be
    as large as ours, the difference of the two has sqrt(2) times the deviation, so the band
    is reading + Z_SEEDS * sqrt(2) * seed_sd. `relative`: both in % of the published value.
    Anything past the band is a difference of model or input (the paper's unpublished
    length shape, latency), which the row then reports as not reproduced."""

    reading: float
    seed_sd: float
    relative: bool = False

    @property
    def width(self) -> float:
        return self.reading + Z_SEEDS * math.sqrt(2.0) * self.seed_sd

    def ok(self, value: float, published: float) -> bool:
        gap = abs(value - published)
        return gap <= (self.width * abs(published) / 100.0 if self.relative else self.width)

    def label(self) -> str:
        unit = "%" if self.relative else " pts"
        return (f"+/- {self.width:.2f}{unit} (reading {self.reading:.2g} + 3 sqrt2 x seed sd "
                f"{self.seed_sd:.2g})")


def make_row(section: str, name: str, reference, kvsim, tolerance: str, ok: bool,
             difference: float | None = None, rate: float | None = None,
             summary: Mapping[str, Any] | None = None, note: str = "", kind: str = PAPER
             ) -> dict:
    """One check. `kind` is PAPER (a paper number the simulation could miss), IDENTITY,
    CROSS_CHECK or DERIVED (see KINDS)."""
    if difference is None and isinstance(reference, (int, float)) and isinstance(
            kvsim, (int, float)) and reference is not None:
        difference = float(kvsim) - float(reference)
    if kind == PAPER:
        kind = REPRODUCED if ok else NOT_REPRODUCED
    if kind not in KINDS:
        raise ValueError(f"unknown row kind {kind!r}")
    return {
        "section": section, "kind": kind, "name": name, "reference": reference, "kvsim": kvsim,
        "difference": difference, "tolerance": tolerance, "pass": bool(ok), "rate": rate,
        "queue_backlog": None if summary is None else int(summary["queue_backlog"]),
        "preemptions": None if summary is None else int(summary["preemptions"]),
        "note": note,
    }


def sharegpt_workload(rate: float, n: int, seed: int = 0) -> Workload:
    """ShareGPT-like requests at the paper's means, Poisson arrivals (`seed`: both)."""
    return build_workload(WorkloadSpec(name="sharegpt", rate=rate, num_requests=n,
                                       max_context_len=MAX_CONTEXT_LEN, seed=seed))


def run_summary(workload: Workload, **cfg) -> RunSummary:
    return simulate(workload, SimConfig.of(**{**BASE, **cfg})).summary


def saturated(s: RunSummary, n: int) -> bool:
    """A run is saturated when requests are still queued when arrivals stop."""
    return s.queue_backlog >= max(1, n // 100)


def paper_shares(s: RunSummary) -> tuple[float, float, float, float]:
    """kvsim's parts in the paper's four categories (see the module notes)."""
    over = s.internal_overreserve_pct
    others = s.external_frag_pct + s.internal_rounding_pct + s.free_pct + s.cached_pct
    return s.token_states_pct, s.reserved_pct, over, others



def held_pct(s: RunSummary) -> float:
    """Time-averaged slots held by live requests (shared slots once): the paper's blocks."""
    return s.token_states_pct + s.reserved_pct + s.internal_frag_pct


__all__ = ["BASE", "CROSS_CHECK", "DERIVED", "EXACT", "IDENTITY", "MAX_CONTEXT_LEN",
           "NOT_REPRODUCED", "ORCA", "PAPER", "REPRODUCED", "SLOTS", "SYSTEMS", "VLLM", "Z_SEEDS",
           "Tolerance", "held_pct", "make_row", "paper_shares", "run_summary", "saturated",
           "sharegpt_workload"]
