"""`HashRing`: a consistent-hash ring of replicas, with KubeAI's bounded-load walk.

Each replica is `points` points on a 64-bit ring (the hash of "replica-index:point"); a key
goes to the first point at or after its hash, wrapping around. Consistent hashing with
bounded loads (CHWBL; substratusai/kubeai `internal/loadbalancer/balance_chwbl.go` at
08e69e54) walks on from there and takes the first replica whose load passes `load_ok`:

    total == 0  or  load + 1 <= (total + 1) / n * load_factor

(`chwblLoadOK`: the in-flight requests of that replica, of all replicas, the number of
replicas); when none passes, the first replica met. Hashes are BLAKE2b (8 bytes) instead of
upstream's xxhash: only the ring's spread matters to a simulation, and the standard library
has it.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable

import numpy as np

from kvcore.contract.validation import InvariantError

__all__ = ["HashRing", "hash64", "load_ok"]


def hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def load_ok(load: int, total: int, n: int, load_factor: float) -> bool:
    """KubeAI's `chwblLoadOK`."""
    if total == 0:
        return True
    return load + 1 <= (total + 1) / n * load_factor


class HashRing:
    def __init__(self, replicas: int, points: int) -> None:
        if replicas < 1 or points < 1:
            raise ValueError(f"a hash ring needs replicas and points >= 1, got {replicas}, "
                             f"{points}")
        ring = sorted((hash64(f"{r}:{p}".encode()), r)
                      for r in range(replicas) for p in range(points))
        self.hashes = [h for h, _ in ring]
        self.owners = [r for _, r in ring]
        self.replicas = replicas

    def _start(self, key: int) -> int:
        i = bisect.bisect_left(self.hashes, key)
        return 0 if i == len(self.hashes) else i

    def lookup(self, key: int) -> int:
        """The replica owning `key` (no load bound)."""
        return self.owners[self._start(key)]

    def bounded(self, key: int, accept: Callable[[int], bool]) -> tuple[int, bool]:
        """The first replica from `key`'s point on that `accept`s, and True; or the owner of
        `key`'s point and False when none does (KubeAI's default endpoint)."""
        i = self._start(key)
        first = self.owners[i]
        seen: set[int] = set()
        for step in range(len(self.owners)):
            r = self.owners[(i + step) % len(self.owners)]
            if r in seen:
                continue  # a replica's other point: the same answer as before
            if accept(r):
                return r, True
            seen.add(r)
            if len(seen) == self.replicas:
                break
        return first, False

    @staticmethod
    def key_of(tokens: np.ndarray) -> int:
        return hash64(np.ascontiguousarray(tokens, dtype=np.int64).tobytes())

    def check_invariants(self) -> None:
        if self.hashes != sorted(self.hashes) or set(self.owners) != set(range(self.replicas)):
            raise InvariantError("hash ring: points unsorted or a replica missing")
