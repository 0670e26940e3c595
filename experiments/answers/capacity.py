"""The highest sustainable arrival rate of a run's options (`kvsim capacity`, `plan --find-rate`).

An overloaded run says *that* the GPU cannot keep up; the user's next question is *how much* it
can take. The answer is a short geometric bisection on a load multiplier `m`: `--rate-scale`
x m for a trace replayed at its timestamps, `--rate` x m for arrivals drawn at a rate
(synthetic workloads, ShareGPT). Each probe is one ordinary simulation judged by the summary's
`overloaded` column (simulator/overload.py), so the search and the warning never disagree.
With an SLO (`--slo-ttft` / `--slo-tpot`, experiments/answers/slo.py) a probe must also meet it: the
answer is then DistServe's goodput, the highest rate at which the stated share of requests meets
every target, and `binding` says what failed just above it (overload or which target).

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

from experiments.options.run_options import RunOptions

MAX_BRACKET = 12  # doublings / halvings before giving up: a 4,096x range
DEFAULT_STEPS = 4


@dataclass(frozen=True)
class Probe:
    """One simulated load: its multiplier, the flag value it means, and the verdicts: the
    queue's (`overloaded`) and, with an SLO, whether it was met (`slo_met`, None without
    one). The search counts a probe that fails either."""

    multiplier: float
    flag_value: float
    rate_req_s: float
    overloaded: bool  # the queue grows (simulator/overload.py)
    reason: str
    slo_met: bool | None = None

    @property
    def fails(self) -> bool:
        return self.overloaded or self.slo_met is False


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
    overloaded_at_start: bool  # the first probe's queue grows (not: it only missed the SLO)
    probes: tuple[Probe, ...] = field(default_factory=tuple)
    slo: str | None = None  # the SLO searched on ("99 % of requests: TTFT <= 2 s"), if any
    binding: str | None = None  # what failed just above the answer: "overload" or a target
    slo_met_at_start: bool | None = None  # the first probe met the SLO (None: no SLO)

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
    options to a summary row (default: experiments.answers.runner.simulate_options)."""
    check_steps(steps)
    if simulate is None:
        from experiments.answers.runner import simulate_options

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
        slo_met = row.get("slo_met")
        p = Probe(m, base[0] * m, float(row["rate_req_s"]), bool(row["overloaded"]),
                  _why(row), None if slo_met is None else bool(slo_met))
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return p.fails

    fails_at_1 = probe(1.0)
    lo, hi = (None, 1.0) if fails_at_1 else (1.0, None)
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
    slo = slo_text(opts)
    above = [p for p in probes if p.fails and (lo is None or p.multiplier > lo)]
    binding = None
    if above:
        first = rows[min(above, key=lambda p: p.multiplier).multiplier]
        binding = "overload" if bool(first["overloaded"]) else first.get("slo_binding")
    first_probe = probes[0]
    if lo is None:
        return CapacityResult(flag, None, None, None, None, None, None,
                              first_probe.overloaded, tuple(probes), slo, binding,
                              first_probe.slo_met)
    row = rows[lo]
    rate = float(row["rate_req_s"])
    mean_in, mean_out = _mean_lengths(scaled(opts, flag, base[0] * lo))
    return CapacityResult(flag, lo, base[0] * lo, rate, rate * mean_in, rate * mean_out,
                          float(row["throughput_tok_s"]), first_probe.overloaded,
                          tuple(probes), slo, binding, first_probe.slo_met)


def slo_text(opts: RunOptions) -> str | None:
    """The SLO the search holds the runs to, in words (None without a target)."""
    o = opts.output
    targets = [f"{name} <= {v:g} s" for name, v in (("TTFT", o.slo_ttft), ("TPOT", o.slo_tpot))
               if v is not None]
    return f"{o.slo_percentile:g} % of requests: {' and '.join(targets)}" if targets else None


def _why(row: dict[str, Any]) -> str:
    """Why a probe fails (overloaded, and or it misses the SLO when one is given); ''."""
    reasons = [str(row.get("overload_reason") or "")] if bool(row["overloaded"]) else []
    if row.get("slo_met") is False:
        reasons.append(f"SLO missed: {float(row['slo_attainment']):.1%} of requests met every "
                       f"target ({row.get('slo_binding')} binds)")
    return "; ".join(r for r in reasons if r)


def _fails(row: dict[str, Any]) -> tuple[bool, str]:
    """Whether a probe fails (overloaded, or it misses the SLO when one is given) and why."""
    return bool(row["overloaded"]) or row.get("slo_met") is False, _why(row)


def _mean_lengths(opts: RunOptions) -> tuple[float, float]:
    """Mean prompt and output tokens per request of the workload the options build."""
    from workloads import build_workload

    reqs = build_workload(opts.workload_spec()).nominal_requests()
    if not reqs:
        return 0.0, 0.0
    return (sum(r.prompt_len for r in reqs) / len(reqs),
            sum(r.output_len for r in reqs) / len(reqs))


def probe_fails(row: dict[str, Any]) -> tuple[bool, str]:
    """A summary row's verdict as a probe counts it (overloaded, or the SLO missed) and why."""
    return bool(row["overloaded"]) or row.get("slo_met") is False, _why(row)


# the public name of the load flag (experiments/answers/fleet_plan.py reads it)
load_flag = _flag

__all__ = ["DEFAULT_STEPS", "CapacityResult", "Probe", "check_steps", "find_sustainable_rate",
           "load_flag", "probe_fails", "scaled", "slo_text"]
