"""The `vllm` policy's memo of prompts it was asked about: their block hash chains and last hits.

The engine asks about a waiting request's prompt again and again before admitting it (each
admission round peeks at the queue head, `lpm` ordering peeks at the whole queue, admission
matches once more). Hashing a 12 k-token prompt and looking up its 12 k blocks every time
(at page size 1 every token is a block) was a large share of the policy's time. A memo entry
keeps, per token array:

* its chain of full-block hashes, extended rather than recomputed when a longer prefix of the
  same tokens is asked about;
* the blocks the last lookup hit and their index generations (`BlockPool.gen`). A block whose
  generation is unchanged was neither evicted nor cached again since, so it is still the
  first holder of its hash whose key matches (holders only join behind it): the next lookup
  starts after the longest still-valid prefix of the last hit.

Entries are found by the array's buffer address and confirmed by comparing the tokens with the
entry's own copy, so a reused or rewritten buffer costs a fresh hash, never a stale one. A peek
compares only the prefix its answer rests on (`recall`, then `confirm`), admission the whole
prompt (`take`: the request keeps the whole chain). The
memo is bounded (least recently used entries go) and admission takes a prompt's entry out
(`take`); a request released before its prompt is written hands its chain back (`keep`).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvcore.block_hash import NONE_HASH, ChainHasher

_NO_BLOCKS = np.zeros(0, dtype=np.int64)


class ChainEntry:
    """One token array's hashes (of `ids`' full blocks) and the last hit over them."""

    __slots__ = ("at", "evicted", "gens", "hashes", "hit", "ids")

    def __init__(self, ids: np.ndarray, hashes: np.ndarray) -> None:
        self.ids = ids  # a private copy: the hashes are a function of it
        self.hashes = hashes
        self.hit = _NO_BLOCKS  # blocks of the last lookup, a prefix of hashes' blocks
        self.gens = _NO_BLOCKS  # their generations at that lookup
        self.at = -1  # the index's newest segment then, if that lookup ended at a miss
        self.evicted = -1  # the pool's eviction count then (`BlockPool.evicted_blocks`)


class ChainMemo:
    """Up to `capacity` token arrays' chains, least recently used dropped first."""

    def __init__(self, hasher: ChainHasher, capacity: int = 256) -> None:
        self.hasher = hasher
        self.capacity = capacity
        self._entries: OrderedDict[int, ChainEntry] = OrderedDict()

    @staticmethod
    def _key(ids: np.ndarray) -> int:
        return ids.ctypes.data  # the buffer's address (a fraction of __array_interface__'s cost)

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
        e = ChainEntry(ids[:n].copy(), self.hasher.chain(NONE_HASH, ids[:n]))
        self._entries[key] = e
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return e, e.hashes

    def recall(self, ids: np.ndarray, nblocks: int) -> tuple[ChainEntry, np.ndarray] | None:
        """The entry of `ids` and its first `nblocks` hashes when it holds that many, with
        the tokens *not* compared yet; None otherwise (then `chain`). A lookup's answer (the
        hit up to its first miss) rests on the hashes of its first len(hit) + 1 blocks only,
        and the chain's hash i is a function of the tokens of blocks 0..i, so the caller
        compares just that prefix afterwards (`confirm`) instead of the whole prompt before:
        at page size 1 with `--chunked-prefill-size 64` a waiting 48 k-token prompt whose
        hit is about 2 k blocks was compared whole at every one of 7,000 peeks."""
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
        tokens. Admission takes one block more than its peeks asked about (they look at the
        prompt less its last token), and that copy was of the whole prompt."""
        e = self._entries.pop(self._key(ids), None)
        if e is not None:
            hashes = self._extended(e, ids, nblocks)
            if hashes is not None:
                return e, hashes[:nblocks]
        n = nblocks * self.hasher.page_size
        e = ChainEntry(ids[:0], self.hasher.chain(NONE_HASH, ids[:n]))
        return e, e.hashes

    def _extended(self, e: ChainEntry, ids: np.ndarray, nblocks: int) -> np.ndarray | None:
        """The hashes of `e` extended to `nblocks` blocks of `ids` (its own when long enough;
        only the new blocks hashed), with its last hit cut to the blocks it had; None when
        `e` does not hold the tokens of `ids` (a reused or rewritten buffer)."""
        ps = self.hasher.page_size
        have = min(len(e.hashes), nblocks)
        if not bool((e.ids[: have * ps] == ids[: have * ps]).all()):
            return None
        if have == nblocks:
            return e.hashes
        parent = int(e.hashes[have - 1]) if have else NONE_HASH
        more = self.hasher.chain(parent, ids[have * ps : nblocks * ps])
        e.hit, e.gens = e.hit[:have], e.gens[:have]
        if len(e.hit) >= have:  # a hit that ended at a miss before `have` still ends there
            e.at = -1
        return np.concatenate([e.hashes[:have], more])

    def keep(self, ids: np.ndarray, hashes: np.ndarray, hit: np.ndarray = _NO_BLOCKS,
             gens: np.ndarray = _NO_BLOCKS, at: int = -1, evicted: int = -1) -> None:
        """Remember `hashes`, the chain of `ids`' first full blocks (contiguous int64; a
        released request's prompt and chain), as the entry of `ids` (copied, like every
        entry's tokens), with a hit known over it: `hit` (the oldest holders of its first
        blocks, indexed under `gens`), `at` and `evicted` as a `ChainEntry` keeps them (a
        released request's admission hit: at page size 1 with `--chunked-prefill-size 64`
        the lookup after each of 688 releases walked a 2.6 k-block hit from its start)."""
        ps = self.hasher.page_size
        n = min(len(hashes), len(ids) // ps)
        key = self._key(ids)
        e = ChainEntry(ids[: n * ps].copy(), hashes[:n])
        if 0 < len(hit) <= n:
            e.hit, e.gens, e.at, e.evicted = hit, gens, at, evicted
        self._entries[key] = e
        self._entries.move_to_end(key)
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
