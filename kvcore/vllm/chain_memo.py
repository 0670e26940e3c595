"""The `vllm` manager's memo of prompts it was asked about: their block hash chains and, per KV
cache group, their last hits.

The engine asks about a waiting request's prompt again and again before admitting it (each
admission round peeks at the queue head, `lpm` ordering peeks at the whole queue, admission
matches once more). Hashing a long prompt and looking up every block each time (at page size
1 every token is a block) would dominate the manager's time. A memo entry keeps, per token
array:

* its chain of full-block hashes, extended rather than recomputed when a longer prefix of the
  same tokens is asked about (one chain for every group: vLLM hashes a block once);
* per KV cache group whose hit is a prefix (full attention), the blocks the last lookup hit
  and their index generations (`ChainIndex.gen`). A block whose generation is unchanged was
  neither evicted nor cached again since, so it is still the first holder of its hash whose
  key matches (holders only join behind it): the next lookup starts after the longest
  still-valid prefix of the last hit.

Entries are found by the array's buffer address and confirmed by comparing the tokens with the
entry's own copy, so a reused or rewritten buffer costs a fresh hash, never a stale one. A peek
compares only the prefix its answer rests on (`recall`, then `confirm`), admission the whole
prompt (`take`: the request keeps the whole chain). The memo is bounded (least recently used
entries go) and admission takes a prompt's entry out (`take`); a request released before its
prompt is written hands its chain and admission hits back (`keep`).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvcore.vllm.block_hash import NONE_HASH, ChainHasher

_NO_BLOCKS = np.zeros(0, dtype=np.int64)


class KnownHit:
    """One group's last lookup of a chain: the blocks hit (a prefix of the chain's blocks),
    their generations then, the index's newest caching then if the lookup ended at a miss
    (else -1), and the pool's eviction count then (`BlockPool.evicted_blocks`)."""

    __slots__ = ("at", "blocks", "evicted", "gens")

    def __init__(self, blocks: np.ndarray = _NO_BLOCKS, gens: np.ndarray = _NO_BLOCKS,
                 at: int = -1, evicted: int = -1) -> None:
        self.blocks = blocks
        self.gens = gens
        self.at = at
        self.evicted = evicted

    def cut(self, n: int) -> None:
        """Keep what is known of the first n blocks of the chain only."""
        if len(self.blocks) >= n:  # a hit that ended at a miss before n still ends there
            self.at = -1
        self.blocks, self.gens = self.blocks[:n], self.gens[:n]


class ChainEntry:
    """One token array's hashes (of `ids`' full blocks) and each group's last hit over them."""

    __slots__ = ("hashes", "hits", "ids")

    def __init__(self, ids: np.ndarray, hashes: np.ndarray, groups: int) -> None:
        self.ids = ids  # a private copy: the hashes are a function of it
        self.hashes = hashes
        self.hits = [KnownHit() for _ in range(groups)]


class ChainMemo:
    """Up to `capacity` token arrays' chains, least recently used dropped first; each entry
    knows a hit per KV cache group (`groups` of them)."""

    def __init__(self, hasher: ChainHasher, groups: int = 1, capacity: int = 256) -> None:
        self.hasher = hasher
        self.groups = groups
        self.capacity = capacity
        self._entries: OrderedDict[int, ChainEntry] = OrderedDict()

    @staticmethod
    def _key(ids: np.ndarray) -> int:
        return ids.ctypes.data  # the buffer's address (a fraction of __array_interface__'s cost)

    def _add(self, key: int, e: ChainEntry) -> None:
        self._entries[key] = e
        self._entries.move_to_end(key)
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def chain(self, ids: np.ndarray, nblocks: int) -> tuple[ChainEntry, np.ndarray]:
        """The entry of `ids` (contiguous int64) and the hashes of its first `nblocks` full
        blocks (nblocks * page_size <= len(ids))."""
        key = self._key(ids)
        e = self._entries.get(key)
        if e is not None:
            hashes = self._extended(e, ids, nblocks)
            if hashes is not None:
                self._entries.move_to_end(key)
                if len(e.hashes) < nblocks:
                    e.hashes, e.ids = hashes, ids[: nblocks * self.hasher.page_size].copy()
                return e, e.hashes[:nblocks]
            del self._entries[key]
        n = nblocks * self.hasher.page_size
        e = ChainEntry(ids[:n].copy(), self.hasher.chain(NONE_HASH, ids[:n]), self.groups)
        self._add(key, e)
        return e, e.hashes

    def recall(self, ids: np.ndarray, nblocks: int) -> tuple[ChainEntry, np.ndarray] | None:
        """The entry of `ids` and its first `nblocks` hashes when it holds that many, with
        the tokens *not* compared yet; None otherwise (then `chain`). A prefix lookup's
        answer (the hit up to its first miss) rests on the hashes of its first len(hit) + 1
        blocks only, and the chain's hash i is a function of the tokens of blocks 0..i, so
        the caller compares just that prefix afterwards (`confirm`) instead of the whole
        prompt before."""
        key = self._key(ids)
        e = self._entries.get(key)
        if e is None or len(e.hashes) < nblocks:
            return None
        self._entries.move_to_end(key)
        return e, e.hashes[:nblocks]

    def confirm(self, e: ChainEntry, ids: np.ndarray, nblocks: int) -> bool:
        """Whether `e` (from `recall` of `ids`) holds the tokens of the first `nblocks`
        blocks of `ids`; if not (a rewritten buffer) the entry is dropped, so the caller's
        `chain` hashes afresh."""
        n = nblocks * self.hasher.page_size
        if bool((e.ids[:n] == ids[:n]).all()):
            return True
        key = self._key(ids)
        if self._entries.get(key) is e:
            del self._entries[key]
        return False

    def take(self, ids: np.ndarray, nblocks: int) -> tuple[ChainEntry, np.ndarray]:
        """`chain`, for the last time: the entry leaves the memo (its request was admitted
        and keeps the chain), so a longer chain is not stored back with a copy of the
        tokens (admission asks about one block more than its peeks, which look at the
        prompt less its last token)."""
        e = self._entries.pop(self._key(ids), None)
        if e is not None:
            hashes = self._extended(e, ids, nblocks)
            if hashes is not None:
                return e, hashes[:nblocks]
        n = nblocks * self.hasher.page_size
        e = ChainEntry(ids[:0], self.hasher.chain(NONE_HASH, ids[:n]), self.groups)
        return e, e.hashes

    def _extended(self, e: ChainEntry, ids: np.ndarray, nblocks: int) -> np.ndarray | None:
        """The hashes of `e` extended to `nblocks` blocks of `ids` (its own when long enough;
        only the new blocks hashed), with its known hits cut to the blocks it had; None when
        `e` does not hold the tokens of `ids` (a reused or rewritten buffer)."""
        ps = self.hasher.page_size
        have = min(len(e.hashes), nblocks)
        if not bool((e.ids[: have * ps] == ids[: have * ps]).all()):
            return None
        if have == nblocks:
            return e.hashes
        parent = int(e.hashes[have - 1]) if have else NONE_HASH
        more = self.hasher.chain(parent, ids[have * ps : nblocks * ps])
        for hit in e.hits:
            hit.cut(have)
        return np.concatenate([e.hashes[:have], more])

    def keep(self, ids: np.ndarray, hashes: np.ndarray,
             hits: list[KnownHit] | None = None) -> None:
        """Remember `hashes`, the chain of `ids`' first full blocks (contiguous int64; a
        released request's prompt and chain), as the entry of `ids` (copied, like every
        entry's tokens), with each group's hit known over it (`hits`, one per group: a
        released request's admission hits, still the oldest holders of their blocks)."""
        ps = self.hasher.page_size
        n = min(len(hashes), len(ids) // ps)
        e = ChainEntry(ids[: n * ps].copy(), hashes[:n], self.groups)
        for g, hit in enumerate(hits or ()):
            if 0 < len(hit.blocks) <= n:
                e.hits[g] = hit
        self._add(self._key(ids), e)

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["ChainEntry", "ChainMemo", "KnownHit"]
