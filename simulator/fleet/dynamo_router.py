"""`dynamo`: NVIDIA Dynamo's KV router, lowest cost wins.

ai-dynamo/dynamo `lib/kv-router/src/scheduling/selector/default.rs` at 07a6c9ce (the worker
logit and its picker) with the defaults of `lib/kv-router/src/scheduling/config.rs` at
0243c51b (overlap_score_credit 1, prefill_load_scale 1, router_temperature 0, KV events on,
router_ttl_secs 120 for the approximate mode); the same rule as the router pages of the
docs (router-concepts.md). Per worker, in blocks of the replica's block size:

    adjusted_prefill = max(active_prefill + prompt_blocks - credit * overlap, 0)
    cost             = prefill_load_scale * adjusted_prefill + decode_blocks

* `overlap`: the leading blocks of the prompt the worker holds: from its KV events after
  their delay (simulator/fleet/kv_index.py), or with `kv_events=false` from this router's own
  decisions, each block forgotten `ttl_s` after it was last routed (`--no-kv-events`: "predicts
  cache state from routing decisions with TTL-based expiration");
* `active_prefill`: the prompt tokens still to prefill, less their overlap then, of the
  requests sent to the worker whose first token has not come back, in blocks;
* `prompt_blocks`: the request's prompt tokens / block size;
* `decode_blocks`: the distinct prompt blocks of the requests active on the worker with this
  request added (its blocks shared with them counted once).

Temperature 0 takes the lowest cost, ties broken uniformly at random; above 0 a softmax over
the costs normalised to [0, 1] and divided by the temperature (`softmax_sample_index`).
Device blocks only: the host / disk credits (0.75, 0.25) need lower-tier events, which the
replicas do not publish here.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from kvcore.vllm.block_hash import ChainHasher
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

__all__ = ["DynamoRouter", "DynamoSettings", "shared_blocks", "softmax_pick"]

#: approximate mode: decisions between two sweeps of the expired routed blocks
PRUNE_EVERY = 1024


@dataclass(frozen=True)
class DynamoSettings:
    overlap_score_credit: float = setting(1.0, "credit per cached block against the prefill "
                                          "load (0..1)")
    prefill_load_scale: float = setting(1.0, "weight of the prefill load after the credit")
    router_temperature: float = setting(0.0, "0: lowest cost; above: softmax sampling")
    kv_events: bool = setting(True, "overlap from the replicas' KV events (false: from this "
                              "router's decisions with a TTL)")
    ttl_s: float = setting(120.0, "approximate mode: seconds a routed block counts as cached")

    def check(self, where: str) -> None:
        if not 0 <= self.overlap_score_credit <= 1:
            raise ValueError(f"{where}: overlap-score-credit must be in [0, 1]")
        if self.prefill_load_scale < 0 or self.router_temperature < 0 or self.ttl_s <= 0:
            raise ValueError(f"{where}: prefill-load-scale and router-temperature must be "
                             ">= 0, ttl-s > 0")


def softmax_pick(costs: list[float], temperature: float, sample: float) -> int:
    """Dynamo's `softmax_sample_index`: costs normalised by their range, lower cost more
    likely; `sample` in [0, 1)."""
    lo, hi = min(costs), max(costs)
    if lo == hi:
        probs = [1.0 / len(costs)] * len(costs)
    else:
        scale = -1.0 / ((hi - lo) * temperature)
        top = lo * scale
        probs = [math.exp(c * scale - top) for c in costs]
        total = sum(probs)
        probs = [p / total for p in probs]
    cum = 0.0
    for i, p in enumerate(probs):
        cum += p
        if sample <= cum:
            return i
    return len(costs) - 1


def shared_blocks(hashes: list[int], blocks: dict[int, int]) -> int:
    """How many of a request's chained block hashes `blocks` holds. The active blocks are
    whole chains from block 0 (each request adds all of its own), and a chained hash names
    its whole prefix, so those held are a leading run: found by bisection."""
    lo, hi = 0, len(hashes)  # hashes[:lo] held; hashes[hi] (if any) not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[mid - 1] in blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Active:
    """The requests a worker is serving, as the router tracks them."""

    __slots__ = ("blocks", "prefill", "reqs")

    def __init__(self) -> None:
        # prompt block hash -> active requests holding it (no zero counts)
        self.blocks: Counter[int] = Counter()
        self.prefill: dict[int, float] = {}  # rid -> prefill blocks still to compute
        self.reqs: dict[int, list[int]] = {}  # rid -> its prompt block hashes


@ROUTERS.register("dynamo", "NVIDIA Dynamo's KV router: lowest prefill + decode block cost "
                  "after a credit for cached blocks (KV events)")
class DynamoRouter(Router):
    Settings = DynamoSettings
    prefix_aware = True

    @classmethod
    def reads_kv_events(cls, settings: DynamoSettings) -> bool:
        return settings.kv_events

    def __init__(self, replicas: int, settings: DynamoSettings, rng: np.random.Generator,
                 pool: PoolReport) -> None:
        super().__init__(replicas, settings, rng, pool)
        self.block = pool.event_block
        self.hasher = ChainHasher(self.block, pool.max_len)
        self.active = [_Active() for _ in range(replicas)]
        # approximate mode: worker -> block hash -> when it stops counting as cached
        self.routed: list[dict[int, float]] = [{} for _ in range(replicas)]
        self.decisions = 0

    def _overlaps(self, hashes: list[int], view: FleetView) -> list[int]:
        if self.settings.kv_events:
            assert view.kv_index is not None
            got = view.kv_index.longest_prefix(hashes)
            return [got.get(i, 0) for i in range(self.replicas)]
        out = []
        for routed in self.routed:
            n = 0
            for h in hashes:
                if routed.get(h, -math.inf) <= view.now:
                    break
                n += 1
            out.append(n)
        return out

    def _settle(self, view: FleetView) -> None:
        """Prefills whose first token came back no longer count as prefill load."""
        for act in self.active:
            done = [rid for rid in act.prefill if view.prefill_done(rid)]
            for rid in done:
                del act.prefill[rid]

    def choose(self, req: RoutedRequest, view: FleetView) -> Decision:
        s = self.settings
        self._settle(view)
        hashes = req.block_hashes(self.hasher)
        overlaps = self._overlaps(hashes, view)
        prompt_blocks = len(req.prompt) / self.block
        costs = []
        for i, act in enumerate(self.active):
            active_prefill = sum(act.prefill.values())
            adjusted = max(active_prefill + prompt_blocks
                           - s.overlap_score_credit * overlaps[i], 0.0)
            # the worker's active blocks with this request's added, shared ones once
            decode = len(act.blocks) + len(hashes) - shared_blocks(hashes, act.blocks)
            costs.append(s.prefill_load_scale * adjusted + decode)
        if s.router_temperature > 0:
            i = softmax_pick(costs, s.router_temperature, float(self.rng.random()))
        else:
            best = min(costs)
            ties = [j for j, c in enumerate(costs) if c == best]
            i = ties[int(self.rng.integers(len(ties)))] if len(ties) > 1 else ties[0]
        act = self.active[i]
        act.reqs[req.rid] = hashes
        act.blocks.update(hashes)
        act.prefill[req.rid] = max(prompt_blocks - overlaps[i], 0.0)
        if not s.kv_events:
            until = view.now + s.ttl_s
            routed = self.routed[i]
            for h in hashes:
                routed[h] = until
            self.decisions += 1
            if self.decisions % PRUNE_EVERY == 0:  # forget expired blocks (upstream prunes)
                for r in self.routed:
                    for h in [h for h, t in r.items() if t <= view.now]:
                        del r[h]
        top = max(overlaps)
        return Decision(i, MATCH if top > 0 and overlaps[i] == top else LOAD)

    def finished(self, replica: int, rid: int) -> None:
        super().finished(replica, rid)
        act = self.active[replica]
        act.prefill.pop(rid, None)
        blocks = act.blocks
        # one holder less of each (a hash listed twice: two less); `pop` is dict's own,
        # where Counter's `del` runs Python code
        for h in act.reqs.pop(rid, []):
            c = blocks[h]
            if c == 1:
                blocks.pop(h)
            else:
                blocks[h] = c - 1
