"""`llm-d`: llm-d's endpoint picker, weighted scorers and a max-score picker, and the
configurations of llm-d's published capacity benchmark as presets.

Scorers (each in [0, 1] per replica), their weighted sum, then the replica with the highest
sum, ties broken at random (the `max-score-picker` shuffles, then sorts stably):

* `prefix`, the approximate prefix-cache scorer: matched / total blocks of the prompt in an
  LRU index of this router's own decisions (simulator/fleet/lru_index.py). With `autotune`
  (the default) the block size and each server's LRU capacity are the replica's block size
  and number of blocks (its `cache_config_info` metric), else `block_tokens` and
  `lru_capacity` (gateway-api-inference-extension 1748e829 `.../approximateprefix/
  {plugin,types}.go`).
* `precise`, the precise prefix-cache scorer: the replicas' real caches through their KV
  events (simulator/fleet/kv_index.py, after `--kv-event-delay-s`), the longest run of
  leading full blocks each holds, normalised as matched / total full blocks, clipped to 1
  (llm-d-inference-scheduler `pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache`
  at 520af478, since PR #1107 of 2026-05-14), or `normalization=minmax` as before that PR
  and in the September 2025 benchmarks: min-max over the replicas holding the first block
  (all equal: 1), 0 for the others.
* `kv`, `kv-cache-utilization-scorer`: 1 - the replica's KV-cache usage (vLLM's
  `kv_cache_usage`: blocks held by requests, evictable cache counted free).
* `queue`, `queue-scorer`: (max - waiting) / (max - min) over the replicas, 1 when all wait
  the same.

Weights: the endpoint picker's default profile (gateway-api-inference-extension 1748e829
`pkg/epp/config/loader/defaults.go`): queue 2, kv-cache-utilization 2, prefix 3. Presets, from
llm-d-kv-cache-manager `benchmarking/73-capacity/README.md` (d070ea6, 2025-09-21):

* `llm-d-precise`: precise 3, kv 2, queue 2, min-max normalisation;
* `llm-d-estimated` ("the default configuration in the IGW" then): prefix 1, kv 1, queue 1,
  64-character blocks (16 tokens), 256 blocks matched at most, 31,250 entries per server, no
  autotune;
* `llm-d-load`: queue 1, kv 1 (its `random` configuration is the `random` router).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.vllm.block_hash import ChainHasher
from simulator.fleet.lru_index import LRUIndex
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

__all__ = ["LlmdRouter", "LlmdSettings"]

NORMALIZATIONS = ("absolute", "minmax")


@dataclass(frozen=True)
class LlmdSettings:
    prefix: float = setting(3.0, "weight of the approximate prefix-cache scorer")
    precise: float = setting(0.0, "weight of the precise prefix-cache scorer (KV events)")
    kv: float = setting(2.0, "weight of the KV-cache utilization scorer")
    queue: float = setting(2.0, "weight of the queue scorer")
    autotune: bool = setting(True, "approximate scorer: block size and LRU capacity from the "
                             "replicas' block size and block count")
    block_tokens: int = setting(16, "approximate scorer: tokens per block without autotune")
    max_prefix_blocks: int = setting(256, "approximate scorer: blocks of the prompt matched "
                                     "at most")
    lru_capacity: int = setting(31250, "approximate scorer: entries per server without "
                                "autotune")
    normalization: str = setting("absolute", "precise scorer: absolute (matched / total) or "
                                 "minmax (before llm-d PR #1107)")

    def check(self, where: str) -> None:
        if min(self.prefix, self.precise, self.kv, self.queue) < 0:
            raise ValueError(f"{where}: scorer weights must be >= 0")
        if not (self.prefix or self.precise or self.kv or self.queue):
            raise ValueError(f"{where}: every scorer weight is 0")
        if min(self.block_tokens, self.max_prefix_blocks, self.lru_capacity) < 1:
            raise ValueError(f"{where}: block-tokens, max-prefix-blocks and lru-capacity "
                             "must be >= 1")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"{where}: normalization must be one of "
                             f"{', '.join(NORMALIZATIONS)}, got {self.normalization!r}")


@ROUTERS.register("llm-d", "llm-d's endpoint picker, default profile: approximate prefix 3, "
                  "KV usage 2, queue 2 (weights set with --router-args)")
class LlmdRouter(Router):
    Settings = LlmdSettings
    prefix_aware = True

    @classmethod
    def reads_kv_events(cls, settings: LlmdSettings) -> bool:
        return settings.precise > 0

    def __init__(self, replicas: int, settings: LlmdSettings, rng: np.random.Generator,
                 pool: PoolReport) -> None:
        super().__init__(replicas, settings, rng, pool)
        s = settings
        self.prefix_aware = bool(s.prefix or s.precise)  # llm-d-load has no prefix scorer
        block = pool.page_size if s.autotune else s.block_tokens
        self.index = LRUIndex(pool.blocks if s.autotune else s.lru_capacity) \
            if s.prefix else None
        self.approx_hasher = ChainHasher(block, pool.max_len)
        self.precise_hasher = ChainHasher(pool.event_block, pool.max_len) \
            if s.precise else None

    def _approx_scores(self, req: RoutedRequest) -> tuple[list[float], list[int]]:
        assert self.index is not None
        hashes = req.block_hashes(self.approx_hasher, self.settings.max_prefix_blocks,
                                  partial=True)
        total = len(hashes)
        matched = self.index.match(hashes)
        scores = [matched.get(i, 0) / total if total else 0.0 for i in range(self.replicas)]
        return scores, hashes

    def _precise_scores(self, req: RoutedRequest, view: FleetView) -> list[float]:
        assert self.precise_hasher is not None and view.kv_index is not None
        hashes = req.block_hashes(self.precise_hasher)
        raw = view.kv_index.longest_prefix(hashes)
        n = self.replicas
        if self.settings.normalization == "minmax":
            if not raw:
                return [0.0] * n
            lo, hi = min(raw.values()), max(raw.values())
            return [(1.0 if lo == hi else (raw[i] - lo) / (hi - lo)) if i in raw else 0.0
                    for i in range(n)]
        total = len(hashes)
        return [min(raw.get(i, 0) / total, 1.0) if total else 0.0 for i in range(n)]

    def choose(self, req: RoutedRequest, view: FleetView) -> Decision:
        s, n = self.settings, self.replicas
        total = [0.0] * n
        prefix: list[float] | None = None
        hashes: list[int] = []
        if s.prefix:
            prefix, hashes = self._approx_scores(req)
            total = [t + s.prefix * p for t, p in zip(total, prefix, strict=True)]
        if s.precise:
            precise = self._precise_scores(req, view)
            total = [t + s.precise * p for t, p in zip(total, precise, strict=True)]
            if prefix is None or max(precise) > max(prefix):
                prefix = precise
        if s.kv:
            total = [t + s.kv * (1.0 - view.kv_usage(i)) for i, t in enumerate(total)]
        if s.queue:
            waiting = [view.waiting(i) for i in range(n)]
            lo, hi = min(waiting), max(waiting)
            total = [t + s.queue * (1.0 if hi == lo else (hi - w) / (hi - lo))
                     for t, w in zip(total, waiting, strict=True)]
        best = max(total)
        ties = [i for i, t in enumerate(total) if t == best]
        i = ties[int(self.rng.integers(len(ties)))] if len(ties) > 1 else ties[0]
        if self.index is not None:
            self.index.add(hashes, i)
        how = LOAD
        if prefix is not None and max(prefix) > 0 and prefix[i] == max(prefix):
            how = MATCH
        return Decision(i, how)

    def check_invariants(self) -> None:
        if self.index is not None:
            self.index.check_invariants()


@ROUTERS.register("llm-d-precise", "llm-d capacity benchmark's precise configuration: the "
                  "replicas' caches through KV events 3, KV usage 2, queue 2")
class LlmdPreciseRouter(LlmdRouter):
    @dataclass(frozen=True)
    class Settings(LlmdSettings):
        prefix: float = setting(0.0, "weight of the approximate prefix-cache scorer")
        precise: float = setting(3.0, "weight of the precise prefix-cache scorer (KV events)")
        normalization: str = setting("minmax", "precise scorer: absolute (matched / total) "
                                     "or minmax (before llm-d PR #1107)")


@ROUTERS.register("llm-d-estimated", "llm-d capacity benchmark's estimated configuration "
                  "(2025's default): approximate prefix 1, KV usage 1, queue 1")
class LlmdEstimatedRouter(LlmdRouter):
    @dataclass(frozen=True)
    class Settings(LlmdSettings):
        prefix: float = setting(1.0, "weight of the approximate prefix-cache scorer")
        kv: float = setting(1.0, "weight of the KV-cache utilization scorer")
        queue: float = setting(1.0, "weight of the queue scorer")
        autotune: bool = setting(False, "approximate scorer: block size and LRU capacity "
                                 "from the replicas' block size and block count")


@ROUTERS.register("llm-d-load", "llm-d capacity benchmark's load configuration: KV usage 1, "
                  "queue 1, no prefix scorer")
class LlmdLoadRouter(LlmdRouter):
    @dataclass(frozen=True)
    class Settings(LlmdSettings):
        prefix: float = setting(0.0, "weight of the approximate prefix-cache scorer")
        kv: float = setting(1.0, "weight of the KV-cache utilization scorer")
        queue: float = setting(1.0, "weight of the queue scorer")
