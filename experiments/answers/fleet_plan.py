"""A fleet planner's answers (`kvsim plan --replicas-for-rate R`, `--knee-routers A,B`):
how many replicas a rate needs under an SLO with a given router, and the knee (the highest
sustainable rate) of each router on a fleet.

* Replicas for a rate: the load is set so the workload arrives at R req/s (`--rate R` for
  drawn arrivals, `--rate-scale` x R / the trace's own rate for a trace), then the replica
  count is doubled from 1 until a run is servable (the overload verdict) and meets the SLO
  (`--slo-ttft` / `--slo-tpot` at `--slo-percentile`, e.g. `--slo-ttft-p90 2`), then
  bisected down to the smallest count that passes. Every count answered was simulated.
* Knee per router: `kvsim capacity`'s bisection (experiments/answers/capacity.py) on the same fleet
  with each router in turn.

Each answer carries the passing run's fleet figures: the working set against the cluster's
KV (fill %), the imbalance, and a warning when affinity hot-spots one replica.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from experiments.answers.capacity import (
    CapacityResult,
    Probe,
    find_sustainable_rate,
    load_flag,
    probe_fails,
    scaled,
    slo_text,
)
from experiments.options.run_options import RunOptions

__all__ = ["KneeAnswer", "ReplicasAnswer", "knee_per_router", "probe_line",
           "replicas_for_rate"]

MAX_REPLICAS = 4096  # FleetSpec's bound


@dataclass(frozen=True)
class ReplicaProbe:
    replicas: int
    rate_req_s: float
    fails: bool
    reason: str


@dataclass(frozen=True)
class ReplicasAnswer:
    """The fewest replicas that serve `rate` under the SLO with `router` (None: not even
    `MAX_REPLICAS`)."""

    rate: float
    router: str
    replicas: int | None
    slo: str | None
    row: dict[str, Any] | None  # the passing run's summary row
    probes: tuple[ReplicaProbe, ...] = field(default_factory=tuple)

    def lines(self) -> list[str]:
        from reports.fleet_view import fleet_lines

        target = f" with {self.slo}" if self.slo else ""
        if self.replicas is None:
            return [f"no fleet up to {MAX_REPLICAS} replicas serves {self.rate:g} req/s"
                    f"{target} with router {self.router}"]
        out = [f"replicas for {self.rate:g} req/s{target}, router {self.router}: "
               f"{self.replicas} ({len(self.probes)} fleets simulated)"]
        if self.row is not None and self.replicas > 1:
            out += fleet_lines(self.row)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "router": self.router, "replicas": self.replicas,
                "slo": self.slo, "probes": [vars(p) for p in self.probes],
                "row": self.row}


def probe_line(p: ReplicaProbe | Probe) -> str:
    """One simulated probe of a search, in a line."""
    verdict = f"fails: {p.reason}" if p.fails else "passes"
    if isinstance(p, ReplicaProbe):
        return f"  {p.replicas} replicas at {p.rate_req_s:.3g} req/s: {verdict}"
    return f"  {p.rate_req_s:.3g} req/s: {verdict}"


def _at_rate(opts: RunOptions, rate: float) -> RunOptions:
    """The options with the workload arriving at `rate` req/s."""
    flag = load_flag(opts)
    if flag == "--rate":
        return scaled(opts, flag, rate)
    from workloads import build_workload

    natural = _trace_rate(build_workload(replace(opts, workload=replace(
        opts.workload, rate_scale=1.0)).workload_spec()))
    return scaled(opts, flag, rate / natural)


def _trace_rate(workload) -> float:
    times = sorted(r.arrival_s for r in workload.nominal_requests())
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    if span <= 0:
        raise ValueError("--replicas-for-rate: the trace's requests arrive at one instant; "
                         "give --rate or more --num-requests")
    return len(times) / span


def _with_replicas(opts: RunOptions, n: int, router: str) -> RunOptions:
    fleet = replace(opts.fleet, replicas=n, router=router if n > 1 else None,
                    router_args=opts.fleet.router_args if n > 1 else None,
                    kv_event_delay_s=opts.fleet.kv_event_delay_s if n > 1 else None)
    return replace(opts, fleet=fleet)


def replicas_for_rate(opts: RunOptions, rate: float,
                      simulate: Callable[[RunOptions], dict[str, Any]] | None = None,
                      on_probe: Callable[[ReplicaProbe], None] | None = None
                      ) -> ReplicasAnswer:
    if not rate > 0:
        raise ValueError(f"--replicas-for-rate must be > 0, got {rate}")
    if simulate is None:
        from experiments.answers.runner import simulate_options

        def simulate(o: RunOptions) -> dict[str, Any]:
            return simulate_options(o)[0]

    router = opts.fleet.resolved_router
    base = _at_rate(opts, rate)
    probes: list[ReplicaProbe] = []
    rows: dict[int, dict[str, Any]] = {}

    def fails(n: int) -> bool:
        row = simulate(_with_replicas(base, n, router))
        rows[n] = row
        bad, why = probe_fails(row)
        p = ReplicaProbe(n, float(row["rate_req_s"]), bad, why)
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return bad

    lo, hi = 0, 1  # lo fails (0 trivially), hi is the count tried next
    while fails(hi):
        lo, hi = hi, hi * 2
        if hi > MAX_REPLICAS:
            return ReplicasAnswer(rate, router, None, slo_text(opts), None, tuple(probes))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            lo = mid
        else:
            hi = mid
    return ReplicasAnswer(rate, router, hi, slo_text(opts), rows[hi], tuple(probes))


@dataclass(frozen=True)
class KneeAnswer:
    """The knee (highest sustainable rate) of each router on the options' fleet."""

    replicas: int
    knees: dict[str, CapacityResult]

    def lines(self) -> list[str]:
        out = [f"knee QPS per router ({self.replicas} replicas):"]
        for router, cap in self.knees.items():
            if cap.rate_req_s is None:
                out.append(f"  {router}: overloaded at the smallest load tried")
            else:
                extra = f" ({cap.binding} binds above)" if cap.binding else ""
                out.append(f"  {router}: {cap.rate_req_s:.3g} req/s, "
                           f"{cap.throughput_tok_s:,.0f} output tok/s{extra}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"replicas": self.replicas,
                "knees": {r: c.to_dict() for r, c in self.knees.items()}}


def knee_per_router(opts: RunOptions, routers: list[str], steps: int,
                    simulate: Callable[[RunOptions], dict[str, Any]] | None = None,
                    on_probe: Callable[[Probe], None] | None = None) -> KneeAnswer:
    if opts.fleet.replicas < 2:
        raise ValueError("--knee-routers compares routers of a fleet: give --replicas 2 or "
                         "more")
    knees = {}
    for router in routers:
        o = replace(opts, fleet=replace(opts.fleet, router=router))
        o.sim_config()  # a router that cannot run here fails before any simulation
        knees[router] = find_sustainable_rate(o, steps=steps, simulate=simulate,
                                              on_probe=on_probe)
    return KneeAnswer(opts.fleet.replicas, knees)
