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

from collections import Counter, OrderedDict
from collections.abc import Iterable

from kvcore.contract.validation import InvariantError

__all__ = ["LRUIndex"]


class LRUIndex:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"LRU capacity per server must be >= 1, got {capacity}")
        self.capacity = capacity
        self.lru: dict[int, OrderedDict[int, None]] = {}  # server -> hashes, oldest first
        # hash -> the servers holding it, as a bit mask (bit s: server s), never 0
        self.servers: dict[int, int] = {}

    def add(self, hashes: Iterable[int], server: int) -> None:
        """Every hash to the front of `server`'s LRU in order, then the oldest entries past
        the capacity evicted: an LRU holds its most recently added `capacity` hashes, so
        evicting after the whole request leaves what evicting one hash at a time would."""
        lru = self.lru.setdefault(server, OrderedDict())
        servers = self.servers
        bit = 1 << server
        # each hash at its last occurrence (a repeated one moves again)
        hashes = list(dict.fromkeys(reversed(list(hashes))))[::-1]
        for h in lru.keys() & hashes:  # already held: moved to the front below
            del lru[h]
        lru.update(dict.fromkeys(hashes))
        for h in hashes:
            servers[h] = servers.get(h, 0) | bit
        while len(lru) > self.capacity:
            old, _ = lru.popitem(last=False)
            held = servers[old] & ~bit
            if held:
                servers[old] = held
            else:
                del servers[old]

    def get(self, h: int) -> set[int]:
        """The servers holding `h`."""
        mask = self.servers.get(h, 0)
        return {s for s in range(mask.bit_length()) if mask >> s & 1}

    def match(self, hashes: Iterable[int]) -> dict[int, int]:
        """server -> matched blocks (upstream's greedy walk)."""
        masks: Counter[int] = Counter()
        servers = self.servers
        for h in hashes:
            held = servers.get(h)
            if not held:
                break
            masks[held] += 1
        out: dict[int, int] = {}
        for mask, n in masks.items():
            s = 0
            while mask:
                if mask & 1:
                    out[s] = out.get(s, 0) + n
                mask >>= 1
                s += 1
        return out

    def check_invariants(self) -> None:
        """Each LRU within capacity; the map holds exactly the (hash, server) pairs of the
        LRUs, and no empty mask."""
        pairs = {(h, s) for s, lru in self.lru.items() for h in lru}
        for s, lru in self.lru.items():
            if len(lru) > self.capacity:
                raise InvariantError(f"LRU index: server {s} holds {len(lru)} > "
                                     f"{self.capacity}")
        mapped = set()
        for h, mask in self.servers.items():
            if not mask:
                raise InvariantError(f"LRU index: hash {h} maps to no server")
            mapped |= {(h, s) for s in self.get(h)}
        if mapped != pairs:
            raise InvariantError("LRU index: the hash map and the LRUs disagree")
