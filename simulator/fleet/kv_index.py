"""`KVEventIndex`: what a router knows of the replicas' real caches, from their KV events.

Engines publish an event when blocks enter their prefix cache (vLLM's `BlockStored`) and when
they leave it (`BlockRemoved`); a precise router (llm-d's precise prefix-cache scorer through
llm-d-kv-cache-manager's `kvevents.Pool`, Dynamo's KV router through its indexer) keeps an
index block hash -> replicas from them and scores a request by the blocks each replica holds.
Here every event is stamped with the simulated time it happened and reaches the index
`delay` seconds later (`advance`): a router never reads a replica's cache directly, only
what the events told it by then.

The index counts holders per (hash, replica): vLLM may cache the same content in two blocks
(duplicates are allowed), and one of them leaving does not take the content away. The
longest-prefix score is llm-d-kv-cache-manager's `LongestPrefixScorer`
(`pkg/kvcache/kvblock_scorer.go` at a378f5b, 2025-12-10): per replica, the run of consecutive
request blocks it holds from block 0 (the device tier only: every block here is on the GPU,
weight 1).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np

from kvcore.contract.validation import InvariantError

__all__ = ["KVEventIndex"]


class KVEventIndex:
    def __init__(self, replicas: int, delay: float) -> None:
        if delay < 0:
            raise ValueError(f"--kv-event-delay-s must be >= 0, got {delay}")
        self.delay = delay
        self.replicas = replicas
        self._pending: deque[tuple[float, int, bool, np.ndarray]] = deque()
        self.holders: dict[int, dict[int, int]] = {}  # hash -> replica -> blocks holding it
        self.blocks = [0] * replicas  # blocks each replica holds, as the index knows it
        self.events = 0  # events applied

    def emit(self, time: float, replica: int, stored: bool, hashes: np.ndarray) -> None:
        """An event of `replica` at `time` (blocks `hashes` stored, or removed)."""
        if len(hashes):
            self._pending.append((time, replica, stored, hashes))

    def advance(self, now: float) -> None:
        """Apply, in order, the events that have reached the router by `now`."""
        pending, delay = self._pending, self.delay
        while pending and pending[0][0] + delay <= now:
            _, replica, stored, hashes = pending.popleft()
            self._apply(replica, stored, hashes.tolist())

    def _apply(self, replica: int, stored: bool, hashes: Iterable[int]) -> None:
        holders = self.holders
        n = 0
        for h in hashes:
            per = holders.get(h)
            if stored:
                if per is None:
                    holders[h] = {replica: 1}
                else:
                    per[replica] = per.get(replica, 0) + 1
                n += 1
            elif per is not None and replica in per:
                if per[replica] == 1:
                    del per[replica]
                    if not per:
                        del holders[h]
                else:
                    per[replica] -= 1
                n -= 1
        self.blocks[replica] += n
        self.events += 1

    def longest_prefix(self, hashes: Iterable[int]) -> dict[int, int]:
        """replica -> consecutive blocks of `hashes` it holds from the first (replicas
        holding none are left out)."""
        holders = self.holders
        it = iter(hashes)
        first = next(it, None)
        if first is None or first not in holders:
            return {}
        active = list(holders[first])
        scores: dict[int, int] = {}
        k = 1  # blocks every replica still in `active` holds
        for h in it:
            per = holders.get(h)
            if per is None:
                break
            if len(per) < len(active) or any(r not in per for r in active):
                for r in active:
                    if r not in per:
                        scores[r] = k
                active = [r for r in active if r in per]
                if not active:
                    break
            k += 1
        for r in active:
            scores[r] = k
        return scores

    def pending(self) -> int:
        return len(self._pending)

    def check_invariants(self) -> None:
        counts = [0] * self.replicas
        for h, per in self.holders.items():
            if not per or any(c <= 0 for c in per.values()):
                raise InvariantError(f"KV event index: hash {h} has an empty or non-positive "
                                     "holder count")
            for r, c in per.items():
                counts[r] += c
        if counts != self.blocks:
            raise InvariantError(f"KV event index: block counts {self.blocks} != {counts}")
