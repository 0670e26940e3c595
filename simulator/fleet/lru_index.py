"""`LRUIndex`: llm-d's approximate prefix index, an LRU of block hashes per server.

The approximate prefix-cache scorer of llm-d's endpoint picker (kubernetes-sigs/
gateway-api-inference-extension at 1748e829, 2026-06-16, `pkg/epp/framework/plugins/
requestcontrol/dataproducer/approximateprefix/{indexer,plugin,hashing,types}.go`) never
sees the servers' caches: after each decision it records the request's block hashes under the
server it picked, and scores a later request by how many of its leading blocks each server
was sent. Rules followed:

* the prompt is cut into blocks of `block_size` tokens (the version followed counts tokens;
  the September 2025 version counted 64 characters, about 16 tokens at its 4 characters per
  token), at most `max_blocks` of them, and a trailing partial block is hashed too; each hash
  chains the previous one (`hashPrompt`);
* `add(hashes, server)`: every hash goes to the front of the server's LRU (capacity
  `capacity` entries, the oldest evicted) and into the hash -> servers map; an entry evicted
  from a server's LRU leaves that map (`makeEvictionFn`);
* `match(hashes)`: walking the hashes in order, every server holding hash i gains one, and
  the walk stops at the first hash no server holds (`matchLongestPrefix`: a server may gain
  for block i without holding block i - 1, as upstream's greedy walk allows).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvcore.validation import InvariantError

__all__ = ["LRUIndex"]


class LRUIndex:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"LRU capacity per server must be >= 1, got {capacity}")
        self.capacity = capacity
        self.lru: dict[int, OrderedDict[int, None]] = {}  # server -> hashes, oldest first
        self.servers: dict[int, set[int]] = {}  # hash -> servers holding it

    def add(self, hashes: Iterable[int], server: int) -> None:
        lru = self.lru.setdefault(server, OrderedDict())
        servers = self.servers
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                if len(lru) > self.capacity:
                    old, _ = lru.popitem(last=False)
                    held = servers[old]
                    held.discard(server)
                    if not held:
                        del servers[old]
            servers.setdefault(h, set()).add(server)

    def get(self, h: int) -> set[int]:
        return self.servers.get(h, set())

    def match(self, hashes: Iterable[int]) -> dict[int, int]:
        """server -> matched blocks (upstream's greedy walk)."""
        out: dict[int, int] = {}
        servers = self.servers
        for h in hashes:
            held = servers.get(h)
            if not held:
                break
            for s in held:
                out[s] = out.get(s, 0) + 1
        return out

    def check_invariants(self) -> None:
        """Each LRU within capacity; the map holds exactly the (hash, server) pairs of the
        LRUs, and no empty set."""
        pairs = {(h, s) for s, lru in self.lru.items() for h in lru}
        for s, lru in self.lru.items():
            if len(lru) > self.capacity:
                raise InvariantError(f"LRU index: server {s} holds {len(lru)} > "
                                     f"{self.capacity}")
        mapped = set()
        for h, held in self.servers.items():
            if not held:
                raise InvariantError(f"LRU index: hash {h} maps to no server")
            mapped |= {(h, s) for s in held}
        if mapped != pairs:
            raise InvariantError("LRU index: the hash map and the LRUs disagree")
