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
from itertools import takewhile

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
        # Per replica, not per hash: an event is one replica's, applied with a few C-level
        # set calls, and a score is each replica's leading run, found by a C-level
        # `takewhile` that stops at the replica's first missing block. A hash one block
        # holds is in `held`; `extra` counts the further blocks holding it (vLLM's
        # duplicates: none in a radix tree), so the common case is a set's.
        self.held: list[set[int]] = [set() for _ in range(replicas)]
        self.extra: list[dict[int, int]] = [{} for _ in range(replicas)]
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
        """Stored: one more holder of each hash (a hash listed twice: two more). Removed: one
        holder less of each hash the replica holds, the others ignored."""
        held, extra = self.held[replica], self.extra[replica]
        self.events += 1
        before = len(held)
        if stored:
            if held.isdisjoint(hashes):  # all new: each the one block holding it
                held.update(hashes)
                self.blocks[replica] += len(hashes)
                if len(held) - before < len(hashes):  # listed twice: count the repeats
                    for h, c in Counter(hashes).items():
                        if c > 1:
                            extra[h] = c - 1
                return
            for h in hashes:
                if h in held:
                    extra[h] = extra.get(h, 0) + 1
                else:
                    held.add(h)
            self.blocks[replica] += len(hashes)
            return
        if not extra or extra.keys().isdisjoint(hashes):  # each held by one block at most
            held.difference_update(hashes)  # a repeat finds its hash gone, as it should
            self.blocks[replica] -= before - len(held)
            return
        n = 0
        for h in hashes:
            more = extra.get(h)
            if more is not None:
                if more == 1:
                    del extra[h]
                else:
                    extra[h] = more - 1
            elif h in held:
                held.remove(h)
            else:
                continue
            n += 1
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
            extra = self.extra[r]
            for h in held:
                yield h, r, 1 + extra.get(h, 0)

    def pending(self) -> int:
        return len(self._pending)

    def check_invariants(self) -> None:
        for r, (held, extra) in enumerate(zip(self.held, self.extra, strict=True)):
            if any(c <= 0 or h not in held for h, c in extra.items()):
                raise InvariantError(f"KV event index: replica {r} counts extra holders of "
                                     "a hash it does not hold, or none")
        counts = [len(held) + sum(extra.values())
                  for held, extra in zip(self.held, self.extra, strict=True)]
        if counts != self.blocks:
            raise InvariantError(f"KV event index: block counts {self.blocks} != {counts}")
