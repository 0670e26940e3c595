"""The highest sustainable arrival rate of a run's options (`kvsim capacity`, `plan --find-rate`).

An overloaded run says *that* the GPU cannot keep up; the user's next question is *how much* it
can take. The answer is a short geometric bisection on a load multiplier `m`: `--rate-scale`
x m for a trace replayed at its timestamps, `--rate` x m for arrivals drawn at a rate
(synthetic workloads, ShareGPT). Each probe is one ordinary simulation judged by the summary's
`overloaded` column (simulator/overload.py), so the search and the warning never disagree.

First `m` is doubled (servable at 1) or halved (overloaded at 1) until the verdict flips, then
the bracket is bisected geometrically `steps` times: the answer is within a factor
`2 ** (1 / 2 ** steps)` of the threshold (4.4 % for the default 4 steps) and is always a
multiplier that was simulated and found servable.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from experiments.options import RunOptions

MAX_BRACKET = 12  # doublings / halvings before giving up: a 4,096x range
DEFAULT_STEPS = 4


@dataclass(frozen=True)
class Probe:
    """One simulated load: its multiplier, the flag value it means, and the verdict."""

    multiplier: float
    flag_value: float
    rate_req_s: float
    overloaded: bool
    reason: str


@dataclass(frozen=True)
class CapacityResult:
    """The highest servable load found (None when even the smallest probe was overloaded)."""

    flag: str  # "--rate-scale" or "--rate"
    multiplier: float | None
    flag_value: float | None
    rate_req_s: float | None
    input_tok_s: float | None
    output_tok_s: float | None
    throughput_tok_s: float | None  # generated tokens per second the servable run achieved
    overloaded_at_start: bool
    probes: tuple[Probe, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "probes"}
        d["probes"] = [vars(p) for p in self.probes]
        return d


def check_steps(steps: int) -> None:
    """--steps: bisection steps after the bracket, 0 to 12."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= 12:
        raise ValueError(f"--steps must be an integer in [0, 12], got {steps!r}")


def _flag(opts: RunOptions) -> str:
    """--rate-scale for a trace replayed at its timestamps, --rate for drawn arrivals."""
    if opts.workload.rate is not None:
        return "--rate"
    from workloads import build_workload

    meta = build_workload(replace(opts.workload_spec(), num_requests=2)).meta
    return "--rate-scale" if meta.get("arrival") == "trace" else "--rate"


def scaled(opts: RunOptions, flag: str, value: float) -> RunOptions:
    """The options with the load flag set to `value`."""
    key = "rate_scale" if flag == "--rate-scale" else "rate"
    return replace(opts, workload=replace(opts.workload, **{key: float(value)}))


def find_sustainable_rate(opts: RunOptions, *, steps: int = DEFAULT_STEPS,
                          simulate: Callable[[RunOptions], dict[str, Any]] | None = None,
                          on_probe: Callable[[Probe], None] | None = None) -> CapacityResult:
    """Bisect the load multiplier of `opts` (see the module docstring). `simulate` maps
    options to a summary row (default: experiments.runner.simulate_options)."""
    check_steps(steps)
    if simulate is None:
        from experiments.runner import simulate_options

        def simulate(o: RunOptions) -> dict[str, Any]:
            return simulate_options(o)[0]

    flag = _flag(opts)
    probes: list[Probe] = []
    rows: dict[float, dict[str, Any]] = {}
    base: list[float] = []

    def probe(m: float) -> bool:
        if not base:  # the first probe (m = 1) tells the flag's value at m = 1
            first = simulate(opts)
            base.append(opts.workload.rate_scale if flag == "--rate-scale"
                        else float(first["rate_req_s"]))
            row = first
        else:
            row = simulate(scaled(opts, flag, base[0] * m))
        rows[m] = row
        p = Probe(m, base[0] * m, float(row["rate_req_s"]), bool(row["overloaded"]),
                  str(row.get("overload_reason") or ""))
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return p.overloaded

    over_at_1 = probe(1.0)
    lo, hi = (None, 1.0) if over_at_1 else (1.0, None)
    for _ in range(MAX_BRACKET):
        if lo is not None and hi is not None:
            break
        if hi is None:
            m = lo * 2
            if probe(m):
                hi = m
            else:
                lo = m
        else:
            m = hi / 2
            if probe(m):
                hi = m
            else:
                lo = m
    if lo is not None and hi is not None:
        for _ in range(steps):
            m = math.sqrt(lo * hi)
            if probe(m):
                hi = m
            else:
                lo = m
    if lo is None:
        return CapacityResult(flag, None, None, None, None, None, None, over_at_1,
                              tuple(probes))
    row = rows[lo]
    rate = float(row["rate_req_s"])
    mean_in, mean_out = _mean_lengths(scaled(opts, flag, base[0] * lo))
    return CapacityResult(flag, lo, base[0] * lo, rate, rate * mean_in, rate * mean_out,
                          float(row["throughput_tok_s"]), over_at_1, tuple(probes))


def _mean_lengths(opts: RunOptions) -> tuple[float, float]:
    """Mean prompt and output tokens per request of the workload the options build."""
    from workloads import build_workload

    reqs = build_workload(opts.workload_spec()).nominal_requests()
    if not reqs:
        return 0.0, 0.0
    return (sum(r.prompt_len for r in reqs) / len(reqs),
            sum(r.output_len for r in reqs) / len(reqs))


__all__ = ["DEFAULT_STEPS", "CapacityResult", "Probe", "check_steps", "find_sustainable_rate",
           "scaled"]
