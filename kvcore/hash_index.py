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
  probing's clusters grew long. A slot holds the key, the oldest holder (`head`, > 0), and the
  youngest (`tail`). `head` 0 is an empty slot, -1 a tombstone left by a key whose last
  holder went; probing skips tombstones, insertion takes the first free slot on the key's
  path once the key is known to be absent, and the table is rebuilt without tombstones when
  they fill a quarter of it (so probing never sees it over half full, and a rebuild, which
  reinserts at most a quarter of the table, comes at most once per as many removals).
* The holders of one hash form a doubly linked list through per-block `next`/`prev` arrays in
  insertion order (duplicates exist because block tables are append-only), and each block
  remembers its slot, so removing a block is O(1) and needs no search.
* Batches: a lookup probes all keys at once, dropping the resolved ones each round. An insert
  claims slots for the new keys in rounds (of several keys wanting the same free slot one wins,
  the others probe on) and links each key's new holders, in batch order, after its tail. A
  removal unlinks at most one block per key per round, so two neighbours in one list never
  race. Removing a set of blocks leaves the same lists whatever order they go in.

The order of holders is exactly the dict-and-lists index's, which tests/kvcore/
test_hash_index.py checks against a plain per-block model on random operation streams.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from kvcore.validation import InvariantError

_U64 = np.uint64
_EMPTY, _TOMB = 0, -1
_S32 = _U64(32)


class BlockHashIndex:
    """Hash -> holders (block ids 1..num_blocks), oldest first, for batches of blocks."""

    def __init__(self, num_blocks: int) -> None:
        nb = num_blocks + 1  # block 0 (the null block) is never indexed
        size = 1 << max(4, (4 * nb - 1).bit_length())
        self._mask = _U64(size - 1)
        self._imask = size - 1
        self._keys = np.zeros(size, dtype=_U64)
        self._head = np.zeros(size, dtype=np.int64)  # 0 empty, -1 tombstone, else oldest holder
        self._tail = np.zeros(size, dtype=np.int64)  # youngest holder of a live slot
        self.slot = np.full(nb, -1, dtype=np.int64)  # per block: its key's slot, -1 = unindexed
        self._next = np.zeros(nb, dtype=np.int64)  # younger holder of the same key, 0 = none
        self._prev = np.zeros(nb, dtype=np.int64)  # older holder, 0 = none
        self.num_keys = 0
        self._tombs = 0
        self._scratch = np.zeros(size, dtype=np.int64)  # for the all-distinct checks

    def _distinct(self, slots: np.ndarray) -> bool:
        """Whether `slots` are pairwise distinct, without a sort: write each one's index at
        its slot and read back (whichever write wins, a repeated slot reads back wrong once)."""
        ar = np.arange(len(slots))
        self._scratch[slots] = ar
        return bool((self._scratch[slots] == ar).all())

    # -- probing ---------------------------------------------------------------------------
    def _probe_start(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Home slot and probe step of each hash: low bits, and an odd step from the high
        bits (double hashing, so keys that share a home do not share a path)."""
        home = (hashes & self._mask).astype(np.int64)
        step = ((hashes >> _S32) & self._mask | _U64(1)).astype(np.int64)
        return home, step

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """Slot of each hash (uint64), -1 where it is not indexed."""
        out = np.full(len(hashes), -1, dtype=np.int64)
        todo = np.arange(len(hashes))
        h = hashes
        pos, step = self._probe_start(hashes)
        head, keys, mask = self._head, self._keys, self._imask
        while len(todo):
            hd = head[pos]
            hit = (hd > 0) & (keys[pos] == h)
            out[todo[hit]] = pos[hit]
            go = np.flatnonzero(~hit & (hd != _EMPTY))
            todo, h, step = todo[go], h[go], step[go]
            pos = (pos[go] + step) & mask
        return out

    def heads(self, hashes: np.ndarray) -> np.ndarray:
        """Oldest holder of each hash, 0 where it is not indexed."""
        s = self.find(hashes)
        return np.where(s >= 0, self._head[s], 0)

    def _claim(self, keys: np.ndarray, firsts: np.ndarray) -> np.ndarray:
        """Give each of the distinct, absent `keys` a free slot on its probe path and make
        `firsts` (one block each) its head; returns the slots."""
        head, mask = self._head, self._imask
        out = np.empty(len(keys), dtype=np.int64)
        todo = np.arange(len(keys))
        pos, step = self._probe_start(keys)
        while len(todo):
            busy = np.flatnonzero(head[pos] > 0)
            while len(busy):  # walk each key on to the next free slot of its path
                pos[busy] = (pos[busy] + step[busy]) & mask
                busy = busy[head[pos[busy]] > 0]
            if self._distinct(pos):
                win = np.arange(len(pos))
            else:  # one key per free slot this round
                win = np.unique(pos, return_index=True)[1]
            w, ws = todo[win], pos[win]
            self._tombs -= int(np.count_nonzero(head[ws] == _TOMB))
            self._keys[ws] = keys[w]
            head[ws] = firsts[w]
            out[w] = ws
            if len(win) == len(todo):
                break
            lose = np.ones(len(todo), dtype=bool)
            lose[win] = False
            todo, pos, step = todo[lose], pos[lose], step[lose]
        return out

    # -- batches ---------------------------------------------------------------------------
    def insert(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """Index `blocks` (distinct, unindexed) under `hashes`, each after the holders its hash
        already has, in the given order."""
        if not len(blocks):
            return
        uh, first, inv = np.unique(hashes, return_index=True, return_inverse=True)
        if len(uh) == len(hashes):  # one block per key (the usual case): no list to build
            self._insert_distinct(blocks, hashes)
            return
        slots = self.find(uh)
        new = np.flatnonzero(slots < 0)
        if len(new):
            slots[new] = self._claim(uh[new], blocks[first[new]])
            self.num_keys += len(new)
        existed = np.ones(len(uh), dtype=bool)
        existed[new] = False
        slot_e = slots[inv]
        order = np.argsort(slot_e, kind="stable")
        bs, ss, old = blocks[order], slot_e[order], existed[inv[order]]
        start = np.ones(len(bs), dtype=bool)
        start[1:] = ss[1:] != ss[:-1]
        end = np.ones(len(bs), dtype=bool)
        end[:-1] = start[1:]
        nxt, prv = self._next, self._prev
        nxt[bs[:-1]] = np.where(end[:-1], 0, bs[1:])
        prv[bs[1:]] = np.where(start[1:], 0, bs[:-1])
        f, fs, fold = bs[start], ss[start], old[start]
        t = np.where(fold, self._tail[fs], 0)  # an existing key's youngest holder
        prv[f] = t
        nxt[t[fold]] = f[fold]
        nxt[bs[-1]] = 0
        self._tail[ss[end]] = bs[end]
        self.slot[bs] = ss

    def _insert_distinct(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """`insert` for pairwise distinct hashes: each block is its key's new youngest holder
        (and its only one where the key is new)."""
        slots = self.find(hashes)
        new = slots < 0
        if new.any():
            slots[new] = self._claim(hashes[new], blocks[new])
            self.num_keys += int(np.count_nonzero(new))
        old = ~new
        nxt, prv = self._next, self._prev
        nxt[blocks] = 0
        prv[blocks] = 0
        if old.any():
            b, t = blocks[old], self._tail[slots[old]]
            prv[b] = t
            nxt[t] = b
        self._tail[slots] = blocks
        self.slot[blocks] = slots

    def remove(self, blocks: np.ndarray) -> None:
        """Unindex `blocks` (distinct, indexed); a key losing its last holder is dropped."""
        head, tail, nxt, prv = self._head, self._tail, self._next, self._prev
        s = self.slot[blocks]
        while len(blocks):
            # at most one block per key this round
            one = np.arange(len(s)) if self._distinct(s) else np.unique(s, return_index=True)[1]
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
        keys, heads, tails = self._keys[live], self._head[live], self._tail[live]
        self._keys[:] = 0
        self._head[:] = _EMPTY
        self._tail[:] = 0
        self._tombs = 0
        new = self._claim(keys, heads)
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
        return zip(self._keys[live].tolist(), self._head[live].tolist(), strict=True)

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
        if not np.array_equal(self.find(self._keys[live]), live):
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
