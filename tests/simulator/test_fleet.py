"""Fleets: one replica is the single engine, whatever the router; a fleet's cluster summary
adds up its replicas'; each router's rule on hand-made loads; the KV events the replicas
publish rebuild their caches exactly."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvcore.vllm.block_hash import NONE_HASH, ChainHasher
from simulator.config import FLAT_FIELDS
from simulator.fleet import ROUTERS, FleetSetup, parse_settings, simulate_fleet
from simulator.fleet.dynamo_router import softmax_pick
from simulator.fleet.router import LOAD, MATCH, PoolReport, RoutedRequest
from simulator.fleet.summary import RULES
from simulator.run import simulate
from tests.simulator.helpers import chat, config, kshot, mixed, with_misfits

POOL = PoolReport(page_size=4, blocks=100, max_len=512, event_block=4)


def _same_run(a, b) -> None:
    skip = {"sim_wall_s"}
    diff = {k: (a.summary[k], b.summary[k]) for k in a.summary if k not in skip
            and not (a.summary[k] == b.summary[k]
                     or (isinstance(a.summary[k], float) and math.isnan(a.summary[k])
                         and math.isnan(b.summary[k])))}
    assert not diff, diff
    assert a.summary.keys() == b.summary.keys()
    pd.testing.assert_frame_equal(a.requests.reset_index(drop=True),
                                  b.requests.reset_index(drop=True), check_exact=True)
    pd.testing.assert_frame_equal(a.timeline, b.timeline, check_exact=True)


# -- one replica is the single engine ---------------------------------------------------------
@pytest.mark.parametrize("router", ROUTERS.names())
def test_one_replica_with_any_router_is_the_single_engine(router: str) -> None:
    w = mixed()
    cfg = config(policy="vllm" if "precise" in router or router == "dynamo" else "paged")
    _same_run(simulate(w, cfg), simulate_fleet(w, cfg, FleetSetup(1, router)))


@pytest.mark.parametrize("policy", ["paged", "paged-nocache", "vllm", "contiguous-pow2"])
def test_one_replica_reproduces_every_policys_rows(policy: str) -> None:
    for w in (kshot(), chat(), with_misfits(kshot(n=12), 512)):
        cfg = config(policy=policy, kv_tokens=1200)
        _same_run(simulate(w, cfg), simulate_fleet(w, cfg, FleetSetup(1, "cache-aware")))


def test_one_replica_with_a_host_tier_and_max_concurrency() -> None:
    w = kshot(n=30)
    cfg = config(policy="paged", kv_tokens=1000, hicache_ratio=2.0, max_concurrency=3)
    _same_run(simulate(w, cfg), simulate_fleet(w, cfg, FleetSetup(1, "least-load")))


# -- the cluster adds up ----------------------------------------------------------------------
@pytest.mark.parametrize("router", ["round-robin", "cache-aware", "llm-d-precise"])
def test_the_cluster_summary_adds_up_its_replicas(router: str) -> None:
    w = mixed()
    cfg = config(policy="vllm", kv_tokens=1500)
    res = simulate_fleet(w, cfg, FleetSetup(3, router))
    fleet = res.extra["fleet"]
    rows = fleet.replica_rows
    s = res.summary
    assert sum(r["requests_routed"] for r in rows) == w.num_requests == len(res.requests)
    assert sum(r["requests_completed"] for r in rows) == s["requests_completed"]
    assert s["capacity_slots"] == 3 * (1500 // 16 * 16)
    assert sorted(res.requests["replica"].unique()) == [i for i, r in enumerate(rows)
                                                        if r["requests_routed"]]
    counts = res.requests.groupby("replica").size()
    for i, r in enumerate(rows):
        assert counts.get(i, 0) == r["requests_routed"]
    assert fleet.columns["load_imbalance"] == pytest.approx(
        max(r["requests_routed"] for r in rows) / np.mean([r["requests_routed"]
                                                            for r in rows]))
    done = res.requests[res.requests.status == "completed"]
    assert s["ttft_p50_s"] == float(np.percentile(done.ttft_s, 50))
    hits = done.cached_tokens.sum() / done.prompt_len.sum()
    assert s["prefix_hit_rate"] == pytest.approx(hits, rel=0.05)
    # the summed timeline's parts add up to the cluster's capacity at every sample
    tl = res.timeline
    parts = ["token_states", "cached", "reserved", "internal", "external", "free"]
    assert (tl[parts].sum(axis=1) == s["capacity_slots"]).all()


def test_the_cluster_summary_has_a_single_runs_columns() -> None:
    """Every column of a single run's summary is in a fleet's (the reuse gap, which a
    replica's own summary lacks, included), and the working set against the cluster's KV is
    known for a workload with shared prefixes."""
    w = kshot(n=30)
    cfg = config(policy="paged", kv_tokens=1200)
    single = simulate(w, cfg).summary
    res = simulate_fleet(w, cfg, FleetSetup(2, "cache-aware"))
    assert set(single) <= set(res.summary), set(single) - set(res.summary)
    s, cols = res.summary, res.extra["fleet"].columns
    assert 0 < s["ideal_hit_rate"] <= 1
    assert s["prefix_hit_rate"] + s["reuse_gap_alignment"] + s["reuse_gap_not_arrived"] + \
        s["reuse_gap_capacity"] == pytest.approx(s["ideal_hit_rate"])
    assert cols["working_set_tokens"] > 0 and cols["fill_pct"] > 0


def test_every_summary_column_has_a_rule() -> None:
    for cfg in (config(), config(hicache_ratio=1.0)):
        res = simulate(kshot(n=6), cfg)
        unruled = [k for k in res.summary if k not in RULES and k not in FLAT_FIELDS]
        assert not unruled, f"columns without a cluster rule (simulator/fleet/summary.py): " \
                            f"{unruled}"


# -- each router's rule -----------------------------------------------------------------------
class View:
    """Hand-made loads for a router."""

    def __init__(self, waiting, running=None, usage=None, now=0.0, index=None):
        self.now, self.kv_index = now, index
        self._w, self._r = waiting, running or [0] * len(waiting)
        self._u = usage or [0.0] * len(waiting)

    def waiting(self, i):
        return self._w[i]

    def running(self, i):
        return self._r[i]

    def kv_usage(self, i):
        return self._u[i]

    def prefill_done(self, rid):
        return False


def make(name: str, n: int = 3, args: str | None = None, seed: int = 0):
    return ROUTERS.get(name)(n, parse_settings(name, args), np.random.default_rng(seed), POOL)


def req(rid: int, tokens, session=None) -> RoutedRequest:
    return RoutedRequest(rid, session, np.asarray(tokens, dtype=np.int64), 512)


def test_round_robin_and_least_load() -> None:
    rr = make("round-robin")
    assert [rr.choose(req(i, [1]), View([0] * 3)).replica for i in range(5)] == [0, 1, 2, 0, 1]
    ll = make("least-load")
    # vLLM's 4 x waiting + running: 4*1+0=4, 0+5=5, 4*1+1=5 -> replica 0
    assert ll.choose(req(0, [1]), View([1, 0, 1], [0, 5, 1])).replica == 0
    assert ll.choose(req(0, [1]), View([0, 0, 0], [2, 1, 1])).replica == 1  # first on a tie


def test_session_affinity_keeps_a_conversation_on_one_replica() -> None:
    w = chat(sessions=6, turns=3)
    res = simulate_fleet(w, config(), FleetSetup(3, "session"))
    per = res.requests.groupby("session_id").replica.nunique()
    assert (per == 1).all()
    assert res.requests.replica.nunique() > 1


def test_cache_aware_follows_the_match_until_loads_are_imbalanced() -> None:
    r = make("cache-aware", args="balance-abs-threshold=2,balance-rel-threshold=1.5")
    doc = list(range(100))
    assert r.choose(req(0, [*doc, 7]), View([0] * 3)).replica == 0  # least loaded
    r.sent(0, req(0, doc))
    d = r.choose(req(1, [*doc, 8]), View([0] * 3))
    assert (d.replica, d.how) == (0, MATCH)  # 100 / 101 > 0.3
    r.sent(0, req(1, doc))
    d = r.choose(req(2, [5, 6, 7]), View([0] * 3))
    assert (d.replica, d.how) == (1, LOAD)  # no match: least loaded
    r.sent(1, req(2, [5]))
    r.in_flight[0] = 4  # max - min = 4 > 2 and 4 > 1.5 * 0: imbalanced
    d = r.choose(req(3, [*doc, 9]), View([0] * 3))
    assert (d.replica, d.how) == (2, LOAD)
    assert r.tree.matched_by(np.array([*doc, 9]), 2) == 101  # the tree still records it


def test_cache_aware_threshold_is_strict() -> None:
    r = make("cache-aware", args="cache-threshold=0.5")
    r.choose(req(0, [1, 2, 3, 4]), View([0] * 3))  # to 0
    r.sent(0, req(0, [1]))
    d = r.choose(req(1, [1, 2, 9, 9]), View([0] * 3))  # 2 / 4 = 0.5, not above
    assert d.how == LOAD and d.replica == 1


def test_llm_d_queue_and_kv_scorers() -> None:
    r = make("llm-d-load")  # queue 1, kv 1
    # queue scores (max - w) / (max - min): 1, 0, 0.5; kv: 1 - usage: 0.2, 1.0, 0.9
    d = r.choose(req(0, [1]), View([0, 4, 2], usage=[0.8, 0.0, 0.1]))
    assert d.replica == 2  # 1.2, 1.0, 1.4
    # no prefix scorer: its decisions are not counted as matches or load fallbacks
    assert not r.prefix_aware and make("llm-d").prefix_aware


def test_llm_d_precise_minmax_and_absolute() -> None:
    from simulator.fleet.kv_index import KVEventIndex

    index = KVEventIndex(3, 0.0)
    h = ChainHasher(4, 512).chain(NONE_HASH, np.arange(16, dtype=np.int64))
    index.emit(0.0, 0, True, h[:4])
    index.emit(0.0, 1, True, h[:1])
    index.advance(0.0)
    minmax = make("llm-d", args="prefix=0,kv=0,queue=0,precise=1,normalization=minmax")
    absolute = make("llm-d", args="prefix=0,kv=0,queue=0,precise=1")
    q = req(0, np.arange(16))
    assert minmax._precise_scores(q, View([0] * 3, index=index)) == [1.0, 0.0, 0.0]
    assert absolute._precise_scores(q, View([0] * 3, index=index)) == [1.0, 0.25, 0.0]
    assert minmax.choose(q, View([0] * 3, index=index)) .replica == 0


def test_llm_d_approximate_scorer_remembers_its_own_decisions() -> None:
    r = make("llm-d-estimated", args="kv=0,queue=0")
    doc = list(range(64))
    first = r.choose(req(0, doc), View([0] * 3)).replica
    d = r.choose(req(1, [*doc, 1, 2]), View([0] * 3))
    assert (d.replica, d.how) == (first, MATCH)


def test_dynamo_cost_prefers_cached_blocks_against_load() -> None:
    from simulator.fleet.kv_index import KVEventIndex

    index = KVEventIndex(2, 0.0)
    prompt = np.arange(40, dtype=np.int64)  # 10 blocks of 4
    h = ChainHasher(4, 512).chain(NONE_HASH, prompt)
    index.emit(0.0, 1, True, h[:8])
    index.advance(0.0)
    r = make("dynamo", n=2)
    # worker 0: prefill 10 + decode 10 = 20; worker 1: prefill 10 - 8 = 2, decode 10 = 12
    d = r.choose(req(0, prompt), View([0, 0], index=index))
    assert (d.replica, d.how) == (1, MATCH)
    assert r.active[1].prefill[0] == 2.0


def test_softmax_pick_follows_dynamos_normalised_costs() -> None:
    assert softmax_pick([1.0, 1.0], 0.5, 0.6) == 1  # equal costs: uniform
    assert softmax_pick([0.0, 10.0], 1.0, 0.5) == 0  # p = e / (e + 1) = 0.73
    assert softmax_pick([0.0, 10.0], 1.0, 0.8) == 1


def test_chwbl_moves_on_when_the_owner_is_overloaded() -> None:
    r = make("chwbl", n=2)
    q = req(0, [3] * 30)
    owner = r.choose(q, View([0, 0])).replica
    r.in_flight[owner] = 5
    d = r.choose(q, View([0, 0]))
    assert (d.replica, d.how) == (1 - owner, LOAD)


# -- KV events rebuild the replicas' caches -----------------------------------------------------
def _radix_blocks(tree, block: int) -> list[int]:
    hasher = ChainHasher(block, 4096)
    out: list[int] = []
    for node in tree.nodes():
        if node.parent is None:
            continue
        keys, n = [], node
        while n.parent is not None:
            keys.append(n.key)
            n = n.parent
        path = np.concatenate(keys[::-1])
        first, last = (len(path) - len(node.key)) // block, len(path) // block
        out += hasher.chain(NONE_HASH, path[: last * block])[first:].tolist()
    return sorted(out)


@pytest.mark.parametrize("policy,page", [("paged", 16), ("paged", 1), ("vllm", 16)])
def test_kv_events_rebuild_the_replicas_caches(policy: str, page: int) -> None:
    import simpy

    from simulator.fleet.fleet import Fleet

    w = mixed()
    cfg = config(policy=policy, page_size=page, kv_tokens=900)
    env = simpy.Environment()
    fleet = Fleet(env, w, cfg, 2, "llm-d-precise", parse_settings("llm-d-precise", None), 0.0)
    fleet.start()
    env.run()
    index = fleet.kv_index
    assert index is not None
    index.advance(env.now)
    for i, p in enumerate(fleet.parts):
        held = sorted(h for h, r, c in index.entries() if r == i for _ in range(c))
        if policy == "vllm":
            pool = p.policy.pool
            want = sorted(int(x) for x in pool.block_hash[pool.is_hashed])
        else:
            want = _radix_blocks(p.policy.tree, fleet.pool.event_block)
        assert held == want
        assert held, "nothing cached: the check compared nothing"


def test_dynamo_without_events_remembers_its_decisions_for_a_ttl() -> None:
    r = make("dynamo", n=2, args="kv-events=false,ttl-s=10")
    prompt = np.arange(40, dtype=np.int64)
    first = r.choose(req(0, prompt), View([0, 0], now=0.0)).replica
    r.finished(first, 0)
    d = r.choose(req(1, prompt), View([0, 0], now=5.0))
    assert (d.replica, d.how) == (first, MATCH)
    r.finished(first, 1)
    d = r.choose(req(2, prompt), View([0, 0], now=20.0))  # both entries expired at 15
    assert d.how == LOAD
