"""`Fleet`: several replicas of one engine in one SimPy environment, their arrivals through a
router.

Each replica is a whole engine built exactly as a single run builds its one
(`simulator.run.build_engine`: its own pool, page table, prefix cache, tiers, admission and
latency model, the same `--tp` and memory rule); the fleet replaces only where its requests
come from. One `Arrivals` process (simulator/arrivals.py: open loop, closed-loop sessions,
the benchmark client's `--max-concurrency`) hands every request to `dispatch`, which asks
the router for a replica and enqueues the request there; each engine reads its `Inbox` in
place of its own arrivals.

Stepping and fast-forward stay identical (the fleet cases of the engine fuzz): a replica's
multi-step stretch must end in the step where anything the router reads or sends could
happen, as it ends where its own next arrival falls. `Inbox.next_due` tells it when:

* the next request the fleet will dispatch (every replica: the router may send it to any),
  or, when the router decides ahead (its decisions depend on the requests alone: random,
  round robin, session affinity) on an open-loop stream, the next one routed to it;
* with KV events read after a delay d, the next arrival time less d: a stretch applies its
  steps' allocations and evictions when it starts, so the events of steps up to that instant
  must all be emitted by then, in both modes;
* with closed-loop sessions, a turn another replica finishes releases the next turn a think
  time later, announced only then: a stretch ends by now + (the shortest think time - d);
* with `--max-concurrency` a request is sent when another one finishes, at any replica's
  step end: replicas then step (a stretch of one step);
* a QPS ladder whose stages wait for a drain (simulator/stage_gate.py): the gate counts the
  requests of every replica (`done` hands each to the one `Arrivals`); a held stage needs no
  bound, as it opens only once every request has ended, when no replica is in a stretch; the
  open stream's times are the current stage's (generated + the gate's shift), so no router
  decides ahead.

At those instants a replica's queues, running batch and pool are what stepping would hold, so
the load a router reads (`waiting`, `running`, `kv_usage`) is the same in both modes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import simpy

from kvcore.tiers.shared import SharedTier
from simulator.arrivals import Arrivals
from simulator.config import SimConfig
from simulator.fleet.kv_events import attach_kv_events, event_block
from simulator.fleet.kv_index import KVEventIndex
from simulator.fleet.router import (
    ROUTERS,
    Decision,
    PoolReport,
    RoutedRequest,
    Router,
)
from simulator.request import SimRequest
from simulator.run import EngineParts, build_engine
from simulator.shared_tier import attach_shared, check_shared_tier, replica_tier
from workloads.columns import arrival_column, arrival_order, id_column
from workloads.request import Request, Workload

__all__ = ["Fleet", "Inbox", "LazyRequest"]

#: the router's random stream is its own (seeded from --seed), so a router that draws does
#: not shift the engine's or the workload's draws
ROUTER_STREAM = 0x524F55544552


class LazyRequest(RoutedRequest):
    """A `RoutedRequest` whose prompt ids are generated when a router first reads them
    (random, round robin, least load and session affinity never do)."""

    __slots__ = ("_ids", "req")

    def __init__(self, req: Request, limit: int) -> None:
        self.req = req
        self.rid = req.request_id
        self.session_id = req.session_id
        self.limit = limit
        self._hashes = {}
        self._ids: np.ndarray | None = None

    @property  # type: ignore[override]
    def prompt(self) -> np.ndarray:
        if self._ids is None:
            self._ids = self.req.prompt_ids()
        return self._ids


class Inbox:
    """What replica `index`'s engine reads in place of its own `Arrivals`."""

    def __init__(self, fleet: Fleet, index: int) -> None:
        self.fleet = fleet
        self.index = index

    def start(self) -> None:
        """The fleet's one arrival process is started by the fleet."""

    def next_due(self) -> float:
        return self.fleet.due(self.index)

    def pending(self) -> bool:
        return self.fleet.arrivals.pending()

    def done(self, sreq: SimRequest) -> None:
        self.fleet.done(self.index, sreq)


class Fleet:
    """The replicas, the router and the arrival process of one fleet run; also the router's
    view of the replicas (`FleetView`)."""

    def __init__(self, env: simpy.Environment, workload: Workload, cfg: SimConfig,
                 replicas: int, router: str, settings: Any, kv_event_delay_s: float,
                 tick: Callable[[int], None] | None = None) -> None:
        if replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {replicas}")
        self.env = env
        self.workload = workload
        self.cfg = cfg
        self.n = replicas
        check_shared_tier(cfg.tier, replicas)
        each = replace(cfg, tier=replica_tier(cfg.tier))  # a shared tier: each one's storage
        self.parts: list[EngineParts] = [build_engine(env, workload, each, tick)
                                         for _ in range(replicas)]
        self.shared: SharedTier | None = (attach_shared([p.policy for p in self.parts])
                                          if cfg.tier.shared_tier_size else None)
        self.engines = [p.engine for p in self.parts]
        self.arrivals = Arrivals(env, workload, self.dispatch, cfg.engine.max_concurrency)
        # each engine's own arrivals hold its enqueue (a public attribute): the router's
        # way in; the engine then reads its Inbox instead
        self.enqueue_into: list[Callable[[Request], SimRequest]] = [
            e.arrivals.enqueue for e in self.engines]
        for i, e in enumerate(self.engines):
            e.arrivals = Inbox(self, i)  # type: ignore[assignment]
        first = self.parts[0].policy
        self.pool = PoolReport(first.page_size, first.capacity // first.page_size,
                               self.engines[0].max_context_len, event_block(first))
        cls = ROUTERS.get(router)
        self.router: Router = cls(replicas, settings,
                                  np.random.default_rng([cfg.engine.seed, ROUTER_STREAM]),
                                  self.pool)
        self.router_name = router
        self.kv_index: KVEventIndex | None = None
        if cls.reads_kv_events(settings):
            self.kv_index = KVEventIndex(replicas, kv_event_delay_s)
            for i, p in enumerate(self.parts):
                attach_kv_events(p.policy, i, self.kv_index, env, self.router.kv_block(),
                                 self.pool.max_len)
        self.delay = kv_event_delay_s if self.kv_index is not None else 0.0
        self.now = 0.0
        # routed requests still in flight (the response stream: first token, end)
        self.live: dict[int, SimRequest] = {}
        self.routed = np.zeros(replicas, dtype=np.int64)
        self.how: dict[str, int] = {}
        self.router_s = 0.0  # wall seconds spent deciding
        # with --check-invariants, a digest of what the router could read at each decision
        # (the engine fuzz compares them between stepping and fast-forward)
        self.views: list[int] | None = [] if cfg.engine.check_invariants else None
        self._plan_dues(workload)

    # -- when each replica must be at a step boundary ----------------------------------------
    def _plan_dues(self, workload: Workload) -> None:
        order = arrival_order(workload.requests)
        self.open_ids = id_column(order)
        self.open_times = arrival_column(order)
        self.open_sent = 0
        thinks = [t.think_time_s for s in workload.sessions for t in s.turns[1:]]
        self.min_think = min(thinks) if thinks else math.inf
        self.sessions = {s.session_id: s for s in workload.sessions}
        self.releases: list[float] = []  # announced session turns' release times, sorted
        self.gated = bool(self.cfg.engine.max_concurrency)
        self.ahead: list[int] | None = None
        if self.n > 1 and self.router.decides_ahead and not workload.sessions \
                and not self.gated and self.arrivals.gate is None:
            self._route_ahead(order)

    def _route_ahead(self, order) -> None:
        """Route the whole open-loop stream now (the router reads nothing that changes)."""
        targets = []
        for k in range(len(order)):
            self.now = float(self.open_times[k])
            targets.append(self._decide(LazyRequest(order[k], self.pool.max_len)))
        self.ahead = targets
        arr = np.array(targets, dtype=np.int64)
        self.own_times = [self.open_times[arr == i] for i in range(self.n)]
        self.own_next = [0] * self.n

    def due(self, i: int) -> float:
        """The time by which replica i's next stretch must have ended (its last step is the
        one in which this falls)."""
        arrivals = self.arrivals
        if self.n == 1:
            return arrivals.next_due()
        now = self.env.now
        if self.gated:
            return now
        if self.ahead is not None:
            k = self.own_next[i]
            own = self.own_times[i]
            return float(own[k]) if k < len(own) else math.inf
        t = arrivals.next_due()
        d = self.delay
        if self.sessions and arrivals.pending():
            # a turn not announced yet is released a think time after a finish to come
            t = min(t, now + max(self.min_think - d, 0.0))
        gate = arrivals.gate
        shift = gate.shift if gate is not None else 0.0  # the current stage's times
        if d > 0:
            k = max(int(np.searchsorted(self.open_times, now + d - shift, side="left")),
                    self.open_sent)
            if k < len(self.open_times):
                t = min(t, max(float(self.open_times[k]) + shift - d, now))
            releases = self.releases
            while releases and releases[0] < now:
                releases.pop(0)
            j = bisect.bisect_left(releases, now + d)
            if j < len(releases):
                t = min(t, max(releases[j] - d, now))
        return t

    # -- routing -----------------------------------------------------------------------------
    def _decide(self, req: RoutedRequest) -> int:
        import time

        t0 = time.perf_counter()
        d: Decision = self.router.choose(req, self)
        self.router_s += time.perf_counter() - t0
        if self.views is not None:
            self.views.append(self.view_digest())
        self.routed[d.replica] += 1
        self.how[d.how] = self.how.get(d.how, 0) + 1
        if self.cfg.engine.check_invariants:
            self.check_invariants()
        return d.replica

    def dispatch(self, req: Request) -> SimRequest:
        """A request the arrival process sends now: routed, enqueued at its replica."""
        open_loop = (self.open_sent < len(self.open_ids)
                     and req.request_id == self.open_ids[self.open_sent])
        routed = LazyRequest(req, self.pool.max_len)
        if self.ahead is not None and open_loop:
            i = self.ahead[self.open_sent]
            self.own_next[i] += 1
        else:
            self.now = self.env.now
            if self.kv_index is not None:
                self.kv_index.advance(self.now)
            i = self._decide(routed)
        if open_loop:
            self.open_sent += 1
        self.router.sent(i, routed)
        sreq = self.enqueue_into[i](req)
        if sreq.status != "rejected":
            self.live[sreq.rid] = sreq
        return sreq

    def done(self, i: int, sreq: SimRequest) -> None:
        """Replica i finished (or rejected) `sreq`: its response ends (and a session's next
        turn is due a think time later: `Arrivals` announces it the same way)."""
        self.live.pop(sreq.rid, None)
        req = sreq.req
        if self.delay > 0 and req.session_id is not None and sreq.status == "completed":
            turns = self.sessions[req.session_id].turns
            k = (req.turn or 0) + 1
            if k < len(turns):
                bisect.insort(self.releases, self.env.now + turns[k].think_time_s)
        self.router.finished(i, sreq.rid)
        self.arrivals.done(sreq)

    # -- what the router may read (FleetView) ------------------------------------------------
    def waiting(self, replica: int) -> int:
        return len(self.engines[replica].waiting)

    def running(self, replica: int) -> int:
        e = self.engines[replica]
        return len(e.running) + len(e.prefilling)

    def kv_usage(self, replica: int) -> float:
        """vLLM's `kv_cache_usage` / SGLang's token usage: slots held by requests (written,
        reserved, rounding) over the pool; evictable cache counts as free."""
        e = self.engines[replica]
        b = e.policy.breakdown(e.head_reservation())
        return (b.token_states + b.reserved + b.internal) / b.capacity

    def prefill_done(self, rid: int) -> bool:
        sreq = self.live.get(rid)
        return sreq is None or not math.isnan(sreq.first_token_s)

    # -- running -----------------------------------------------------------------------------
    def start(self) -> None:
        """The arrival process first, then each engine: for one replica, the processes of a
        single run in the same order (their events at one instant run in that order)."""
        self.arrivals.start()
        for e in self.engines:
            e.start()

    def view_digest(self) -> int:
        """Everything a router may read now, as one hash: the loads, the in-flight counts,
        the prefills done, and the KV event index."""
        n = range(self.n)
        index = None
        if self.kv_index is not None:
            index = hash(frozenset(self.kv_index.entries()))
        return hash((self.now, tuple(self.waiting(i) for i in n),
                     tuple(self.running(i) for i in n), tuple(self.kv_usage(i) for i in n),
                     tuple(self.router.in_flight),
                     tuple(sorted(r for r in self.live if self.prefill_done(r))), index))

    def check_invariants(self) -> None:
        self.router.check_invariants()
        if self.shared is not None:
            self.shared.check_invariants()
        if self.kv_index is not None:
            self.kv_index.check_invariants()
