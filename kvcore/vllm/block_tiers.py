"""A lower KV tier of whole blocks keyed by vLLM's block hash chain (vLLM CPU offload / LMCache
style): the host (or storage) store behind the `vllm` manager's device `BlockPool`.

Why it is built this way:
* The tier is a pool of its own (`TierPool`): block ids and capacity of its own, ref counts,
  and vLLM's free queue (`FreeKVCacheBlockQueue`, kvcore/vllm/free_queue.py) as the LRU
  order (head = least recently used); a pop lazily evicts the head. Every block the tier
  writes is hashed at once, so an idle block is either never used (ahead of everything, taken
  first) or cached content.
* A tier holds each hash at most once, so its index is a plain map hash -> block (a dict fed
  and read through C-level `map`/`zip` over whole batches: no Python step per block). The
  device pool's index (kvcore/vllm/chain_index.py) is built for duplicates and lookups from a
  chain's root; a tier needs neither, but looks up from the middle of a chain (past the
  device's hit) and stores blocks of unrelated chains together (write_back, spills).
* A block is known by (hash, parent hash, token ids), the device pool's own key: a lookup
  continues the device's hit along the same chain (`lookup(hashes, ids, start)`), checking
  the parent and the tokens of every candidate, so a hash collision never yields a wrong block.
* `store` skips (and touches) what the tier has, so writing a request's whole chain costs only
  its missing blocks. Batches are given in LRU order (first = least recent): callers pass a
  chain reversed, so a chain's tail goes before its head, as vLLM frees a request's blocks
  reversed for the same reason.
* In flight = touched (ref count > 0): a load holds the blocks it reads until the request's
  prefill lands, and nothing touched is ever popped, so nothing in flight is evicted.
* Eviction spills to the next tier down (`lower`) through the pool's `on_evict` hook, in
  eviction order, before the hashes are dropped.

Invariants (`check_invariants`): the free queue's own; queued <=> ref count 0; in flight =>
hashed; the map holds exactly the hashed blocks, each under its own hash; every hashed
block's hash is the chained hash of its parent and tokens; used + free == capacity.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from typing import NamedTuple

import numpy as np

from kvcore.contract.tiers import tier_pages
from kvcore.contract.validation import InvariantError
from kvcore.vllm.block_hash import NONE_HASH
from kvcore.vllm.block_pool import HashedBlocks

_U64 = np.uint64
_NONE = np.zeros(0, dtype=np.int64)


class Stored(NamedTuple):
    """What `BlockTier.store` did: where each block given now is (0: not stored), and how many
    blocks it wrote (the rest were held already, or did not fit)."""

    where: np.ndarray
    written: int


class TierPool(HashedBlocks):
    """A lower tier's blocks 1..num_blocks: the shared pool (ref counts, the LRU free queue,
    each block's key; kvcore/vllm/block_pool.py) with a plain hash -> block map as its index."""

    def __init__(self, num_blocks: int, page_size: int) -> None:
        super().__init__(num_blocks, page_size)
        # per block: which store wrote it (0: none); unchanged = still the same content
        self.gen = np.zeros(num_blocks + 1, dtype=np.int64)
        self._last_gen = 0
        self.where: dict[int, int] = {}  # hash -> its block

    def heads(self, hashes: np.ndarray) -> np.ndarray:
        """The block of each hash, 0 where the tier does not hold it."""
        if not self.where or not len(hashes):
            return np.zeros(len(hashes), dtype=np.int64)
        return np.fromiter(map(self.where.get, hashes.tolist(), repeat(0)), dtype=np.int64,
                           count=len(hashes))

    def _unindex(self, evicted: np.ndarray) -> None:
        deque(map(self.where.pop, self.block_hash[evicted].tolist()), maxlen=0)
        self.gen[evicted] = 0

    def cache(self, blocks: np.ndarray, hashes: np.ndarray, parents: np.ndarray,
              tokens: np.ndarray) -> None:
        """Give fresh `blocks` their content: hashes (absent from the tier, distinct), parent
        hashes and token ids (k, page_size)."""
        self.is_hashed[blocks] = True
        self.block_hash[blocks] = hashes
        self.parent_hash[blocks] = parents
        self.block_tokens[blocks] = tokens
        self._last_gen += 1
        self.gen[blocks] = self._last_gen
        self.where.update(zip(hashes.tolist(), blocks.tolist(), strict=True))

    def check_invariants(self) -> None:
        hashed = self.check_blocks("tier")
        if ((self.ref_cnt > 0) & ~self.is_hashed).any():
            raise InvariantError("tier: a block in flight holds no content")
        if len(self.where) != len(hashed) or not np.array_equal(
                self.heads(self.block_hash[hashed]), hashed):
            raise InvariantError("tier: the hash map differs from the blocks' hashes")
        if not np.array_equal(np.flatnonzero(self.gen), hashed):
            raise InvariantError("tier: generations differ from the hashed blocks")


class BlockTier:
    """A host or storage store of hashed blocks, LRU; evicted blocks spill into `lower`."""

    def __init__(self, name: str, num_tokens: int, page_size: int,
                 lower: BlockTier | None = None) -> None:
        blocks = tier_pages(name, num_tokens, page_size, "block")
        self.name = name
        self.page_size = page_size
        self.pool = TierPool(blocks, page_size)
        self.lower = lower
        self.pages_in = 0  # blocks written into this tier (what the link into it carried)
        #: also write the blocks this tier writes into `lower` (a shared tier below the host:
        #: kvcore/tiers/shared.py); otherwise `lower` takes only what this tier evicts
        self.through = False
        if lower is not None:
            self.pool.on_evict = self._spill

    # -- sizes (slots) -----------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.pool.num_blocks * self.page_size

    @property
    def locked(self) -> int:
        """Slots of blocks held by loads in flight (every block out of the queue)."""
        return (self.pool.num_blocks - self.pool.get_num_free_blocks()) * self.page_size

    @property
    def cached(self) -> int:
        """Slots of idle blocks holding content (evictable, LRU)."""
        return self.pool.num_cached_free * self.page_size

    @property
    def used(self) -> int:
        return self.locked + self.cached

    @property
    def free(self) -> int:
        return self.capacity - self.used

    # -- lookups and holds -------------------------------------------------------------------
    def lookup(self, hashes: np.ndarray, ids: np.ndarray, start: int) -> np.ndarray:
        """This tier's blocks for the chain `hashes[start:]` (the full blocks of `ids`), up to
        the first miss; the first one's parent is `hashes[start - 1]`. A candidate whose
        parent or tokens differ (a hash collision) is a miss. Touches nothing."""
        n = len(hashes) - start
        if n <= 0 or not self.pool.where:
            return _NONE
        ps, pool = self.page_size, self.pool
        parts: list[np.ndarray] = []
        k, step = start, 64  # most lookups miss early: look in growing chunks
        while k < len(hashes):
            heads = pool.heads(hashes[k : k + step])
            miss = np.flatnonzero(heads == 0)
            parts.append(heads[: miss[0]] if len(miss) else heads)
            if len(miss):
                break
            k += step
            step *= 8
        cand = parts[0] if len(parts) == 1 else np.concatenate(parts)
        m = len(cand)
        if not m:
            return cand
        parents = np.empty(m, dtype=_U64)
        parents[0] = hashes[start - 1] if start else NONE_HASH
        parents[1:] = hashes[start : start + m - 1]
        tok = ids[start * ps : (start + m) * ps].reshape(m, ps)
        ok = (pool.block_tokens[cand] == tok).all(axis=1) & (pool.parent_hash[cand] == parents)
        return cand if ok.all() else cand[: int(np.argmin(ok))]

    def hold(self, blocks: np.ndarray) -> None:
        """A load reads `blocks`: they leave the LRU until `unhold`."""
        if len(blocks):
            self.pool.touch(blocks)

    def unhold(self, chain: np.ndarray) -> None:
        """A load of `chain` (head first) is done: its blocks become the most recent, the
        chain's head last (most recent of all), so its tail is evicted first."""
        if len(chain):
            self.pool.free_blocks(chain[::-1])

    # -- writing -----------------------------------------------------------------------------
    def store(self, hashes: np.ndarray, parents: np.ndarray, tokens: np.ndarray,
              known: np.ndarray | None = None, distinct: bool = False) -> Stored:
        """Write blocks given in LRU order (first = least recent; (k,) hashes and parents,
        (k, page_size) token ids): the ones held are touched, the missing ones take new
        blocks (evicting this tier's LRU blocks, spilled below), as many as fit, the most
        recent first. Every block ends idle at the queue tail in the given order (a block in
        flight stays held). Returns where each block now is (0: not stored) and how many
        blocks were written. `known` (one per block, 0 = unknown) are blocks of an earlier
        store of the same content whose generations the caller checked (`still_held`): no
        lookup for them. `distinct`: the caller knows no hash repeats (one chain)."""
        n = len(hashes)
        if not n:
            return Stored(np.zeros(0, dtype=np.int64), 0)
        hashes = np.ascontiguousarray(hashes, dtype=_U64)
        if not distinct and len(np.unique(hashes)) != n:  # the same content twice: keep the
            keep = np.sort(n - 1 - np.unique(hashes[::-1], return_index=True)[1])  # latest
            where, written = self.store(hashes[keep], parents[keep], tokens[keep],
                                        None if known is None else known[keep], True)
            out = np.zeros(n, dtype=np.int64)
            out[keep] = where
            return Stored(out, written)
        pool = self.pool
        heads = np.zeros(n, dtype=np.int64) if known is None else known.copy()
        ask = np.flatnonzero(heads == 0) if known is not None else np.arange(n)
        if len(ask) and pool.where:
            got = pool.heads(hashes[ask])
            hit = got > 0
            if hit.any():  # a hash held with other content (a collision) is not written
                g, a = got[hit], ask[hit]
                same = ((pool.block_tokens[g] == tokens[a]).all(axis=1)
                        & (pool.parent_hash[g] == parents[a]))
                heads[a[same]] = g[same]
                heads[a[~same]] = -1  # neither touched nor written
        have = heads[heads > 0]
        if len(have):
            pool.touch(have)  # kept out of this store's evictions
        missing = np.flatnonzero(heads == 0)
        missing = missing[len(missing) - min(len(missing), pool.get_num_free_blocks()):]
        if len(missing):
            new = pool.get_new_blocks(len(missing))  # lazy eviction (spills below)
            pool.cache(new, hashes[missing], np.ascontiguousarray(parents[missing], dtype=_U64),
                       tokens[missing])
            heads[missing] = new
        order = heads[heads > 0]
        if len(order):
            pool.free_blocks(order)
        self.pages_in += len(missing)
        if self.through and self.lower is not None and len(missing):
            self.lower.store(hashes[missing], np.ascontiguousarray(parents[missing], dtype=_U64),
                             tokens[missing], distinct=True)
        return Stored(np.maximum(heads, 0), len(missing))

    def still_held(self, blocks: np.ndarray, gens: np.ndarray) -> np.ndarray:
        """`blocks` of an earlier `store` whose content is unchanged (generation still
        `gens`: neither evicted nor written again), else 0."""
        return np.where((blocks > 0) & (self.pool.gen[blocks] == gens), blocks, 0)

    def _spill(self, evicted: np.ndarray) -> None:
        assert self.lower is not None
        p = self.pool
        self.lower.store(p.block_hash[evicted], p.parent_hash[evicted], p.block_tokens[evicted])

    # -- checks ------------------------------------------------------------------------------
    def check_holds(self, holds: list[np.ndarray]) -> None:
        """The blocks held are exactly those the loads in flight (`holds`) read."""
        holders = np.zeros(self.pool.num_blocks + 1, dtype=np.int64)
        for held in holds:
            np.add.at(holders, held, 1)
        if not np.array_equal(holders, self.pool.ref_cnt):
            raise InvariantError(f"{self.name} blocks in flight differ from the loads holding "
                                 "them")

    def check_invariants(self) -> None:
        """The pool's invariants and conservation: used + free == capacity."""
        self.pool.check_invariants()
        hashed = int(np.count_nonzero(self.pool.is_hashed))
        if hashed * self.page_size != self.used or self.used + self.free != self.capacity:
            raise InvariantError(f"{self.name} tier: {self.used} used + {self.free} free != "
                                 f"capacity {self.capacity}")


__all__ = ["BlockTier", "Stored", "TierPool"]
