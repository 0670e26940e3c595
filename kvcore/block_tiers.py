"""A lower KV tier of whole blocks keyed by vLLM's block hash chain (vLLM CPU offload / LMCache
style): the host (or storage) store behind the `vllm` policy's device `BlockPool`.

Why it is built this way:
* The tier is itself a `BlockPool` (kvcore/block_pool.py) with its own block ids and capacity:
  its free queue is the LRU order (head = least recently used), its hash index answers
  lookups, and a pop lazily evicts the head. Every block the tier writes is hashed at once, so
  an idle block is either never used (ahead of everything, taken first) or cached content.
* A block is known by (hash, parent hash, token ids), the device pool's own key: a lookup
  continues the device's hit along the same chain (`lookup(hashes, ids, start)`), checking
  the parent and the tokens of every candidate, so a hash collision never yields a wrong block.
* A tier holds each hash at most once: `store` skips (and touches) what it has, so writing
  a request's whole chain costs only its missing blocks. Batches are given in LRU order (first
  = least recent): callers pass a chain reversed, so a chain's tail goes before its head, as
  vLLM frees a request's blocks reversed for the same reason.
* In flight = touched (ref count > 0): a load holds the blocks it reads until the request's
  prefill lands, and nothing touched is ever popped, so nothing in flight is evicted.
* Eviction spills to the next tier down (`lower`) through the pool's `on_evict` hook, in
  eviction order, before the hashes are dropped.

Invariants (`check`): the pool's own equations; every block not idle in the queue is hashed
(in flight) and no hash is held twice (index keys == hashed blocks); used + free == capacity.
"""

from __future__ import annotations

import numpy as np

from kvcore.block_hash import NONE_HASH
from kvcore.block_pool import BlockPool
from kvcore.validation import InvariantError

_U64 = np.uint64


class BlockTier:
    """A host or storage store of hashed blocks, LRU; evicted blocks spill into `lower`."""

    def __init__(self, name: str, num_tokens: int, page_size: int,
                 lower: BlockTier | None = None) -> None:
        blocks = num_tokens // page_size
        if blocks < 1:
            raise ValueError(f"the {name} tier of {num_tokens} slots is smaller than one block "
                             f"of {page_size} tokens")
        self.name = name
        self.page_size = page_size
        self.pool = BlockPool(blocks, page_size)
        self.lower = lower
        self.blocks_in = 0  # blocks written into this tier (what the link into it carried)
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
        the first miss; the first one's parent is `hashes[start - 1]`. Touches nothing."""
        if start >= len(hashes):
            return np.zeros(0, dtype=np.int64)
        ps = self.page_size
        parent = int(hashes[start - 1]) if start else NONE_HASH
        return self.pool.longest_cache_hit(hashes[start:], ids[start * ps:], parent=parent)

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
    def store(self, hashes: np.ndarray, parents: np.ndarray, tokens: np.ndarray) -> int:
        """Write blocks given in LRU order (first = least recent; (k,) hashes and parents,
        (k, page_size) token ids): the ones held are touched, the missing ones take new
        blocks (evicting this tier's LRU blocks, spilled below), as many as fit, the most
        recent first. Every block ends idle at the queue tail in the given order (a block in
        flight stays held). Returns the blocks written."""
        return self.place(hashes, parents, tokens)[1]

    def place(self, hashes: np.ndarray, parents: np.ndarray, tokens: np.ndarray,
              known: np.ndarray | None = None, distinct: bool = False) -> tuple[np.ndarray, int]:
        """`store`, returning also where each block now is (0: not stored). `known` (one per
        block, 0 = unknown) are blocks of an earlier `place` of the same content whose
        generations the caller checked (`still_held`): no lookup for them. `distinct`: the
        caller knows no hash repeats (one chain)."""
        n = len(hashes)
        if not n:
            return np.zeros(0, dtype=np.int64), 0
        hashes = np.ascontiguousarray(hashes, dtype=_U64)
        if not distinct and len(np.unique(hashes)) != n:  # the same content twice: keep the
            keep = np.sort(n - 1 - np.unique(hashes[::-1], return_index=True)[1])  # latest
            where, written = self.place(hashes[keep], parents[keep], tokens[keep],
                                        None if known is None else known[keep], True)
            out = np.zeros(n, dtype=np.int64)
            out[keep] = where
            return out, written
        pool = self.pool
        heads = np.zeros(n, dtype=np.int64) if known is None else known.copy()
        ask = np.flatnonzero(heads == 0) if known is not None else np.arange(n)
        if len(ask) and pool.index.num_live:
            got = pool.index.heads(hashes[ask])
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
            m_parents = np.ascontiguousarray(parents[missing], dtype=_U64)
            pool.cache_full_blocks(new, hashes[missing], int(m_parents[0]), tokens[missing],
                                   parents=m_parents)
            heads[missing] = new
        order = heads[heads > 0]
        if len(order):
            pool.free_blocks(order)
        self.blocks_in += len(missing)
        return np.maximum(heads, 0), len(missing)

    def still_held(self, blocks: np.ndarray, gens: np.ndarray) -> np.ndarray:
        """`blocks` of an earlier `place` whose content is unchanged (generation still
        `gens`: neither evicted nor written again), else 0."""
        return np.where((blocks > 0) & (self.pool.gen[blocks] == gens), blocks, 0)

    def _spill(self, evicted: np.ndarray) -> None:
        assert self.lower is not None
        p = self.pool
        self.lower.store(p.block_hash[evicted], p.parent_hash[evicted], p.block_tokens[evicted])

    # -- checks ------------------------------------------------------------------------------
    def check(self) -> None:
        """The pool's equations; in flight => hashed; each hash held once; conservation."""
        p = self.pool
        p.check_invariants()
        if ((p.ref_cnt > 0) & ~p.is_hashed).any():
            raise InvariantError(f"{self.name} tier: a block in flight holds no content")
        hashed = int(np.count_nonzero(p.is_hashed))
        if p.index.num_keys != hashed:
            raise InvariantError(f"{self.name} tier: {hashed} hashed blocks under "
                                 f"{p.index.num_keys} hashes (a hash held twice)")
        if hashed * self.page_size != self.used or self.used + self.free != self.capacity:
            raise InvariantError(f"{self.name} tier: {self.used} used + {self.free} free != "
                                 f"capacity {self.capacity}")


__all__ = ["BlockTier"]
