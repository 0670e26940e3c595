"""The block pool's hash index: block hash -> every block holding that content, oldest first.

vLLM keeps this index as a Python dict of hash -> blocks. At page size 1 every token is a block,
so a dict costs one interpreted step per token: matching a 12 k-token prompt, caching it and
evicting it are each 12 k dict operations, which made the `vllm` policy some 40x slower than
`paged` at page 1. Here the same index lives in numpy arrays and every operation takes a whole
batch of blocks in a few vectorised passes:

* An open-addressing table (double hashing: the home slot from the hash's low bits, an odd
  step from its high bits; power-of-two size at least four times the block count, so at most
  a quarter full of live keys) maps a hash to its slot. A batch probes in rounds, so its cost
  follows the longest probe path in it: double hashing keeps those short where linear
  probing's clusters grew long. A slot is one row of a flat int64 table (a probe's reads share
  a cache line, which matters: the table is far larger than the caches and every access is
  random): the key, the oldest holder (`head`, > 0), the youngest (`tail`) and a claim cell.
  `head` 0 is an empty slot, -1 a tombstone left by a key whose last holder went; probing
  skips tombstones, insertion takes the first free slot on the key's path once the key is
  known to be absent, and the table is rebuilt without tombstones when they fill a quarter
  of it (so probing never sees it over half full, and a rebuild, which reinserts at most a
  quarter of the table, comes at most once per as many removals).
* The holders of one hash form a doubly linked list through per-block `next`/`prev` arrays in
  insertion order (duplicates exist because block tables are append-only), and each block
  remembers its slot, so removing a block is O(1) and needs no search.
* Batches: a lookup probes all keys at once, dropping the resolved ones each round. An insert
  finds the keys it already has, then claims slots for the new ones in rounds: keys at a free
  slot write their batch index into its claim cell and the one read back wins; a loser looks
  at that slot again and joins it if the winner had its key (equal hashes in one batch), else
  walks on. Each key's new holders are linked, in batch order, after its tail. A removal of
  blocks that are each their key's only holder (the usual case) is one pass; otherwise it
  unlinks at most one block per key per round, so two neighbours in one list never race.
  Removing a set of blocks leaves the same lists whatever order they go in.

The order of holders is exactly the dict-and-lists index's, which tests/kvcore/
test_hash_index.py checks against a plain per-block model on random operation streams.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from kvcore.validation import InvariantError

_U64 = np.uint64
_S32 = _U64(32)
_EMPTY, _TOMB = 0, -1
#: a slot's row in the flat table: the key's bits, oldest holder, youngest holder, and a
#: scratch cell where keys racing for the slot write their batch index (the last write wins)
_KEY, _HEAD, _TAIL, _CLAIM = 0, 1, 2, 3
_ROW = 4
#: keys left probing at which a batch finishes one key at a time: a numpy round costs a
#: dozen calls whatever its size, a key's step in Python about one
_FEW = 32


def _bits(hashes: np.ndarray) -> np.ndarray:
    """uint64 hashes as the int64 words the table stores."""
    return np.ascontiguousarray(hashes, dtype=_U64).view(np.int64)


class BlockHashIndex:
    """Hash -> holders (block ids 1..num_blocks), oldest first, for batches of blocks."""

    #: probing keys left when a batch goes on one key at a time (0: always whole rounds)
    few = _FEW

    def __init__(self, num_blocks: int) -> None:
        nb = num_blocks + 1  # block 0 (the null block) is never indexed
        size = 1 << max(4, (4 * nb - 1).bit_length())
        self._mask = _U64(size - 1)
        self._imask = size - 1
        # one row per slot, so a probe's key and head share a cache line
        self._t = np.zeros(size * _ROW, dtype=np.int64)
        self._keys = self._t[_KEY::_ROW]
        self._head = self._t[_HEAD::_ROW]  # 0 empty, -1 tombstone, else oldest holder
        self._tail = self._t[_TAIL::_ROW]  # youngest holder of a live slot
        self.slot = np.full(nb, -1, dtype=np.int64)  # per block: its key's slot, -1 = unindexed
        self._next = np.zeros(nb, dtype=np.int64)  # younger holder of the same key, 0 = none
        self._prev = np.zeros(nb, dtype=np.int64)  # older holder, 0 = none
        self.num_keys = 0
        self._tombs = 0

    # -- probing ---------------------------------------------------------------------------
    def _probe_start(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Home slot and probe step of each hash: low bits, and an odd step from the high
        bits (double hashing, so keys that share a home do not share a path)."""
        h = np.ascontiguousarray(hashes, dtype=_U64)
        home = (h & self._mask).astype(np.int64)
        step = ((h >> _S32) & self._mask | _U64(1)).astype(np.int64)
        return home, step

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """Slot of each hash (uint64), -1 where it is not indexed."""
        return self._find(hashes)[0]

    def _find(self, hashes: np.ndarray, *, free: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(slot of each hash or -1, and with `free` the first free slot on each absent
        hash's probe path: where an insertion claims from)."""
        n = len(hashes)
        out = np.full(n, -1, dtype=np.int64)
        first = np.full(n if free else 0, -1, dtype=np.int64)
        todo = np.arange(n)
        k = _bits(hashes)
        pos, step = self._probe_start(hashes)
        t, mask = self._t, self._imask
        while len(todo):
            if len(todo) <= self.few:
                self._find_each(todo, k, pos, step, out, first if free else None)
                break
            hd = t[pos * _ROW + _HEAD]
            live = hd > 0
            hit = live & (t[pos * _ROW] == k)
            if hit.any():
                out[todo[hit]] = pos[hit]
            if free:
                open_ = ~live
                if open_.any():
                    mark = todo[open_]
                    unset = first[mark] < 0
                    first[mark[unset]] = pos[open_][unset]
            go = np.flatnonzero(~hit & (hd != _EMPTY))
            todo, k, step = todo[go], k[go], step[go]
            pos = (pos[go] + step) & mask
        return out, first

    def _find_each(self, todo: np.ndarray, k: np.ndarray, pos: np.ndarray, step: np.ndarray,
                   out: np.ndarray, first: np.ndarray | None) -> None:
        """`_find`'s rounds for a few keys, one key at a time."""
        t, mask = self._t, self._imask
        for i, kk, p, st in zip(todo.tolist(), k.tolist(), pos.tolist(), step.tolist(),
                                strict=True):
            while True:
                r = p * _ROW
                hd = int(t[r + _HEAD])
                if hd > 0:
                    if int(t[r]) == kk:
                        out[i] = p
                        break
                else:
                    if first is not None and first[i] < 0:
                        first[i] = p
                    if hd == _EMPTY:
                        break
                p = (p + st) & mask

    def heads(self, hashes: np.ndarray) -> np.ndarray:
        """Oldest holder of each hash, 0 where it is not indexed."""
        s = self.find(hashes)
        return np.where(s >= 0, self._head[s], 0)

    def _claim(self, hashes: np.ndarray, firsts: np.ndarray,
               start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Give each of `hashes` (all absent from the table before this call) a free slot on
        its probe path, from `start` (a slot on that path with no free slot before it; the
        home slot by default), with `firsts` (one block each) as its head. Equal hashes
        share one slot: the ones that find their key already claimed in this call are
        `joined`. Returns (slots, joined)."""
        t, mask = self._t, self._imask
        n = len(hashes)
        out = np.empty(n, dtype=np.int64)
        joined = np.zeros(n, dtype=bool)
        todo = np.arange(n)
        k = _bits(hashes)
        pos, step = self._probe_start(hashes)
        if start is not None:
            pos = start.copy()
        while len(todo):
            if len(todo) <= self.few:
                self._claim_each(todo, k[todo], pos, step, firsts, out, joined)
                break
            r = pos * _ROW
            hd = t[r + _HEAD]
            live = hd > 0
            if live.any():
                mine = live & (t[r] == k[todo])  # claimed by an equal key of this call
                if mine.any():
                    out[todo[mine]] = pos[mine]
                    joined[todo[mine]] = True
                    keep = ~mine
                    todo, pos, step, live = todo[keep], pos[keep], step[keep], live[keep]
                pos[live] = (pos[live] + step[live]) & mask  # walk on to a free slot
                continue
            t[r + _CLAIM] = todo  # several keys at one free slot: the last write wins
            win = t[r + _CLAIM] == todo
            w, wr = todo[win], r[win]
            self._tombs -= int(np.count_nonzero(hd[win] == _TOMB))
            t[wr] = k[w]
            t[wr + _HEAD] = firsts[w]
            out[w] = pos[win]
            lose = ~win  # the losers look at the same slot again: their key, or walk on
            todo, pos, step = todo[lose], pos[lose], step[lose]
        return out, joined

    def _claim_each(self, todo: np.ndarray, k: np.ndarray, pos: np.ndarray, step: np.ndarray,
                    firsts: np.ndarray, out: np.ndarray, joined: np.ndarray) -> None:
        """`_claim`'s rounds for a few keys, one key at a time (no races left to settle)."""
        t, mask = self._t, self._imask
        for i, kk, p, st in zip(todo.tolist(), k.tolist(), pos.tolist(), step.tolist(),
                                strict=True):
            while True:
                r = p * _ROW
                hd = int(t[r + _HEAD])
                if hd > 0:
                    if int(t[r]) == kk:  # claimed by an equal key of this call
                        out[i], joined[i] = p, True
                        break
                    p = (p + st) & mask
                    continue
                if hd == _TOMB:
                    self._tombs -= 1
                t[r] = kk
                t[r + _HEAD] = firsts[i]
                out[i] = p
                break

    # -- batches ---------------------------------------------------------------------------
    def insert(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """Index `blocks` (distinct, unindexed) under `hashes`, each after the holders its hash
        already has, in the given order."""
        if not len(blocks):
            return
        slots, first_free = self._find(hashes, free=True)
        old = slots >= 0
        new = np.flatnonzero(~old)
        shared = False
        if len(new):
            got, joined = self._claim(hashes[new], blocks[new], first_free[new])
            slots[new] = got
            nj = int(np.count_nonzero(joined))
            self.num_keys += len(new) - nj
            shared = nj > 0
        nold = len(blocks) - len(new)
        if not shared and nold > 1:
            so = slots[old]
            shared = len(np.unique(so)) < len(so)
        if shared:
            self._link_groups(blocks, slots, old)
            return
        # one block per key (the usual case): no list to build
        nxt, prv = self._next, self._prev
        nxt[blocks] = 0
        prv[blocks] = 0
        if nold:
            b, tl = blocks[old], self._tail[slots[old]]
            prv[b] = tl
            nxt[tl] = b
        self._tail[slots] = blocks
        self.slot[blocks] = slots

    def _link_groups(self, blocks: np.ndarray, slots: np.ndarray, old: np.ndarray) -> None:
        """`insert`'s linking where some key takes several blocks: group by slot, keep batch
        order within a group, hang each group after its key's tail (or make it the list)."""
        order = np.argsort(slots, kind="stable")
        bs, ss, fold = blocks[order], slots[order], old[order]
        start = np.ones(len(bs), dtype=bool)
        start[1:] = ss[1:] != ss[:-1]
        end = np.ones(len(bs), dtype=bool)
        end[:-1] = start[1:]
        nxt, prv = self._next, self._prev
        nxt[bs[:-1]] = np.where(end[:-1], 0, bs[1:])
        prv[bs[1:]] = np.where(start[1:], 0, bs[:-1])
        f, fs, fo = bs[start], ss[start], fold[start]
        tl = np.where(fo, self._tail[fs], 0)  # an existing key's youngest holder
        prv[f] = tl
        nxt[tl[fo]] = f[fo]
        self._head[fs[~fo]] = f[~fo]  # a new key's first holder in batch order
        nxt[bs[-1]] = 0
        self._tail[ss[end]] = bs[end]
        self.slot[bs] = ss

    def remove(self, blocks: np.ndarray) -> None:
        """Unindex `blocks` (distinct, indexed); a key losing its last holder is dropped."""
        head, tail, nxt, prv = self._head, self._tail, self._next, self._prev
        s = self.slot[blocks]
        if not (prv[blocks].any() or nxt[blocks].any()):  # each its key's only holder
            r = s * _ROW
            self._t[r + _HEAD] = _TOMB
            self._t[r + _TAIL] = 0
            self.num_keys -= len(blocks)
            self._tombs += len(blocks)
            self.slot[blocks] = -1
            blocks = blocks[:0]
        while len(blocks):
            one = np.unique(s, return_index=True)[1]  # at most one block per key this round
            b, bs = blocks[one], s[one]
            p, n = prv[b], nxt[b]
            hp, hn = p != 0, n != 0
            nxt[p[hp]] = n[hp]
            head[bs[~hp]] = n[~hp]
            prv[n[hn]] = p[hn]
            tail[bs[~hn]] = p[~hn]
            gone = bs[~hp & ~hn]
            head[gone] = _TOMB
            self.num_keys -= len(gone)
            self._tombs += len(gone)
            nxt[b] = prv[b] = 0
            self.slot[b] = -1
            rest = np.ones(len(blocks), dtype=bool)
            rest[one] = False
            blocks, s = blocks[rest], s[rest]
        if self._tombs * 4 > len(head):
            self._rebuild()

    def _rebuild(self) -> None:
        """Reinsert the live keys into a table without tombstones."""
        live = np.flatnonzero(self._head > 0)
        keys, heads, tails = self._keys[live].view(_U64), self._head[live], self._tail[live]
        self._t[:] = 0
        self._tombs = 0
        new, _ = self._claim(keys, heads)
        self._tail[new] = tails
        moved = np.full(len(self._head), -1, dtype=np.int64)
        moved[live] = new
        idx = np.flatnonzero(self.slot >= 0)
        self.slot[idx] = moved[self.slot[idx]]

    # -- single keys -----------------------------------------------------------------------
    def holders(self, h: int) -> list[int]:
        """Blocks indexed under hash h, oldest first."""
        s = int(self.find(np.array([h], dtype=_U64))[0])
        out: list[int] = []
        b = int(self._head[s]) if s >= 0 else 0
        while b:
            out.append(b)
            b = int(self._next[b])
        return out

    def items(self) -> Iterator[tuple[int, int]]:
        """(hash, oldest holder) of every indexed hash, in slot order."""
        live = np.flatnonzero(self._head > 0)
        return zip(self._keys[live].view(_U64).tolist(), self._head[live].tolist(),
                   strict=True)

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Each live slot's list runs head..tail through next/prev, its blocks point back at
        the slot, every indexed block is in exactly one list, each key is found by probing
        (no empty slot on its path) and the key and tombstone counts are right."""
        head = self._head
        live = np.flatnonzero(head > 0)
        if len(live) != self.num_keys or int(np.count_nonzero(head == _TOMB)) != self._tombs:
            raise InvariantError("vllm: hash index key or tombstone count out of sync")
        if (head < _TOMB).any() or len(np.unique(self._keys[live])) != len(live):
            raise InvariantError("vllm: hash index has a bad slot or a key twice")
        if not np.array_equal(self.find(self._keys[live].view(_U64)), live):
            raise InvariantError("vllm: a hash index key is not reachable by probing")
        seen = 0
        for s in live.tolist():
            b, prev = int(head[s]), 0
            while b:
                if self.slot[b] != s or self._prev[b] != prev:
                    raise InvariantError(f"vllm: hash index list of slot {s} is broken at {b}")
                prev, b = b, int(self._next[b])
                seen += 1
            if prev != self._tail[s]:
                raise InvariantError(f"vllm: hash index tail of slot {s} is wrong")
        if seen != int(np.count_nonzero(self.slot >= 0)):
            raise InvariantError("vllm: a block points at a slot whose list lacks it")


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
