"""The reference engine's memory (reference_engine.py): plain models of the `paged` /
`paged-nocache` radix cache and of the `vllm` block pool, written from docs/kvcore.md and
docs/policies.md, sharing no code with kvcore/.

Pages and blocks are Python lists and the prefix caches dicts keyed by token prefixes: slow
(quadratic in places), obviously correct at a glance, and only for small workloads. Both
classes answer the same calls (peek, available, admit, extend, decode, cache_prefix, finish,
release), all-or-nothing where the policies are.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def cdiv(a: int, b: int) -> int:
    """Ceiling division: pages for a token count."""
    return -(-a // b)


# -- memory: paged (radix) -------------------------------------------------------------------
@dataclass
class _Page:
    """One cached page of the radix cache: the page id, the LRU clock of its node, its node."""

    page: int
    tick: int
    node: int


class RadixPages:
    """`paged` / `paged-nocache`: a free list of page ids, per-request private page lists, and
    the prefix cache as {token prefix ending on a page boundary: _Page}. A node of the radix
    tree is the set of pages sharing a node label; locks are the running requests' locked
    prefixes."""

    def __init__(self, num_pages: int, ps: int, cache: bool) -> None:
        self.ps, self.cache_on = ps, cache
        self.free = list(range(num_pages, 0, -1))
        self.cache: dict[tuple, _Page] = {}
        self.clock = 0
        self.next_node = 0
        self.private: dict[int, list[int]] = {}  # rid -> pages of [locked, written)
        self.locked: dict[int, tuple] = {}  # rid -> its locked prefix (whole cached pages)

    # the cache as a dict
    def _hit(self, key: tuple) -> int:
        n = 0
        while n + self.ps <= len(key) and key[: n + self.ps] in self.cache:
            n += self.ps
        return n

    def _is_locked(self, k: tuple) -> bool:
        return any(len(lk) >= len(k) and lk[: len(k)] == k for lk in self.locked.values())

    def _is_leaf(self, k: tuple) -> bool:
        return not any(len(c) == len(k) + self.ps and c[: len(k)] == k for c in self.cache)

    def _walk(self, key: tuple, n: int) -> None:
        """What a match or insert does to the cached part [0, n) of `key`: every node it
        enters gets the clock (all of the node), and a node it leaves in the middle splits."""
        nodes = {self.cache[key[:j]].node for j in range(self.ps, n + 1, self.ps)}
        for e in self.cache.values():
            if e.node in nodes:
                e.tick = self.clock
        if n:
            last = self.cache[key[:n]].node
            deeper = [k for k, e in self.cache.items() if e.node == last and len(k) > n]
            if deeper:  # split: the part up to n becomes a node of its own
                self.next_node += 1
                for j in range(self.ps, n + 1, self.ps):
                    if self.cache[key[:j]].node == last:
                        self.cache[key[:j]].node = self.next_node

    def peek(self, key: tuple) -> tuple[int, int]:
        hit = self._hit(key) if self.cache_on else 0
        evictable = sum(self.ps for j in range(self.ps, hit + 1, self.ps)
                        if not self._is_locked(key[:j]))
        return hit, evictable

    def available(self) -> int:
        cached = sum(self.ps for k in self.cache if not self._is_locked(k))
        return len(self.free) * self.ps + cached

    def evict(self, tokens: int) -> None:
        """Whole unlocked leaf nodes, least recently used first, until `tokens` are freed."""
        freed = 0
        while freed < tokens:
            leaves = [(e.tick, k) for k, e in self.cache.items()
                      if self._is_leaf(k) and not self._is_locked(k)]
            if not leaves:
                return
            node = self.cache[min(leaves)[1]].node
            keys = [k for k, e in self.cache.items() if e.node == node]
            assert not any(map(self._is_locked, keys)), "a node is locked in part"
            for k in keys:
                self.free.append(self.cache.pop(k).page)
                freed += self.ps

    def _take(self, n: int) -> list[int] | None:
        if n > len(self.free):
            return None
        return [self.free.pop() for _ in range(n)]

    def admit(self, rid: int, ids: tuple) -> int:
        key = ids[: len(ids) - 1]
        hit = self._hit(key) if self.cache_on else 0
        if self.cache_on:
            self.clock += 1
            self._walk(key, hit)
        self.locked[rid] = key[:hit]
        self.private[rid] = []
        return hit

    def extend(self, items: list[tuple[int, int, int]]) -> bool:
        """items: (rid, written, target); all or nothing."""
        need = sum(cdiv(t, self.ps) - cdiv(w, self.ps) for _, w, t in items)
        self.evict((need - len(self.free)) * self.ps)  # short of pages: evict first
        pages = self._take(need)
        if pages is None:
            return False
        for rid, w, t in items:
            k = cdiv(t, self.ps) - cdiv(w, self.ps)
            self.private[rid] += pages[:k]
            pages = pages[k:]
        return True

    def decode(self, items: list[tuple[int, int]]) -> bool:
        """items: (rid, written): one token each; a request at a page boundary needs a page."""
        need = sum(1 for _, w in items if w % self.ps == 0)
        self.evict((need - len(self.free)) * self.ps)
        pages = self._take(need)
        if pages is None:
            return False
        for rid, w in items:
            if w % self.ps == 0:
                self.private[rid].append(pages.pop(0))
        return True

    def _insert(self, rid: int, ids: tuple, written: int) -> int:
        """Insert the whole written pages; the request's copies of pages already cached are
        freed, the rest move to the cache. Returns the inserted length."""
        n = written - written % self.ps
        lk = len(self.locked[rid])
        if not self.cache_on or n <= lk:
            return lk
        key = ids[:n]
        self.clock += 1
        already = self._hit(key)
        self._walk(key, already)
        own = self.private[rid]
        mine = own[: (n - lk) // self.ps]
        self.private[rid] = own[(n - lk) // self.ps:]
        self.free += mine[: (already - lk) // self.ps]  # duplicates
        self.next_node += 1
        for j, page in zip(range(already + self.ps, n + 1, self.ps),
                           mine[(already - lk) // self.ps:], strict=True):
            self.cache[key[:j]] = _Page(page, self.clock, self.next_node)
        self._all_ours = already == lk
        return n

    def cache_prefix(self, rid: int, ids: tuple, written: int) -> None:
        lk = len(self.locked[rid])
        n = self._insert(rid, ids, written)
        if n <= lk:
            return
        self.clock += 1  # the request locks what it inserted: the path is touched again
        if self._all_ours:
            for j in range(self.ps, n + 1, self.ps):
                self.cache[ids[:j]].tick = self.clock
        else:
            self._walk(ids[:n], n)
        self.locked[rid] = ids[:n]

    def finish(self, rid: int, ids: tuple, written: int) -> None:
        self._insert(rid, ids, written)
        self.release(rid)

    def release(self, rid: int) -> None:
        self.free += self.private.pop(rid)
        del self.locked[rid]


# -- memory: vllm blocks ----------------------------------------------------------------------
@dataclass
class _VReq:
    ids: tuple  # the token ids known so far
    blocks: list[int] = field(default_factory=list)
    hashed: int = 0
    written: int = 0


class VLLMBlocks:
    """`vllm`: blocks 1..N, ref counts, the free queue as a list (head = LRU end), the prefix
    index as {token prefix ending on a block boundary: [blocks holding it, oldest first]}."""

    def __init__(self, num_pages: int, ps: int) -> None:
        self.ps = ps
        self.queue = list(range(1, num_pages + 1))
        self.ref = [0] * (num_pages + 1)
        self.key: dict[int, tuple] = {}
        self.index: dict[tuple, list[int]] = {}
        self.reqs: dict[int, _VReq] = {}

    def _lookup(self, ids: tuple, nblocks: int) -> list[int]:
        out = []
        for i in range(nblocks):
            holders = self.index.get(ids[: (i + 1) * self.ps])
            if not holders:
                break
            out.append(holders[0])
        return out

    def peek(self, key: tuple) -> tuple[int, int]:
        hit = self._lookup(key, len(key) // self.ps)
        return len(hit) * self.ps, sum(self.ps for b in hit if self.ref[b] == 0)

    def available(self) -> int:
        return len(self.queue) * self.ps

    def admit(self, rid: int, ids: tuple) -> int:
        hit = self._lookup(ids, (len(ids) - 1) // self.ps)
        for b in hit:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1
        self.reqs[rid] = _VReq(ids, list(hit), len(hit), len(hit) * self.ps)
        return len(hit) * self.ps

    def _pop(self, n: int) -> list[int]:
        out, self.queue = self.queue[:n], self.queue[n:]
        for b in out:
            k = self.key.pop(b, None)
            if k is not None:  # lazy eviction
                self.index[k].remove(b)
                if not self.index[k]:
                    del self.index[k]
            self.ref[b] = 1
        return out

    def _hash_full(self, r: _VReq) -> None:
        full = min(r.written, len(r.ids)) // self.ps
        for i in range(r.hashed, full):
            k = r.ids[: (i + 1) * self.ps]
            self.key[r.blocks[i]] = k
            self.index.setdefault(k, []).append(r.blocks[i])
        r.hashed = max(r.hashed, full)

    def extend(self, items: list[tuple[int, int, int]]) -> bool:
        need = sum(cdiv(t, self.ps) - len(self.reqs[rid].blocks) for rid, _, t in items)
        if need > len(self.queue):
            return False
        new = self._pop(need)
        for rid, _, t in items:
            r = self.reqs[rid]
            k = cdiv(t, self.ps) - len(r.blocks)
            r.blocks += new[:k]
            new = new[k:]
            r.written = t
            self._hash_full(r)
        return True

    def decode(self, items: list[tuple[int, int]]) -> bool:
        need = sum(1 for rid, _ in items if self.reqs[rid].written == len(self.reqs[rid].blocks)
                   * self.ps)
        if need > len(self.queue):
            return False
        new = self._pop(need)
        for rid, _ in items:
            r = self.reqs[rid]
            if r.written == len(r.blocks) * self.ps:
                r.blocks.append(new.pop(0))
            r.written += 1
            if r.written % self.ps == 0:
                self._hash_full(r)
        return True

    def cache_prefix(self, rid: int, ids: tuple, written: int) -> None:
        r = self.reqs[rid]
        if len(ids) > len(r.ids):
            r.ids = ids
        self._hash_full(r)

    def finish(self, rid: int, ids: tuple, written: int) -> None:
        self.cache_prefix(rid, ids, written)
        self.release(rid)

    def release(self, rid: int) -> None:
        r = self.reqs.pop(rid)
        for b in reversed(r.blocks):  # chain tail first
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.queue.append(b)
