"""The block pool's hash index: block hash -> every block holding that content, oldest first.

vLLM keeps this index as a Python dict of hash -> blocks. At page size 1 every token is a
block, so the index sees one insertion and one removal per prompt token: a 12 k-token prompt
is 12 k of each, and a dict (or any per-block Python step) made the `vllm` policy tens of
times slower than `paged`. The table here is numpy arrays taking whole batches, and it is
shaped so that the common operations touch as little memory as possible (the table is far
larger than the caches, so every random access is a cache miss, and misses are the cost):

* **A multimap with linear probing.** One row per entry (key, block, generation); equal keys
  are separate rows on the same probe path. Probing goes one row forward at a time, so a
  probe's rows share cache lines, and no row ever moves except in a rebuild.
* **Lazy deletion.** A block's entry is live while the block's generation (`gen`, set when it
  is indexed, 0 when it is not) equals the row's. Removing blocks is a write of 0 into `gen`,
  one small array: no table access at all. Dead rows stay in the table, skipped by lookups,
  until a rebuild drops them.
* **Order for free.** With no row ever freed between rebuilds, a new entry lands on the first
  empty row of its key's path: after every older entry of the same key. So the live rows of a
  key in probe order are its holders oldest first, exactly vLLM's order (a dict of lists), with
  no per-key list to maintain.
* **Rebuilds** when occupied rows (live and dead) would pass half of the home slots: the live
  rows, sorted by home slot (stably, so equal keys keep their order), are written back in one
  pass, each at `i + cummax(home_j - j)`, the closed form of linear probing for sorted keys.
  The table has spare rows past the last home slot instead of wrapping around, so a cluster
  near the end runs on into them (a rebuild adds more in the rare case they run out); the
  last row always stays empty, so every probe ends inside the table.
* Batches probe in rounds, each round one vectorised step for every key still walking; when
  few keys are left they finish one at a time (a numpy round costs a dozen calls whatever its
  size, a key's step in Python about one).

tests/kvcore/test_hash_index.py checks the order of holders against a plain dict of lists on
random operation streams.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from kvcore.validation import InvariantError

_U64 = np.uint64
#: a row of the flat table: the key's bits, the block (0: an empty row) and its generation
_KEY, _BLOCK, _GEN = 0, 1, 2
_ROW = 3
#: keys left walking at which a batch finishes one key at a time
_FEW = 32


def _bits(hashes: np.ndarray) -> np.ndarray:
    """uint64 hashes as the int64 words the table stores."""
    return np.ascontiguousarray(hashes, dtype=_U64).view(np.int64)


class BlockHashIndex:
    """Hash -> holders (block ids 1..num_blocks), oldest first, for batches of blocks."""

    #: keys left walking when a batch goes on one key at a time (0: always whole rounds)
    few = _FEW
    #: rows past the last home slot at the start (a cluster there runs on into them)
    min_spare = 64

    def __init__(self, num_blocks: int) -> None:
        nb = num_blocks + 1  # block 0 (the null block) is never indexed
        self.gen = np.zeros(nb, dtype=np.int64)  # per block: its entry's generation, 0 = none
        self._last_gen = 0
        self.num_live = 0  # indexed blocks
        self._used = 0  # occupied rows, live and dead
        self._homes = 1 << max(4, (4 * nb - 1).bit_length())  # at most a quarter live
        self._alloc(self._homes + max(self.min_spare, self._homes >> 6))

    def _alloc(self, rows: int) -> None:
        self._rows = rows
        self._t = np.zeros(rows * _ROW, dtype=np.int64)

    def _home(self, hashes: np.ndarray) -> np.ndarray:
        return (np.ascontiguousarray(hashes, dtype=_U64) & _U64(self._homes - 1)).astype(
            np.int64)

    # -- batches ---------------------------------------------------------------------------
    def insert(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """Index `blocks` (distinct, unindexed) under `hashes` (uint64), each after the
        holders its hash already has, in the given order; they share a new generation."""
        k = len(blocks)
        if not k:
            return
        if self._used + k > self._homes // 2:
            self._rebuild()
        self._last_gen += 1
        g = self._last_gen
        self.gen[blocks] = g
        keys, pos = _bits(hashes), self._home(hashes)
        todo = np.arange(k)
        while len(todo):
            todo, pos = self._place(todo, keys, blocks, g, pos)
            if len(todo):  # ran past the spare rows: rebuild with more, place the rest
                self._rebuild(spare=2 * (self._rows - self._homes))
                pos = self._home(hashes[todo])
        self.num_live += k

    def _place(self, todo: np.ndarray, keys: np.ndarray, blocks: np.ndarray, g: int,
               pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write each key of `todo` (batch order) at the first empty row from `pos` on; keys
        reaching one row together go in batch order (so equal keys keep it). Returns the keys
        that ran out of rows, with their positions."""
        t, end = self._t, self._rows - 1  # the last row stays empty: probes stop there
        while len(todo):
            out = pos >= end
            if out.any():
                return todo, pos
            if len(todo) <= self.few:
                return self._place_each(todo, keys, blocks, g, pos)
            r = pos * _ROW
            free = np.flatnonzero(t[r + _BLOCK] == 0)
            if len(free):
                # keys at one free row: of repeated indices numpy's assignment keeps the last
                # write, so writing in reverse lets the earliest batch index win the row
                fr, fk = r[free][::-1], todo[free][::-1]
                t[fr + _BLOCK] = blocks[fk]
                won = t[fr + _BLOCK] == blocks[fk]
                wr, wk = fr[won], fk[won]
                t[wr] = keys[wk]
                t[wr + _GEN] = g
                self._used += len(wk)
                keep = np.ones(len(todo), dtype=bool)
                keep[free[::-1][won]] = False
                todo, pos = todo[keep], pos[keep]
            pos = pos + 1
        return todo, pos

    def _place_each(self, todo: np.ndarray, keys: np.ndarray, blocks: np.ndarray, g: int,
                    pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`_place` for a few keys, one at a time, in batch order."""
        t, end = self._t, self._rows - 1  # the last row stays empty: probes stop there
        for j, (i, p) in enumerate(zip(todo.tolist(), pos.tolist(), strict=True)):
            while p < end and t[p * _ROW + _BLOCK]:
                p += 1
            if p == end:
                return todo[j:], np.full(len(todo) - j, end, dtype=np.int64)
            r = p * _ROW
            t[r] = keys[i]
            t[r + _BLOCK] = blocks[i]
            t[r + _GEN] = g
            self._used += 1
        return todo[:0], pos[:0]

    def remove(self, blocks: np.ndarray) -> None:
        """Unindex `blocks` (distinct, indexed): their rows die where they are."""
        self.gen[blocks] = 0
        self.num_live -= len(blocks)

    def _rebuild(self, spare: int = 0) -> None:
        """Write the live rows back without the dead ones (and with at least `spare` rows
        past the last home slot)."""
        t = self._t
        rows = np.flatnonzero(t[_BLOCK::_ROW])
        b = t[rows * _ROW + _BLOCK]
        live = rows[self.gen[b] == t[rows * _ROW + _GEN]]
        r = live * _ROW
        keys, blocks, gens = t[r], t[r + _BLOCK], t[r + _GEN]
        order = np.argsort(self._home(keys.view(_U64)), kind="stable")  # slot order kept
        keys, blocks, gens = keys[order], blocks[order], gens[order]
        i = np.arange(len(keys))
        pos = i + np.maximum.accumulate(self._home(keys.view(_U64)) - i) if len(i) else i
        need = int(pos[-1]) + 1 if len(pos) else 0
        spare = max(spare, self._rows - self._homes, need - self._homes + self.min_spare)
        if self._homes + spare != self._rows:
            self._alloc(self._homes + spare)
        else:
            self._t[:] = 0
        t, r = self._t, pos * _ROW
        t[r], t[r + _BLOCK], t[r + _GEN] = keys, blocks, gens
        self._used = len(keys)

    # -- lookups ---------------------------------------------------------------------------
    def heads(self, hashes: np.ndarray) -> np.ndarray:
        """Oldest holder of each hash (uint64), 0 where it has none."""
        n = len(hashes)
        out = np.zeros(n, dtype=np.int64)
        todo = np.arange(n)
        keys, pos = _bits(hashes), self._home(hashes)
        t, gen = self._t, self.gen
        while len(todo):
            if len(todo) <= self.few:
                self._heads_each(todo, keys, pos, out)
                break
            r = pos * _ROW
            b = t[r + _BLOCK]
            full = b != 0
            hit = full & (t[r] == keys) & (gen[b] == t[r + _GEN])
            out[todo[hit]] = b[hit]
            go = np.flatnonzero(full & ~hit)
            todo, keys, pos = todo[go], keys[go], pos[go] + 1
        return out

    def _heads_each(self, todo: np.ndarray, keys: np.ndarray, pos: np.ndarray,
                    out: np.ndarray) -> None:
        """`heads` for a few keys, one at a time."""
        t, gen = self._t, self.gen
        for i, k, p in zip(todo.tolist(), keys.tolist(), pos.tolist(), strict=True):
            while True:
                r = p * _ROW
                b = int(t[r + _BLOCK])
                if not b:
                    break
                if t[r] == k and gen[b] == t[r + _GEN]:
                    out[i] = b
                    break
                p += 1

    def holders(self, h: int) -> list[int]:
        """Blocks indexed under hash h, oldest first."""
        t, gen = self._t, self.gen
        k = int(_bits(np.array([h], dtype=_U64))[0])
        p = int(self._home(np.array([h], dtype=_U64))[0])
        out: list[int] = []
        while True:
            r = p * _ROW
            b = int(t[r + _BLOCK])
            if not b:
                break
            if t[r] == k and gen[b] == t[r + _GEN]:
                out.append(b)
            p += 1
        return out

    def live_entries(self) -> tuple[np.ndarray, np.ndarray]:
        """(hash, block) of every live row, in row order (a key's holders oldest first)."""
        t = self._t
        rows = np.flatnonzero(t[_BLOCK::_ROW])
        b = t[rows * _ROW + _BLOCK]
        live = rows[self.gen[b] == t[rows * _ROW + _GEN]] * _ROW
        return t[live].view(_U64), t[live + _BLOCK]

    def items(self) -> Iterator[tuple[int, int]]:
        """(hash, oldest holder) of every indexed hash."""
        keys, blocks = self.live_entries()
        _, first = np.unique(keys, return_index=True)
        return zip(keys[first].tolist(), blocks[first].tolist(), strict=True)

    @property
    def num_keys(self) -> int:
        """Distinct hashes with at least one holder (a full pass: for checks and views)."""
        return len(np.unique(self.live_entries()[0]))

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Counts agree; every indexed block has exactly one live row; every row is reachable
        by probing (no empty row between its home and it); a key's live rows are in the order
        of their generations (oldest first)."""
        t = self._t
        rows = np.flatnonzero(t[_BLOCK::_ROW])
        if len(rows) != self._used:
            raise InvariantError("vllm: hash index row count out of sync")
        if self.gen[0] or int(np.count_nonzero(self.gen)) != self.num_live:
            raise InvariantError("vllm: hash index live count out of sync")
        keys, blocks = self.live_entries()
        if len(blocks) != self.num_live or len(np.unique(blocks)) != len(blocks):
            raise InvariantError("vllm: an indexed block has no live row, or two")
        home = self._home(t[rows * _ROW].view(_U64))
        empty = np.flatnonzero(t[_BLOCK::_ROW] == 0)
        at = np.searchsorted(empty, rows)
        last_empty = np.where(at > 0, empty[np.maximum(at - 1, 0)], -1) if len(empty) else -1
        if (home > rows).any() or ((last_empty > home) & (last_empty < rows)).any():
            raise InvariantError("vllm: a hash index row is not reachable by probing")
        order = np.lexsort((np.arange(len(keys)), keys))
        k, g = keys[order], self.gen[blocks[order]]
        if ((k[1:] == k[:-1]) & (g[1:] < g[:-1])).any():
            raise InvariantError("vllm: a key's holders are out of insertion order")


class HeadView(Mapping[int, int]):
    """Read-only `hash -> oldest holder` view of an index: vLLM's
    `cached_block_hash_to_block` under its name, for tests and debugging sessions."""

    def __init__(self, index: BlockHashIndex) -> None:
        self._index = index

    def __getitem__(self, h: int) -> int:
        b = int(self._index.heads(np.array([h], dtype=_U64))[0])
        if not b:
            raise KeyError(h)
        return b

    def __iter__(self) -> Iterator[int]:
        return (h for h, _ in self._index.items())

    def __len__(self) -> int:
        return self._index.num_keys
