"""The `vllm` policy: vLLM v1's block pool with hash-chained prefix caching.

Modelled on the design of vLLM v1's KV cache manager (a re-implementation, not a copy):

* A pool of `num_pages` usable blocks of `page_size` slots, ids 1..num_pages; block 0 is the
  null placeholder (the dummy page of kvsim's address space) and is never handed out, so the
  capacity is `num_pages * page_size` like the paged policies.
* Free blocks sit in one FIFO queue with O(1) popleft, append and remove. Allocation pops from
  the head. The queue is an array of block ids with tombstones (a removed block leaves a 0
  behind; the array is compacted when it fills), so a request's thousands of blocks are
  popped, appended or removed in a few numpy operations instead of one Python step each. The
  order is exactly that of a doubly linked list.
* Only full blocks are cached. A full block is keyed by a chained 64-bit hash of (parent
  block's hash, the block's token ids): a polynomial hash of the whole prefix, finalised by an
  invertible mixer, so it is a function of (parent hash, block tokens) and a request's blocks
  hash in one vectorised pass (deterministic across runs). Each hashed block keeps its parent
  hash and token ids, and a lookup compares both, so a hash collision never yields a wrong hit.
  A block is hashed as soon as it is full and its token ids are known: prompt blocks during
  prefill; decode blocks during decode when a token source is set (`set_token_source`),
  otherwise at `cache_prefix` / `finish`, whose `token_ids` cover every written token.
* Blocks are ref-counted; a block with count 0 goes to the tail of the free queue still hashed
  (cached, reusable). Popping a hashed block for a new allocation drops its hash: eviction is
  lazy, LRU. A request's blocks are freed in reverse order, so the tail of a chain (the longest,
  least shareable prefix) is evicted first.
* The same content may be cached in two blocks (block tables are append-only): duplicates are
  allowed, the hash maps to every block holding it (oldest first).
* A lookup matches whole blocks of `prompt[:P-1]`: the last prompt token is always recomputed
  to get logits, so a block-aligned prompt recomputes its last block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from kvcore.breakdown import PARTS, MemoryBreakdown, page_growth_profile
from kvcore.policies.base import (
    AdmitResult,
    KVPolicy,
    PolicyConfig,
    PrefixPeek,
    register_policy,
)
from kvcore.req_to_token_pool import ReqToTokenPool
from kvcore.validation import (
    InvariantError,
    cdiv,
    check_request_lengths,
    non_negative_int,
    positive_int,
)

#: parent hash of a request's first block
NONE_HASH = 0

#: (rid, start, end) -> token ids of positions start..end-1 of that request
TokenSource = Callable[[int, int, int], np.ndarray]

_MASK = (1 << 64) - 1
_U64 = np.uint64
#: polynomial base (odd, hence invertible mod 2**64) and its inverse
_BASE = 0x9FB21C651E98DF25
_BASE_INV = pow(_BASE, -1, 1 << 64)
#: added to a token id before mixing, so token 0 does not map to 0
_SALT = 0x9E3779B97F4A7C15
_M1, _M2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53
_M1_INV, _M2_INV = pow(_M1, -1, 1 << 64), pow(_M2, -1, 1 << 64)
_S33 = _U64(33)


def _mix(x: np.ndarray) -> np.ndarray:
    """Invertible 64-bit finaliser (xor-shift / multiply); maps 0 to 0. uint64 in and out."""
    x = x ^ (x >> _S33)
    x = x * _U64(_M1)
    x = x ^ (x >> _S33)
    x = x * _U64(_M2)
    return x ^ (x >> _S33)


def _unmix(x: np.ndarray) -> np.ndarray:
    """Inverse of `_mix` (a shift by 33 >= 32 bits is its own xor-shift inverse)."""
    x = x ^ (x >> _S33)
    x = x * _U64(_M2_INV)
    x = x ^ (x >> _S33)
    x = x * _U64(_M1_INV)
    return x ^ (x >> _S33)


def _token_words(tokens: np.ndarray) -> np.ndarray:
    """Token ids (int64) -> the mixed uint64 words the polynomial hash sums."""
    return _mix(np.ascontiguousarray(tokens, dtype=np.int64).view(_U64) + _U64(_SALT))


def _powers(base: int, n: int) -> np.ndarray:
    """base**0 .. base**(n-1) mod 2**64 (uint64)."""
    pw = np.full(n, base, dtype=_U64)
    pw[0] = 1
    return np.cumprod(pw, dtype=_U64)


def block_hashes(parents: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Hashes of blocks given their parent hashes (m,) and token ids (m, page_size):
    raw(child) = raw(parent) * B**ps + sum_j word_j * B**(ps-1-j), hash = mix(raw)."""
    tokens = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
    ps = tokens.shape[1]
    pw = _powers(_BASE, ps)[::-1]  # B**(ps-1) .. B**0
    raw = _unmix(np.asarray(parents, dtype=_U64)) * _U64(pow(_BASE, ps, 1 << 64))
    raw = raw + (_token_words(tokens) * pw[None, :]).sum(axis=1, dtype=_U64)
    return _mix(raw)


def block_hash(parent: int, tokens: bytes) -> int:
    """Chained hash of one full block from its parent hash and its token ids' int64 bytes."""
    toks = np.frombuffer(tokens, dtype=np.int64)
    return int(block_hashes(np.array([parent], dtype=_U64), toks[None, :])[0])


def _ids(token_ids: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(token_ids, dtype=np.int64)


class _Req:
    __slots__ = ("blocks", "final_len", "hashes", "ids", "row", "written")

    def __init__(self, row: int, ids: np.ndarray, final_len: int) -> None:
        self.row = row
        self.ids = ids  # token ids known so far (the prompt, then whatever finish/cache gave)
        self.final_len = final_len
        self.blocks: list[int] = []
        self.hashes: list[int] = []  # hashes of blocks[:len(hashes)], all registered
        self.written = 0


class VLLMBlockPolicy(KVPolicy):
    """vLLM v1 block pool + hash-keyed prefix cache behind the KVPolicy interface."""

    name = "vllm"

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config.capacity, positive_int("page_size", config.page_size))
        self.num_pages = positive_int("kv_tokens // page_size", config.num_pages)
        self.max_context_len = positive_int("max_context_len", config.max_context_len)
        self.req_to_token_pool = ReqToTokenPool(
            config.max_requests, self.max_context_len, config.device
        )
        nb = self.num_pages + 1  # block 0 = null block
        ps = self.page_size
        self._ref = np.zeros(nb, dtype=np.int64)
        # per block: whether it carries a hash, the hash, its parent hash and its token ids
        self._hashed = np.zeros(nb, dtype=bool)
        self._hash = np.zeros(nb, dtype=_U64)
        self._parent = np.zeros(nb, dtype=_U64)
        self._tok = np.zeros((nb, ps), dtype=np.int64)
        # hash index: hash -> oldest block holding it; younger duplicates in _dups, in order
        self._cached: dict[int, int] = {}
        self._dups: dict[int, list[int]] = {}
        # free queue: _q[_qh:_qt] in order, 0 = tombstone; _qpos[b] = index of b or -1
        self._q = np.zeros(2 * nb + 16, dtype=np.int64)
        self._q[: nb - 1] = np.arange(1, nb)
        self._qpos = np.full(nb, -1, dtype=np.int64)
        self._qpos[1:] = np.arange(nb - 1)
        self._qh, self._qt = 0, nb - 1
        self._num_free = nb - 1
        self._num_free_hashed = 0
        # powers of the base for the prefix hash: B**k and B**-k, k < max_context_len + 1
        self._bpow = _powers(_BASE, self.max_context_len + 1)
        self._binv = _powers(_BASE_INV, self.max_context_len + 1)
        self._reqs: dict[int, _Req] = {}
        self._token_source: TokenSource | None = None
        # statistics
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.evicted_blocks = 0

    def set_token_source(self, source: TokenSource | None) -> None:
        """Let decode hash blocks the moment they fill (as vLLM does) by asking `source` for
        output token ids; without one, decode blocks are hashed at cache_prefix/finish."""
        self._token_source = source

    # -- free queue --------------------------------------------------------------------------
    def _q_find(self, m: int) -> np.ndarray:
        """Queue indices of the first m queued blocks (m <= _num_free)."""
        q, h, t = self._q, self._qh, self._qt
        size = m + 64
        while True:
            e = min(h + size, t)
            idx = np.flatnonzero(q[h:e])
            if len(idx) >= m or e == t:
                return idx[:m] + h
            size *= 4

    def _q_peek(self, m: int) -> np.ndarray:
        """The next m blocks a pop would return, head first."""
        return self._q[self._q_find(m)] if m else np.zeros(0, dtype=np.int64)

    def _q_remove(self, blocks: np.ndarray) -> None:
        pos = self._qpos[blocks]
        self._q[pos] = 0
        self._qpos[blocks] = -1
        self._num_free -= len(blocks)

    def _q_append(self, blocks: np.ndarray) -> None:
        k = len(blocks)
        if not k:
            return
        if self._qt + k > len(self._q):  # compact: live entries to the front
            live = self._q[self._qh : self._qt]
            live = live[live != 0]
            n = len(live)
            if n + k > len(self._q):
                self._q = np.zeros(2 * (n + k) + 16, dtype=np.int64)
            self._q[:n] = live
            self._q[n:] = 0
            self._qpos[live] = np.arange(n)
            self._qh, self._qt = 0, n
        t = self._qt
        self._q[t : t + k] = blocks
        self._qpos[blocks] = np.arange(t, t + k)
        self._qt = t + k
        self._num_free += k

    def _pop_free(self, m: int) -> np.ndarray:
        """Pop m blocks off the head (m <= _num_free), evicting the cached ones lazily."""
        if not m:
            return np.zeros(0, dtype=np.int64)
        pos = self._q_find(m)
        blocks = self._q[pos]
        self._q[pos] = 0
        self._qh = int(pos[-1]) + 1
        self._qpos[blocks] = -1
        self._num_free -= m
        ev = blocks[self._hashed[blocks]]
        if len(ev):  # lazy eviction of cached blocks, in pop order
            self._num_free_hashed -= len(ev)
            self.evicted_blocks += len(ev)
            for b, h in zip(ev.tolist(), self._hash[ev].tolist(), strict=True):
                self._drop_hash(b, h)
            self._hashed[ev] = False
        self._ref[blocks] = 1
        return blocks

    # -- hash index ------------------------------------------------------------------------
    def _drop_hash(self, b: int, h: int) -> None:
        cached, dups = self._cached, self._dups
        if cached[h] == b:
            d = dups.get(h)
            if d:
                cached[h] = d.pop(0)
                if not d:
                    del dups[h]
            else:
                del cached[h]
        else:
            d = dups[h]
            d.remove(b)
            if not d:
                del dups[h]

    def _holders(self, h: int) -> list[int]:
        """Blocks indexed under hash h, oldest first."""
        if h not in self._cached:
            return []
        return [self._cached[h], *self._dups.get(h, [])]

    def _chain(self, parent: int, ids: np.ndarray) -> np.ndarray:
        """Chained hashes (uint64) of the len(ids) // page_size full blocks of `ids`, the first
        one's parent hash being `parent`: the prefix hash raw_k = raw0 * B**k +
        sum_{j<k} w_j * B**(k-1-j) at every block end k, as B**(k-1) * (raw0 * B + S_k) with
        S_k = sum_{j<k} w_j * B**-j (uint64 arithmetic wraps mod 2**64)."""
        ps = self.page_size
        m = len(ids) // ps
        if not m:
            return np.zeros(0, dtype=_U64)
        n = m * ps
        s = np.cumsum(_token_words(ids[:n]) * self._binv[:n], dtype=_U64)
        raw0 = int(_unmix(np.array([parent], dtype=_U64))[0]) * _BASE & _MASK
        ends = np.arange(ps - 1, n, ps)
        return _mix(self._bpow[ends] * (s[ends] + _U64(raw0)))

    def _match(self, ids: np.ndarray, nblocks: int) -> tuple[list[int], list[int]]:
        """Cached blocks for the first `nblocks` blocks of `ids`, up to the first miss."""
        if nblocks <= 0 or not self._cached:
            return [], []
        ps = self.page_size
        hs = self._chain(NONE_HASH, ids[: nblocks * ps])
        hl = hs.tolist()
        get = self._cached.get
        first: list[int] = []
        k, step = 0, 32
        while k < nblocks:  # oldest holders up to the first miss, in growing chunks
            chunk = list(map(get, hl[k : k + step]))
            if None in chunk:
                first += chunk[: chunk.index(None)]
                break
            first += chunk
            k += step
            step *= 4
        k = len(first)
        if not k:
            return [], []
        cand = np.array(first[:k], dtype=np.int64)
        parents = np.empty(k, dtype=_U64)
        parents[0] = NONE_HASH
        parents[1:] = hs[: k - 1]
        tok = ids[: k * ps].reshape(k, ps)
        ok = (self._tok[cand] == tok).all(axis=1) & (self._parent[cand] == parents)
        if ok.all():
            return first[:k], hl[:k]
        # a collision with the oldest holder: check the other holders, block by block
        blocks = first[: int(np.argmin(ok))]
        for i in range(len(blocks), k):
            found = None
            for b in self._holders(hl[i]):
                if self._parent[b] == parents[i] and np.array_equal(self._tok[b], tok[i]):
                    found = b
                    break
            if found is None:
                break
            blocks.append(found)
        return blocks, hl[: len(blocks)]

    def _register_full(self, rid: int, req: _Req) -> None:
        """Hash every full block of `req` whose token ids are known."""
        ps = self.page_size
        full = req.written // ps
        done = len(req.hashes)
        if done >= full:
            return
        if len(req.ids) < full * ps and self._token_source is not None:
            have = len(req.ids)
            more = _ids(self._token_source(rid, have, full * ps))
            if len(more) != full * ps - have:
                raise ValueError(
                    f"token source gave {len(more)} ids for positions {have}..{full * ps}"
                )
            req.ids = np.concatenate([req.ids, more])
        full = min(full, len(req.ids) // ps)
        if done >= full:
            return
        parent = req.hashes[-1] if req.hashes else NONE_HASH
        toks = req.ids[done * ps : full * ps]
        hs = self._chain(parent, toks)
        blocks = np.array(req.blocks[done:full], dtype=np.int64)
        self._hashed[blocks] = True
        self._hash[blocks] = hs
        self._parent[blocks[0]] = parent
        self._parent[blocks[1:]] = hs[:-1]
        self._tok[blocks] = toks.reshape(-1, ps)
        hl = hs.tolist()
        cached, dups = self._cached, self._dups
        setdefault = cached.setdefault
        for b, h in zip(blocks.tolist(), hl, strict=True):
            if setdefault(h, b) != b:  # duplicates allowed
                d = dups.get(h)
                if d is None:
                    dups[h] = [b]
                else:
                    d.append(b)
        req.hashes.extend(hl)

    # -- admission -------------------------------------------------------------------------
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        """Whole cached blocks of `token_ids` as given (the caller caps it)."""
        ids = _ids(token_ids)
        blocks, _ = self._match(ids, len(ids) // self.page_size)
        return len(blocks) * self.page_size

    def peek_admission(self, token_ids: np.ndarray) -> PrefixPeek:
        """Hit blocks with no holder sit in the free queue: admission takes them out of it
        (vLLM counts them among the blocks to allocate)."""
        ids = _ids(token_ids)
        blocks, _ = self._match(ids, len(ids) // self.page_size)
        if not blocks:
            return PrefixPeek(0, 0)
        idle = int((self._ref[np.array(blocks, dtype=np.int64)] == 0).sum())
        return PrefixPeek(len(blocks) * self.page_size, idle * self.page_size)

    def reservation(self, prompt_len: int, final_len: int, max_new_tokens: int) -> int:
        self._check_lengths(prompt_len, final_len)
        return 0

    def _check_lengths(self, prompt_len: int, final_len: int) -> None:
        check_request_lengths(prompt_len, final_len, self.max_context_len, min_prompt=1)

    def admit(
        self, rid: int, token_ids: np.ndarray, final_len: int, max_new_tokens: int
    ) -> AdmitResult | None:
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already admitted")
        ids = _ids(token_ids)
        self._check_lengths(len(ids), final_len)
        non_negative_int("max_new_tokens", max_new_tokens)
        row = self.req_to_token_pool.alloc_row()
        if row is None:
            return None
        req = _Req(row, ids, final_len)
        blocks, hashes = self._match(ids, (len(ids) - 1) // self.page_size)
        if blocks:  # touch: take hits off the free queue
            bl = np.array(blocks, dtype=np.int64)
            idle = bl[self._ref[bl] == 0]
            self._q_remove(idle)
            self._num_free_hashed -= len(idle)
            self._ref[bl] += 1
        req.blocks, req.hashes = blocks, hashes
        req.written = cached = len(blocks) * self.page_size
        if cached:
            self._write(req, 0, cached)
        self.queried_tokens += len(ids)
        self.hit_tokens += cached
        self._reqs[rid] = req
        return AdmitResult(row=req.row, cached_len=cached)

    # -- growth ----------------------------------------------------------------------------
    def _req(self, rid: int) -> _Req:
        try:
            return self._reqs[rid]
        except KeyError:
            raise ValueError(f"request {rid} is not admitted") from None

    def _write(self, req: _Req, start: int, end: int) -> None:
        """Page-table entries of positions start..end-1 (their blocks already allocated)."""
        ps = self.page_size
        first = start // ps
        bt = np.asarray(req.blocks[first : cdiv(end, ps)], dtype=np.int64)
        pos = np.arange(start, end, dtype=np.int64)
        self.req_to_token_pool.write_range(req.row, start, bt[pos // ps - first] * ps + pos % ps)

    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        reqs = [self._req(r) for r in rids]
        self.check_extend_args(rids, target_lens, [r.written for r in reqs],
                               self.max_context_len)
        ps = self.page_size
        need = 0
        for req, t in zip(reqs, target_lens, strict=True):
            need += cdiv(int(t), ps) - len(req.blocks)
        if need > self._num_free:
            return False
        new = self._pop_free(need).tolist()
        at = 0
        for rid, req, t in zip(rids, reqs, target_lens, strict=True):
            t = int(t)
            k = cdiv(t, ps) - len(req.blocks)
            if k > 0:
                req.blocks.extend(new[at : at + k])
                at += k
            if t > req.written:
                self._write(req, req.written, t)
                req.written = t
                self._register_full(rid, req)
        return True

    def decode(self, rids: Sequence[int]) -> bool:
        reqs = [self._req(r) for r in rids]
        self.check_distinct("decode", rids)
        written = [r.written for r in reqs]
        self.check_decode_args(rids, written, self.max_context_len)
        ps = self.page_size
        need = 0
        for req, w in zip(reqs, written, strict=True):
            need += w == len(req.blocks) * ps
        if need > self._num_free:
            return False
        if not reqs:
            return True
        new = iter(self._pop_free(need).tolist())
        slots = []
        for req in reqs:
            w = req.written
            if w == len(req.blocks) * ps:
                req.blocks.append(next(new))
            slots.append(req.blocks[w // ps] * ps + w % ps)
            req.written = w + 1
        self.req_to_token_pool.write_at(
            np.array([r.row for r in reqs], dtype=np.int64), np.array(written, dtype=np.int64),
            np.array(slots, dtype=np.int64))
        for rid, req in zip(rids, reqs, strict=True):
            if req.written % ps == 0:
                self._register_full(rid, req)
        return True

    def decode_profile(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """Breakdown after each of the next n decode steps, without changing anything. New
        blocks come off the free-queue head in order; a hashed one popped there is a lazy
        eviction, so `cached` (not `free`) shrinks by that block."""
        reqs = [self._req(r) for r in rids]
        ps = self.page_size
        w = np.array([r.written for r in reqs], dtype=np.int64)
        final = np.array([r.final_len for r in reqs], dtype=np.int64)
        a0 = np.array([len(r.blocks) * ps for r in reqs], dtype=np.int64)
        out, new_slots = page_growth_profile(self.breakdown(head_reservation), w, final, a0, ps, n)
        new_blocks = new_slots // ps
        ahead = self._q_peek(int(new_blocks[-1]) if n else 0)
        hashed = np.zeros(len(ahead) + 1, dtype=np.int64)
        np.cumsum(self._hashed[ahead], out=hashed[1:])
        evicted = hashed[new_blocks] * ps  # hashed blocks popped: cache, not free, pays
        out[:, PARTS.index("cached")] -= evicted
        out[:, PARTS.index("free")] += evicted
        return out

    def decode_cost(self, rids: Sequence[int], n: int) -> int:
        ps = self.page_size
        total = 0
        for rid in rids:
            req = self._req(rid)
            total += max(-(-(req.written + n) // ps) - len(req.blocks), 0)
        return total * ps

    def decode_room(self, rid: int) -> int:
        req = self._req(rid)
        return len(req.blocks) * self.page_size - req.written

    # -- ending ----------------------------------------------------------------------------
    def _learn_ids(self, req: _Req, token_ids: np.ndarray) -> None:
        ids = _ids(token_ids)
        if len(ids) > len(req.ids):
            req.ids = ids

    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        req = self._req(rid)
        self._learn_ids(req, token_ids)
        self._register_full(rid, req)

    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        req = self._req(rid)
        self._learn_ids(req, token_ids)
        self._register_full(rid, req)
        self.release(rid)

    def release(self, rid: int) -> None:
        req = self._req(rid)
        bl = np.array(req.blocks[::-1], dtype=np.int64)  # chain tail first: evicted first
        ref = self._ref
        ref[bl] -= 1
        idle = bl[ref[bl] == 0]
        self._q_append(idle)
        self._num_free_hashed += int(np.count_nonzero(self._hashed[idle]))
        self.req_to_token_pool.free_row(req.row)
        del self._reqs[rid]

    # -- observation -----------------------------------------------------------------------
    def written(self, rid: int) -> int:
        return self._req(rid).written

    def available_tokens(self) -> int:
        return self._num_free * self.page_size

    def evictable_tokens(self) -> int:
        return self._num_free_hashed * self.page_size

    def fresh_tokens(self) -> int:
        """Cached blocks sit in the free queue among plain free ones and a pop takes the head
        whatever it holds: the plain free blocks ahead of the first cached one."""
        if not self._num_free_hashed:
            return self._num_free * self.page_size
        hashed = self._hashed[self._q_peek(self._num_free)]
        return int(hashed.argmax()) * self.page_size

    def cached_block_ids(self) -> list[int]:
        """Free-queue blocks that still carry a hash, head (next evicted) first."""
        q = self._q_peek(self._num_free)
        return q[self._hashed[q]].tolist()

    def block_ids(self, rid: int) -> list[int]:
        return list(self._req(rid).blocks)

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        """Owned blocks split into token_states (shared full blocks once), reserved and rounding
        (a live request's partial last block); cached = hashed free blocks; no external
        fragmentation: any free block serves."""
        non_negative_int("head_reservation", head_reservation)
        ps = self.page_size
        owned = self.num_pages - self._num_free
        tokens = owned * ps
        reserved = rounding = 0
        for r in self._reqs.values():
            w = r.written
            if w % ps:
                end = len(r.blocks) * ps
                tokens -= end - w
                fin = r.final_len
                reserved += max(min(end, fin) - w, 0)
                rounding += max(end - max(fin, w), 0)
        return MemoryBreakdown.for_pages(
            self.capacity,
            token_states=tokens,
            cached=self._num_free_hashed * ps,
            reserved=reserved,
            rounding=rounding,
            free=(self._num_free - self._num_free_hashed) * ps,
        )

    def page_table_entries(self) -> int:
        return sum(len(r.blocks) for r in self._reqs.values())

    def check_invariants(self) -> None:
        nb = self.num_pages + 1
        self.req_to_token_pool.check_invariants()
        # free queue
        q, h, t = self._q, self._qh, self._qt
        if not 0 <= h <= t <= len(q) or q[:h].any() or q[t:].any():
            raise InvariantError("vllm: free queue holds blocks outside its head..tail window")
        live_pos = np.flatnonzero(q[h:t]) + h
        live = q[live_pos]
        if ((live < 1) | (live >= nb)).any() or len(np.unique(live)) != len(live):
            raise InvariantError("vllm: free queue has a bad or repeated block")
        if len(live) != self._num_free:
            raise InvariantError("vllm: free queue length out of sync")
        queued = np.zeros(nb, dtype=bool)
        queued[live] = True
        want_pos = np.full(nb, -1, dtype=np.int64)
        want_pos[live] = live_pos
        if not np.array_equal(self._qpos, want_pos):
            raise InvariantError("vllm: free queue positions out of sync")
        # ref counts = live holders
        holders = np.zeros(nb, dtype=np.int64)
        for rid, r in self._reqs.items():
            if len(set(r.blocks)) != len(r.blocks) or 0 in r.blocks:
                raise InvariantError(f"vllm: request {rid} holds a block twice or the null block")
            if len(r.blocks) != cdiv(r.written, self.page_size):
                raise InvariantError(f"vllm: request {rid} has blocks beyond its written tokens")
            if len(r.hashes) > r.written // self.page_size:
                raise InvariantError(f"vllm: request {rid} hashed a partial block")
            holders[r.blocks] += 1
            hb = np.array(r.blocks[: len(r.hashes)], dtype=np.int64)
            if not (self._hashed[hb].all() and self._hash[hb].tolist() == r.hashes):
                raise InvariantError(f"vllm: request {rid} has a block that lost its hash")
        for b in np.flatnonzero(self._ref != holders).tolist():
            raise InvariantError(f"vllm: block {b} ref {self._ref[b]} != holders {holders[b]}")
        for b in np.flatnonzero((self._ref[1:] == 0) != queued[1:]).tolist():
            raise InvariantError(f"vllm: block {b + 1} free-queue membership wrong")
        for b in np.flatnonzero((self._ref > 1) & ~self._hashed).tolist():
            raise InvariantError(f"vllm: unhashed block {b} is shared")
        if self._ref[0] != 0 or queued[0] or self._hashed[0]:
            raise InvariantError("vllm: the null block was handed out")
        # hash index
        hashed = np.flatnonzero(self._hashed)
        indexed: list[int] = []
        for hv, first in self._cached.items():
            for b in [first, *self._dups.get(hv, [])]:
                if not self._hashed[b] or int(self._hash[b]) != hv:
                    raise InvariantError(f"vllm: block {b} indexed under the wrong hash")
                indexed.append(b)
        if any(not d for d in self._dups.values()) or not set(self._dups) <= set(self._cached):
            raise InvariantError("vllm: empty or orphaned duplicate list in the hash index")
        if sorted(indexed) != hashed.tolist():
            raise InvariantError("vllm: hash index out of sync with block hashes")
        if len(hashed) and not np.array_equal(
            block_hashes(self._parent[hashed], self._tok[hashed]), self._hash[hashed]
        ):
            raise InvariantError("vllm: a block's hash does not match its parent and tokens")
        if self._num_free_hashed != int(np.count_nonzero(self._hashed & queued)):
            raise InvariantError("vllm: cached-block counter out of sync")
        # page table
        ps = self.page_size
        table = self.req_to_token_pool.req_to_token
        for rid, r in self._reqs.items():
            pos = torch.arange(r.written)
            bt = torch.tensor(r.blocks, dtype=torch.int64)
            want = (bt[pos // ps] * ps + pos % ps).to(torch.int32) if r.written else pos.int()
            if not torch.equal(table[r.row, : r.written].cpu(), want):
                raise InvariantError(f"vllm: page-table row of request {rid} is wrong")
        self.breakdown(self.max_context_len).check_invariants()
        if self.num_pages * ps != self.capacity:
            raise InvariantError("vllm: capacity is not num_pages * page_size")


@register_policy(
    "vllm",
    when="compare with vLLM v1: paged blocks, prefix caching of full blocks via chained hashes",
)
def _make_vllm(config: PolicyConfig) -> KVPolicy:
    return VLLMBlockPolicy(config)
