"""The routers that look at no cache: random, round robin, least load, session affinity and
consistent hashing with bounded loads.

* `random`: a uniform pick (sgl-project/sglang `sgl-model-gateway/src/policies/random.rs`;
  llm-d's `random-picker`).
* `round-robin`: the next replica in turn (vllm-project/production-stack
  `src/vllm_router/routers/routing_logic.py` at 008a23bd, `RoundRobinRouter`; SGLang's
  `round_robin.rs`).
* `least-load`: vLLM's data-parallel load balancer (vllm `vllm/v1/engine/core_client.py`,
  `DPLBAsyncMPClient.get_core_engine_for_request`): the smallest `4 * waiting + running`, the
  first such replica on a tie. vLLM reads the counts its coordinator publishes every 100 ms
  and adds its own sends in between; here they are the replicas' counts when it decides.
* `session`: production-stack's `SessionRouter` (same file): a request with a session id goes
  where a consistent-hash ring puts that id (upstream: uhashring; here `HashRing`, 160 points
  per replica); one without goes to the replica this router sent the fewest requests in the
  last `qps_window_s` seconds (its `_qps_routing`: the first replica with no request yet, else
  the lowest rate).
* `chwbl`: KubeAI's `PrefixHash` strategy (substratusai/kubeai
  `internal/loadbalancer/balance_chwbl.go` at 08e69e54; defaults from `api/k8s/v1/
  model_types.go`: replication 256, meanLoadFactor 125 %, prefixCharLength 100): the ring
  key is the prompt's first 100 characters, here its first 25 tokens (4 characters a token,
  the ratio llm-d's scorer assumes); loads are this router's requests in flight.
"""

from __future__ import annotations

from collections import deque

from simulator.fleet.hash_ring import HashRing, load_ok
from simulator.fleet.router import (
    LOAD,
    MATCH,
    ROUTERS,
    Decision,
    FleetView,
    PoolReport,
    RoutedRequest,
    Router,
    setting,
)

__all__ = ["CHWBLRouter", "LeastLoadRouter", "RandomRouter", "RoundRobinRouter",
           "SessionRouter"]

from dataclasses import dataclass

import numpy as np


@ROUTERS.register("random", "a uniform pick: the baseline every cache-aware router is "
                  "measured against")
class RandomRouter(Router):
    decides_ahead = True

    def choose(self, req: RoutedRequest, view: FleetView) -> Decision:
        return Decision(int(self.rng.integers(self.replicas)))


@ROUTERS.register("round-robin", "each replica in turn (production-stack's and SGLang's "
                  "round_robin; Dynamo's default)")
class RoundRobinRouter(Router):
    decides_ahead = True

    def __init__(self, replicas: int, settings, rng: np.random.Generator,
                 pool: PoolReport) -> None:
        super().__init__(replicas, settings, rng, pool)
        self.next = 0

    def choose(self, req: RoutedRequest, view: FleetView) -> Decision:
        i = self.next
        self.next = (i + 1) % self.replicas
        return Decision(i)


@ROUTERS.register("least-load", "vLLM's data-parallel balancer: fewest 4 x waiting + running "
                  "(no cache awareness)")
class LeastLoadRouter(Router):
    def choose(self, req: RoutedRequest, view: FleetView) -> Decision:
        best, best_score = 0, None
        for i in range(self.replicas):
            score = 4 * view.waiting(i) + view.running(i)
            if best_score is None or score < best_score:
                best, best_score = i, score
        return Decision(best)


@dataclass(frozen=True)
class SessionSettings:
    qps_window_s: float = setting(60.0, "requests without a session id go to the replica "
                                  "with the lowest rate of this router's sends over this "
                                  "window (s)")
    ring_points: int = setting(160, "points per replica on the session hash ring")

    def check(self, where: str) -> None:
        if not self.qps_window_s > 0 or self.ring_points < 1:
            raise ValueError(f"{where}: qps-window-s must be > 0 and ring-points >= 1")


@ROUTERS.register("session", "sticky by session id (production-stack's session router): "
                  "every turn of a conversation on one replica")
class SessionRouter(Router):
    Settings = SessionSettings
    decides_ahead = True

    def __init__(self, replicas: int, settings: SessionSettings, rng: np.random.Generator,
                 pool: PoolReport) -> None:
        super().__init__(replicas, settings, rng, pool)
        self.ring = HashRing(replicas, settings.ring_points)
        self.sends: list[deque[float]] = [deque() for _ in range(replicas)]
        self.ever = [False] * replicas

    def choose(self, req: RoutedRequest, view: FleetView) -> Decision:
        now = view.now
        if req.session_id is not None:
            i = self.ring.lookup(HashRing.key_of(np.array([req.session_id])))
        else:
            i = self._lowest_rate(now)
        self.sends[i].append(now)
        self.ever[i] = True
        return Decision(i)

    def _lowest_rate(self, now: float) -> int:
        horizon = now - self.settings.qps_window_s
        best, best_n = 0, None
        for i in range(self.replicas):
            if not self.ever[i]:
                return i
            sends = self.sends[i]
            while sends and sends[0] < horizon:
                sends.popleft()
            if best_n is None or len(sends) < best_n:
                best, best_n = i, len(sends)
        return best


@dataclass(frozen=True)
class CHWBLSettings:
    prefix_tokens: int = setting(25, "prompt tokens hashed for the ring key (KubeAI's 100 "
                                 "characters at 4 a token)")
    load_factor: float = setting(1.25, "a replica takes a request while its in-flight count "
                                 "+ 1 <= this x the mean (+1) (KubeAI's meanLoadFactor 125)")
    replication: int = setting(256, "points per replica on the ring")

    def check(self, where: str) -> None:
        if self.prefix_tokens < 1 or self.load_factor < 1 or self.replication < 1:
            raise ValueError(f"{where}: prefix-tokens >= 1, load-factor >= 1 and "
                             "replication >= 1")


@ROUTERS.register("chwbl", "consistent hashing with bounded loads on the prompt's start "
                  "(KubeAI's PrefixHash): affinity without a cache view")
class CHWBLRouter(Router):
    Settings = CHWBLSettings
    prefix_aware = True

    def __init__(self, replicas: int, settings: CHWBLSettings, rng: np.random.Generator,
                 pool: PoolReport) -> None:
        super().__init__(replicas, settings, rng, pool)
        self.ring = HashRing(replicas, settings.replication)

    def choose(self, req: RoutedRequest, view: FleetView) -> Decision:
        s = self.settings
        key = HashRing.key_of(req.prompt[: s.prefix_tokens])
        total = sum(self.in_flight)
        owner = self.ring.lookup(key)
        i, _ = self.ring.bounded(key, lambda r: load_ok(self.in_flight[r], total,
                                                         self.replicas, s.load_factor))
        return Decision(i, MATCH if i == owner else LOAD)
