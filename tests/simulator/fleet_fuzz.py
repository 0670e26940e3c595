"""Differential fuzzing of fleets: the engine fuzz's small random cases (tests/simulator/
engine_fuzz.py), run as 2-4 replicas behind a random router, each simulated twice (with the
multi-step fast-forward and one step per iteration), invariants checked every iteration (the
replicas' policies and the router's structures), each run bounded so that a livelock fails.

Fleet case `seed` is engine case `seed`'s workload and engine with: replicas in 2..4, a
router drawn from every registered one (a router reading KV events only on a policy that
publishes them, else another), in half the cases of some routers settings other than the
defaults (`ROUTER_ARGS`), a KV event delay (`DELAYS`) for a router reading events, and in a
tenth of the cases the benchmark client's `--max-concurrency`. Seeds from the engine fuzz's
HYBRID_SEED0 on are its hybrid-model cases, behind the routers that read no events. What
must hold: the two runs' cluster summaries, request rows (with their replicas) and replica
rows are identical, and every request ends once (completed or rejected), sessions turn by
turn.

Used by tests/simulator/test_fleet_fuzz.py (a slice) and benchmarks/fuzz_fleet.py (a sweep).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.contract.validation import InvariantError
from simulator.config import SimConfig
from simulator.fleet import ROUTERS, FleetSetup, parse_settings, simulate_fleet
from simulator.guard import LivelockError
from simulator.run import SimResult
from simulator.specs import caching_policies
from tests.simulator.engine_fuzz import HYBRID_MODELS, FuzzOutcome, make_case, time_limit
from workloads.request import Workload

__all__ = ["FleetCase", "fleet_case", "reads_events", "run_fleet_case"]

#: routers whose KV events the fuzz may read with a delay
DELAYS = (0.0, 0.01, 0.05, 0.2, 1.0)
#: settings other than the defaults, one drawn in half the cases of a router listed here:
#: the paths the defaults leave idle at this scale (the cache-aware tree's eviction and
#: imbalance rule, Dynamo's softmax and its approximate mode, the LRU index's eviction,
#: the session router's rate window, a bounded load of 1)
ROUTER_ARGS: dict[str, tuple[str, ...]] = {
    "cache-aware": ("eviction-interval-s=0.2,max-tree-size=64",
                    "balance-abs-threshold=1,balance-rel-threshold=1.0",
                    "cache-threshold=0"),
    "dynamo": ("router-temperature=0.5", "kv-events=false,ttl-s=0.3",
               "overlap-score-credit=0.5,prefill-load-scale=2"),
    "llm-d": ("autotune=false,block-tokens=4,lru-capacity=8", "precise=2,prefix=1"),
    "llm-d-estimated": ("lru-capacity=4,max-prefix-blocks=2",),
    "llm-d-precise": ("normalization=absolute",),
    "session": ("qps-window-s=0.1,ring-points=1",),
    "chwbl": ("load-factor=1.0,prefix-tokens=4",),
}


@dataclass(frozen=True)
class FleetCase:
    workload: Workload
    cfg: SimConfig
    setup: FleetSetup

    def describe(self) -> str:
        c = self.cfg
        return (f"{self.setup.replicas} x {c.policy.policy} page={c.policy.page_size} "
                f"kv_tokens={c.pool.kv_tokens} router={self.setup.router} "
                f"args={self.setup.router_args} "
                f"delay={self.setup.kv_event_delay_s} admission={c.engine.admission} "
                f"schedule={c.engine.schedule} preempt={c.engine.preempt} "
                f"max_concurrency={c.engine.max_concurrency} "
                f"requests={self.workload.num_requests} sessions={len(self.workload.sessions)}")


def reads_events(router: str, args: str | None = None) -> bool:
    """With these settings (default: the router's defaults)."""
    return ROUTERS.get(router).reads_kv_events(parse_settings(router, args))


def fleet_case(seed: int) -> FleetCase:
    w, cfg = make_case(seed)
    rng = np.random.default_rng([seed, 0xF1EE7])
    replicas = int(rng.integers(2, 5))
    events = [r for r in ROUTERS.names() if reads_events(r)]
    others = [r for r in ROUTERS.names() if not reads_events(r)]
    # a hybrid model's pools publish no KV events (simulator/fleet/kv_events.py)
    publishes = cfg.policy.policy in caching_policies() and cfg.pool.model not in \
        HYBRID_MODELS
    # half the cases whose replicas publish KV events read them (the rarer, harder path)
    pick = events if publishes and rng.random() < 0.5 else others
    router = str(rng.choice(pick))
    delay = float(rng.choice(DELAYS)) if router in events else 0.0
    if rng.random() < 0.1:
        cfg = cfg.replace(max_concurrency=int(rng.integers(1, 4)))
    # drawn last, so the draws above (and the cases the test slice picked) stay as they were
    args = None
    choices = [a for a in ROUTER_ARGS.get(router, ()) if publishes or not reads_events(router, a)]
    if choices and rng.random() < 0.5:
        args = str(rng.choice(choices))
        if not reads_events(router, args):
            delay = 0.0
    return FleetCase(w, cfg, FleetSetup(replicas, router, args, delay))


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float) and np.isnan(x) and np.isnan(y):
        return True
    return x == y


def differences(a: SimResult, b: SimResult) -> str:
    """What differs between two fleet results (summary keys, request columns, replica
    rows)."""
    skip = {"sim_wall_s", "max_steps_per_stretch"}
    diff = [k for k in a.summary if k not in skip and not _same(a.summary[k], b.summary[k])]
    ra, rb = a.requests.reset_index(drop=True), b.requests.reset_index(drop=True)
    if not ra.equals(rb):
        cols = [c for c in ra.columns if not ra[c].equals(rb[c])] if ra.shape == rb.shape \
            else ["shape"]
        diff.append(f"requests[{','.join(cols)}]")
    fa, fb = a.extra["fleet"], b.extra["fleet"]
    if fa.views != fb.views:
        pairs = zip(fa.views, fb.views, strict=False)
        first = next((i for i, (x, y) in enumerate(pairs) if x != y),
                     min(len(fa.views), len(fb.views)))
        diff.append(f"the router's view at decision {first}")
    for i, (x, y) in enumerate(zip(fa.replica_rows, fb.replica_rows, strict=True)):
        keys = [k for k in x if not _same(x[k], y[k])]
        if keys:
            diff.append(f"replica {i}[{','.join(keys)}]")
    return ", ".join(diff)


def unaccounted(w: Workload, res: SimResult) -> str:
    """Every open-loop request once, completed or rejected; each session's turns once, up to
    its first rejected turn."""
    rq = res.requests
    if not rq.status.isin(["completed", "rejected"]).all():
        return "a request is unfinished"
    if rq.request_id.duplicated().any():
        return "a request is reported twice"
    status = dict(zip(rq.request_id.tolist(), rq.status.tolist(), strict=True))
    if not {r.request_id for r in w.requests} <= set(status):
        return "an open-loop request is missing"
    for s in w.sessions:
        for k, rid in enumerate(s.request_ids):
            if rid not in status:
                prev = s.request_ids[k - 1] if k else None
                if prev is None or status.get(prev) != "rejected":
                    return f"session {s.session_id} turn {k} is missing"
                break
    routed = sum(r["requests_routed"] for r in res.extra["fleet"].replica_rows)
    if routed != len(rq):
        return f"{routed} routed, {len(rq)} reported"
    return ""


def run_fleet_case(seed: int, time_limit_s: float = 30.0) -> FuzzOutcome:
    case = fleet_case(seed)
    stepped = case.cfg.replace(max_steps_per_stretch=1)
    results = []
    stretches = [0]

    def count(t0: float, t1: float, chunks: object, rids: object, steps: int) -> None:
        stretches[0] += steps >= 2

    n = case.workload.num_requests
    try:
        for c, sink in ((case.cfg, count), (stepped, None)):
            with time_limit(time_limit_s):
                results.append(simulate_fleet(case.workload, c, case.setup,
                                              event_sink=sink))
    except LivelockError as e:
        return FuzzOutcome(seed, "livelock", str(e), n)
    except InvariantError as e:
        return FuzzOutcome(seed, "invariant", str(e), n)
    except Exception as e:  # a hang (the time limit) or any other crash is a finding too
        kind = "hang" if type(e).__name__ == "_Timeout" else "error"
        return FuzzOutcome(seed, kind, f"{type(e).__name__}: {e}", n)
    diff = differences(*results)
    if diff:
        return FuzzOutcome(seed, "differ", diff, n, stretches[0])
    missing = unaccounted(case.workload, results[0])
    if missing:
        return FuzzOutcome(seed, "error", missing, n, stretches[0])
    return FuzzOutcome(seed, "ok", "", n, stretches[0])
