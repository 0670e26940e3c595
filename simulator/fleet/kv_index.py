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

from collections import Counter, deque
from collections.abc import Iterator, Sequence
from itertools import repeat, takewhile

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
        # per replica: hash -> blocks holding it (no zero counts). One map per replica, not
        # one per hash: an event is one replica's, applied with a few C-level map calls
        # (`Counter.update`, `map(pop)`), and a score is each replica's leading run, found
        # by a C-level `takewhile` that stops at the replica's first missing block.
        self.held: list[Counter[int]] = [Counter() for _ in range(replicas)]
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

    def _apply(self, replica: int, stored: bool, hashes: list[int]) -> None:
        held = self.held[replica]
        self.events += 1
        if stored:
            held.update(hashes)  # one more holder of each (a hash listed twice: two more)
            self.blocks[replica] += len(hashes)
            return
        # a removal takes one holder of each hash the replica holds; the others are ignored.
        # Fast path: pop them all, then put back each count above one less one; that is the
        # rule when every hash was held (a popped 0: one was not, or one is listed twice)
        popped = list(map(held.pop, hashes, repeat(0)))
        if 0 not in popped:
            for h, c in zip(hashes, popped, strict=True):
                if c > 1:
                    held[h] = c - 1
            self.blocks[replica] -= len(hashes)
            return
        for h, c in zip(hashes, popped, strict=True):  # undo, then one hash at a time
            if c:
                held[h] = c
        n = 0
        for h in hashes:
            c = held.get(h, 0)
            if c == 1:
                del held[h]
            elif c:
                held[h] = c - 1
            n += c > 0
        self.blocks[replica] -= n

    def longest_prefix(self, hashes: Sequence[int]) -> dict[int, int]:
        """replica -> consecutive blocks of `hashes` it holds from the first (replicas
        holding none are left out)."""
        if not hashes:
            return {}
        first = hashes[0]
        scores: dict[int, int] = {}
        for r, held in enumerate(self.held):
            if first in held:
                scores[r] = len(list(takewhile(held.__contains__, hashes)))
        return scores

    def entries(self) -> Iterator[tuple[int, int, int]]:
        """(hash, replica, blocks holding it) of everything the index holds."""
        for r, held in enumerate(self.held):
            for h, c in held.items():
                yield h, r, c

    def pending(self) -> int:
        return len(self._pending)

    def check_invariants(self) -> None:
        for r, held in enumerate(self.held):
            if any(c <= 0 for c in held.values()):
                raise InvariantError(f"KV event index: replica {r} has a non-positive holder "
                                     "count")
        counts = [sum(held.values()) for held in self.held]
        if counts != self.blocks:
            raise InvariantError(f"KV event index: block counts {self.blocks} != {counts}")
