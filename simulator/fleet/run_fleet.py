"""`simulate_fleet(workload, config, fleet)`: a fleet's run, its cluster summary (the same
columns as a single run's), each replica's row and the fleet's own figures.

The result is a `SimResult` whose summary, requests and timeline are the cluster's (the
requests of every replica; the timeline the replicas' memory summed at every sample), so
everything that reads a run reads a fleet; `extra["fleet"]` (`FleetOutcome`) adds each
replica's row and timeline, each request's replica and the fleet's columns. A fleet of one
replica is that replica: its summary, requests and timeline are exactly those of `simulate`
(tests/simulator/test_fleet.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import simpy
import torch

from kvcore.contract.breakdown import PARTS
from simulator.config import SimConfig
from simulator.fleet.fleet import Fleet
from simulator.fleet.router import ROUTERS, parse_settings
from simulator.fleet.summary import (
    REPLICA_COLUMNS,
    cluster_requests,
    combine,
    fleet_columns,
    percentile,
    recompute,
    replica_columns,
)
from simulator.metrics import TIMELINE_COLUMNS, Recorder
from simulator.overload import Unfinished, overload_verdict
from simulator.request_table import RequestColumns, column
from simulator.reuse_gap import reuse_gap
from simulator.run import (
    TORCH_THREADS,
    SimResult,
    first_arrival,
    overload_columns,
    prefix_block,
    summarize,
    unfinished_requests,
)
from simulator.run_summary import RunSummary
from simulator.shared_tier import SHARED_COLUMNS, shared_columns
from workloads.request import Workload

__all__ = ["FleetOutcome", "FleetSetup", "simulate_fleet"]


@dataclass(frozen=True)
class FleetSetup:
    """The fleet a run simulates: replicas, router (by name) and its settings text, and the
    delay of the KV events its router reads."""

    replicas: int = 1
    router: str = "round-robin"
    router_args: str | None = None
    kv_event_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        if self.kv_event_delay_s < 0:
            raise ValueError(f"--kv-event-delay-s must be >= 0, got {self.kv_event_delay_s}")
        parse_settings(self.router, self.router_args)  # a mistake before anything runs

    @property
    def settings(self) -> Any:
        return parse_settings(self.router, self.router_args)

    @property
    def reads_kv_events(self) -> bool:
        return ROUTERS.get(self.router).reads_kv_events(self.settings)


@dataclass
class FleetOutcome:
    """What a fleet run adds to its cluster result."""

    router: str
    replica_rows: list[dict]
    columns: dict[str, Any]  # FLEET_COLUMNS
    request_replica: np.ndarray  # each row of the result's requests: its replica
    replica_timelines: list[list[tuple]] = field(repr=False, default_factory=list)
    #: with --check-invariants: a digest of the router's view at each decision
    views: list[int] | None = field(repr=False, default=None)


def _tee(first: Callable[..., None], second: Callable[..., None]) -> Callable[..., None]:
    def both(*args: Any) -> None:
        first(*args)
        second(*args)

    return both


def simulate_fleet(workload: Workload, cfg: SimConfig, setup: FleetSetup,
                   progress: bool | Callable[[int], None] = False,
                   event_sink: Callable[..., None] | None = None) -> SimResult:
    """Run `setup.replicas` engines of `cfg` behind the router over `workload`."""
    torch.set_num_threads(TORCH_THREADS)
    wall0 = time.perf_counter()
    env = simpy.Environment()
    bar = None
    tick: Callable[[int], None] | None = progress if callable(progress) else None
    if progress and tick is None:
        from tqdm import tqdm

        bar = tqdm(total=workload.num_requests, unit="req", desc="simulating", leave=False)
        tick = bar.update
    try:
        fleet = Fleet(env, workload, cfg, setup.replicas, setup.router, setup.settings,
                      setup.kv_event_delay_s, tick)
    except BaseException:
        if bar is not None:
            bar.close()
        raise
    n = fleet.n
    parts = fleet.parts
    # the cluster's inter-token gaps, pooled as each replica records its own
    pool = Recorder(1, 0.0, 0.0, 1.0, 1)
    if n > 1:
        for p in parts:
            p.rec.add_gaps = _tee(p.rec.add_gaps, pool.add_gaps)  # type: ignore[method-assign]
    for p in parts:
        p.engine.event_sink = event_sink
    fleet.start()
    end = parts[0].end
    backlog: list[int] | None = None

    def close_window():
        nonlocal backlog
        if np.isfinite(end) and end > env.now:
            yield env.timeout(end - env.now)
        backlog = [len(e.waiting) for e in fleet.engines]

    env.process(close_window())
    try:
        if cfg.engine.drain:
            env.run()
        else:
            env.run(until=end if np.isfinite(end) else None)
    finally:
        if bar is not None:
            bar.close()
    if backlog is None:
        backlog = [len(e.waiting) for e in fleet.engines]
    summaries, tables = [], []
    for i, p in enumerate(parts):
        if not np.isfinite(p.rec.window_end):
            p.rec.window_end = env.now
        p.engine.close_idle(max(p.rec.window_end, env.now))
        requests = p.rec.requests_columns()
        if n == 1:
            s = summarize(p.engine, p.rec, cfg, p.policy, p.latency, requests, backlog[i],
                          overload=overload_columns(workload, cfg, p.latency, p.rec, requests,
                                                    backlog[i], unfinished_requests(p.engine)),
                          reuse=reuse_gap(workload, requests, prefix_block(cfg, p.policy)))
        else:  # a replica's figures over what it was sent; the reuse gap is the cluster's
            s = summarize(p.engine, p.rec, cfg, p.policy, p.latency, requests, backlog[i],
                          overload=_replica_overload(cfg, p, requests, backlog[i]))
            s = replace(s, requests_total=int(fleet.routed[i]))
        summaries.append(s)
        tables.append(requests)
    if n == 1:
        summary = summaries[0]
        requests, which = tables[0], np.zeros(len(tables[0]), dtype=np.int64)
        timeline = parts[0].rec.timeline
        p90 = _p90s(requests, parts[0].rec.itl_percentiles((90,))[0])
    else:
        requests, which = cluster_requests(tables)
        requests = RequestColumns({**{c: requests[c] for c in requests}, "replica": which}
                                  if len(requests) else {},
                                  (*requests.names, "replica"), len(requests))
        gaps = pool.gaps if pool.gap_spill is None else []
        recomputed = recompute(requests, fleet.engines, [p.rec for p in parts], gaps,
                               first_arrival(workload), workload.num_requests)
        if pool.gap_spill is not None:  # a long run's pooled gaps went to disk
            itl = pool.itl_percentiles((50, 90, 99))
            recomputed.update(itl_p50_s=itl[0], itl_p90_s=itl[1], itl_p99_s=itl[2])
        p0 = parts[0]
        recomputed.update(overload_verdict(
            **_arrivals(workload), requests=requests, start=p0.rec.window_start,
            end=p0.rec.window_end, backlog=sum(backlog), latency=p0.latency,
            chunk=cfg.engine.chunked_prefill_size, page_size=cfg.policy.page_size,
            unfinished=_unfinished(fleet.engines)))
        recomputed.update(reuse_gap(workload, requests, prefix_block(cfg, p0.policy)))
        summary = RunSummary.from_columns(combine(summaries, recomputed))
        p90 = {f"{m}_p90_s": recomputed[f"{m}_p90_s"] for m in ("ttft", "tpot", "itl")}
        timeline = _summed_timeline([p.rec.timeline for p in parts],
                                    [p.policy.capacity for p in parts])
    wall = time.perf_counter() - wall0
    summary = replace(summary, sim_wall_s=wall)
    if fleet.shared is not None:  # the shared tier's figures; its capacity counted once
        summary = replace(summary, **shared_columns(fleet.shared, summary))
    outcome = _outcome(fleet, summaries, tables, summary, which, setup, requests)
    outcome.columns.update(p90)
    if fleet.shared is not None:
        outcome.columns.update({c: summary[c] for c in SHARED_COLUMNS})
    result = SimResult(summary, requests, timeline, cfg,
                       {"latency": parts[0].latency.describe(), "fleet": outcome})
    return result


def _p90s(requests, itl90: float) -> dict[str, float]:
    done = column(requests, "status") == "completed" if len(requests) else None
    out = {"itl_p90_s": itl90}
    for m in ("ttft", "tpot"):
        vals = column(requests, f"{m}_s")[done].astype(float) if done is not None else \
            np.zeros(0)
        out[f"{m}_p90_s"] = percentile(vals, 90)
    return out


def _arrivals(workload: Workload) -> dict[str, np.ndarray]:
    arrivals, prompt_lens = workload.arrivals_and_prompt_lens()
    return {"arrivals": arrivals, "prompt_lens": prompt_lens}


def _replica_overload(cfg: SimConfig, p, requests, backlog: int) -> dict:
    """A replica's overload verdict over the requests it was sent."""
    if len(requests):
        arrivals = column(requests, "arrival_s").astype(float)
        prompts = column(requests, "prompt_len").astype(float)
    else:
        arrivals = prompts = np.zeros(0)
    return overload_verdict(arrivals=arrivals, prompt_lens=prompts, requests=requests,
                            start=p.rec.window_start, end=p.rec.window_end, backlog=backlog,
                            latency=p.latency, chunk=cfg.engine.chunked_prefill_size,
                            page_size=cfg.policy.page_size,
                            unfinished=unfinished_requests(p.engine))


def _unfinished(engines) -> Unfinished:
    """The requests every replica ended with (the cluster's verdict counts them)."""
    parts = [unfinished_requests(e) for e in engines]
    return Unfinished(np.concatenate([u.arrival_s for u in parts]),
                      np.concatenate([u.admit_s for u in parts]))


def _summed_timeline(timelines: list[list[tuple]], capacities: list[int]) -> list[tuple]:
    """The replicas' timelines as one: at every replica's sample, the sum over replicas of
    each one's latest sample (an idle replica: its pool free until its first sample)."""
    width = len(TIMELINE_COLUMNS) - 1
    free = PARTS.index("free") + 1
    latest = []
    for cap in capacities:
        row = [0] * width
        row[free - 1] = cap
        latest.append(row)
    total = [sum(r[k] for r in latest) for k in range(width)]
    events = sorted((row[0], i, k) for i, tl in enumerate(timelines) for k, row in
                    enumerate(tl))
    out: list[tuple] = []
    for t, i, k in events:
        row = timelines[i][k][1:]
        prev = latest[i]
        total = [a + b - c for a, b, c in zip(total, row, prev, strict=True)]
        latest[i] = list(row)
        if out and out[-1][0] == t:
            out[-1] = (t, *total)
        else:
            out.append((t, *total))
    return out


def _outcome(fleet: Fleet, summaries: list[RunSummary], tables: list, cluster: RunSummary,
             which: np.ndarray, setup: FleetSetup, requests) -> FleetOutcome:
    rows = [replica_columns(i, s, t, int(fleet.routed[i]), p.rec.itl_percentiles((90,))[0])
            for i, (s, t, p) in enumerate(zip(summaries, tables, fleet.parts, strict=True))]
    admitted = ~np.isnan(column(requests, "admit_s").astype(float)) if len(requests) else \
        np.zeros(0, dtype=bool)
    prompt_tokens = float(column(requests, "prompt_len")[admitted].sum()) \
        if len(requests) else 0.0
    ideal = math.nan if cluster.ideal_hit_rate is None else cluster.ideal_hit_rate
    working = prompt_tokens * (1.0 - ideal) if not math.isnan(ideal) else math.nan
    decisions = int(fleet.routed.sum())
    cols = fleet_columns(rows, fleet.how, decisions, fleet.router_s,
                         fleet.router.prefix_aware, working,
                         fleet.parts[0].policy.capacity, fleet.kv_index is not None)
    return FleetOutcome(setup.router, rows, cols, which,
                        [p.rec.timeline for p in fleet.parts], fleet.views)


__all__ += ["REPLICA_COLUMNS"]
