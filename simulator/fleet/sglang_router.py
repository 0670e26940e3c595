"""`cache-aware`: SGLang's router (sgl-model-gateway) cache-aware policy.

sgl-project/sglang `sgl-model-gateway/src/policies/cache_aware.rs` at 053b63ff, defaults of
its command line (`sgl-model-gateway/src/main.rs` at 01f6c92a: `--cache-threshold 0.3
--balance-abs-threshold 64 --balance-rel-threshold 1.5 --eviction-interval 120
--max-tree-size 67108864`). For each request:

1. the load of a worker is this router's requests in flight to it; the fleet is imbalanced
   when `max - min > balance_abs_threshold` and `max > balance_rel_threshold * min`: then
   the least-loaded worker (the first on a tie) takes it, and the tree still records it;
2. otherwise the approximate tree (simulator/fleet/approx_tree.py) gives the longest match
   of the prompt and its worker; above `cache_threshold` (matched / prompt tokens) that
   worker takes it;
3. otherwise the least-loaded worker does (the version followed; its v0.4 ancestor sent it to
   the worker with the smallest tree, the "death spiral" sglang PR #14305 replaced).

Every `eviction_interval_s` of simulated time (a background thread upstream) the tree evicts
each worker's least recently used leaves down to `max_tree_size` tokens (upstream counts
characters in HTTP mode, tokens in gRPC mode; the tree here holds tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.fleet.approx_tree import ApproxTree
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

__all__ = ["CacheAwareRouter", "CacheAwareSettings"]


@dataclass(frozen=True)
class CacheAwareSettings:
    cache_threshold: float = setting(0.3, "the best match must cover more than this share "
                                     "of the prompt to decide")
    balance_abs_threshold: int = setting(64, "imbalanced when max - min in-flight exceeds "
                                         "this ...")
    balance_rel_threshold: float = setting(1.5, "... and max exceeds this x min")
    eviction_interval_s: float = setting(120.0, "seconds between evictions of the router's "
                                         "tree (0: never)")
    max_tree_size: int = setting(67108864, "tokens per worker the tree keeps after an "
                                 "eviction")

    def check(self, where: str) -> None:
        if not 0 <= self.cache_threshold <= 1:
            raise ValueError(f"{where}: cache-threshold must be in [0, 1]")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 0:
            raise ValueError(f"{where}: the balance thresholds must be >= 0")
        if self.eviction_interval_s < 0 or self.max_tree_size < 0:
            raise ValueError(f"{where}: eviction-interval-s and max-tree-size must be >= 0")


@ROUTERS.register("cache-aware", "SGLang's router: an approximate tree of what it sent "
                  "where, prefix match above 30 % unless the loads are imbalanced")
class CacheAwareRouter(Router):
    Settings = CacheAwareSettings
    prefix_aware = True

    def __init__(self, replicas: int, settings: CacheAwareSettings,
                 rng: np.random.Generator, pool: PoolReport) -> None:
        super().__init__(replicas, settings, rng, pool)
        self.tree = ApproxTree()
        for i in range(replicas):
            self.tree.add_tenant(i)
        interval = settings.eviction_interval_s
        self.next_eviction = interval if interval > 0 else float("inf")

    def _least_loaded(self) -> int:
        loads = self.in_flight
        return loads.index(min(loads))

    def choose(self, req: RoutedRequest, view: FleetView) -> Decision:
        s = self.settings
        while view.now >= self.next_eviction:
            self.tree.evict_tenant_by_size(s.max_tree_size)
            self.next_eviction += s.eviction_interval_s
        lo, hi = min(self.in_flight), max(self.in_flight)
        if hi - lo > s.balance_abs_threshold and hi > s.balance_rel_threshold * lo:
            i, how = self._least_loaded(), LOAD
        else:
            prompt = req.prompt
            match = self.tree.prefix_match(prompt)
            rate = match.matched / len(prompt) if len(prompt) else 0.0
            if rate > s.cache_threshold and match.tenant is not None:
                i, how = match.tenant, MATCH
            else:
                i, how = self._least_loaded(), LOAD
        self.tree.insert(req.prompt, i)
        return Decision(i, how)

    def check_invariants(self) -> None:
        self.tree.check_invariants()
