"""The `vllm` policy: vLLM v1's block pool with hash-chained prefix caching.

Modelled on the design of vLLM v1's KV cache manager (a re-implementation, not a copy):

* A pool of `num_pages` usable blocks of `page_size` slots, ids 1..num_pages; block 0 is the
  null placeholder (the dummy page of kvsim's address space) and is never handed out, so the
  capacity is `num_pages * page_size` like the paged policies.
* Free blocks sit in one queue, an intrusive doubly linked list (prev/next int arrays with a
  fake head and tail) with O(1) popleft, append and remove. Allocation pops from the head.
* Only full blocks are cached. A full block is keyed by a chained hash of (parent block's hash,
  the block's token ids) (blake2b, 8 bytes: deterministic across runs). The block keeps its
  key, so a hash collision is detected by comparing keys and never yields a wrong hit.
  A block is hashed as soon as it is full and its token ids are known: prompt blocks during
  prefill; decode blocks during decode when a token source is set (`set_token_source`),
  otherwise at `cache_prefix` / `finish`, whose `token_ids` cover every written token.
* Blocks are ref-counted; a block with count 0 goes to the tail of the free queue still hashed
  (cached, reusable). Popping a hashed block for a new allocation drops its hash: eviction is
  lazy, LRU. A request's blocks are freed in reverse order, so the tail of a chain (the longest,
  least shareable prefix) is evicted first.
* The same content may be cached in two blocks (block tables are append-only): duplicates are
  allowed, the hash maps to every block holding it.
* A lookup matches whole blocks of `prompt[:P-1]`: the last prompt token is always recomputed
  to get logits, so a block-aligned prompt recomputes its last block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from hashlib import blake2b
from itertools import pairwise

import numpy as np
import torch

from kvcore.policies.base import (
    PARTS,
    AdmitResult,
    KVPolicy,
    MemoryBreakdown,
    PolicyConfig,
    register_policy,
)
from kvcore.req_to_token_pool import ReqToTokenPool
from kvcore.validation import InvariantError, cdiv, non_negative_int, positive_int

#: parent hash of a request's first block
NONE_HASH = 0

#: (rid, start, end) -> token ids of positions start..end-1 of that request
TokenSource = Callable[[int, int, int], np.ndarray]


def block_hash(parent: int, tokens: bytes) -> int:
    """Chained hash of one full block: 8 bytes of blake2b over (parent hash, token bytes)."""
    h = blake2b(parent.to_bytes(8, "little"), digest_size=8)
    h.update(tokens)
    return int.from_bytes(h.digest(), "little")


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
        self._table = self.req_to_token_pool.req_to_token
        nb = self.num_pages + 1  # block 0 = null block
        self._ref = [0] * nb
        self._hash: list[int | None] = [None] * nb
        self._key: list[tuple[int, bytes] | None] = [None] * nb  # (parent hash, token bytes)
        self._cached: dict[int, dict[int, None]] = {}  # hash -> block ids holding it
        # free queue: nodes 0..nb-1 are blocks, HEAD/TAIL are the fake ends; -1 = not queued
        self._head, self._tail = nb, nb + 1
        self._prev = [-1] * (nb + 2)
        self._next = [-1] * (nb + 2)
        order = [self._head, *range(1, nb), self._tail]
        for a, b in pairwise(order):
            self._next[a] = b
            self._prev[b] = a
        self._num_free = nb - 1
        self._num_free_hashed = 0
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

    # -- free queue (O(1)) -----------------------------------------------------------------
    def _q_remove(self, b: int) -> None:
        p, n = self._prev[b], self._next[b]
        self._next[p] = n
        self._prev[n] = p
        self._prev[b] = self._next[b] = -1
        self._num_free -= 1

    def _q_append(self, b: int) -> None:
        last = self._prev[self._tail]
        self._next[last] = b
        self._prev[b] = last
        self._next[b] = self._tail
        self._prev[self._tail] = b
        self._num_free += 1

    def _pop_free(self) -> int:
        b = self._next[self._head]
        self._q_remove(b)
        if self._hash[b] is not None:  # lazy eviction of a cached block
            self._num_free_hashed -= 1
            self._drop_hash(b)
            self.evicted_blocks += 1
        self._ref[b] = 1
        return b

    # -- hash index ------------------------------------------------------------------------
    def _drop_hash(self, b: int) -> None:
        h = self._hash[b]
        holders = self._cached[h]
        del holders[b]
        if not holders:
            del self._cached[h]
        self._hash[b] = None
        self._key[b] = None

    def _lookup(self, h: int, key: tuple[int, bytes]) -> int | None:
        holders = self._cached.get(h)
        if holders:
            for b in holders:
                if self._key[b] == key:
                    return b
        return None

    def _match(self, ids: np.ndarray, nblocks: int) -> tuple[list[int], list[int]]:
        """Cached blocks for the first `nblocks` blocks of `ids`, up to the first miss."""
        ps = self.page_size
        blocks: list[int] = []
        hashes: list[int] = []
        parent = NONE_HASH
        for i in range(nblocks):
            key = (parent, ids[i * ps : (i + 1) * ps].tobytes())
            h = block_hash(*key)
            b = self._lookup(h, key)
            if b is None:
                break
            blocks.append(b)
            hashes.append(h)
            parent = h
        return blocks, hashes

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
        parent = req.hashes[-1] if req.hashes else NONE_HASH
        ids = req.ids
        for i in range(done, full):
            b = req.blocks[i]
            key = (parent, ids[i * ps : (i + 1) * ps].tobytes())
            h = block_hash(*key)
            self._hash[b] = h
            self._key[b] = key
            self._cached.setdefault(h, {})[b] = None  # duplicates allowed
            req.hashes.append(h)
            parent = h

    # -- admission -------------------------------------------------------------------------
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        """Whole cached blocks of `token_ids` as given (the caller caps it)."""
        ids = _ids(token_ids)
        blocks, _ = self._match(ids, len(ids) // self.page_size)
        return len(blocks) * self.page_size

    def reservation(self, prompt_len: int, final_len: int, max_new_tokens: int) -> int:
        self._check_lengths(prompt_len, final_len)
        return 0

    def _check_lengths(self, prompt_len: int, final_len: int) -> None:
        positive_int("prompt_len", prompt_len)
        positive_int("final_len", final_len)
        if final_len < prompt_len:
            raise ValueError(f"final_len must be >= prompt_len {prompt_len}, got {final_len}")
        if final_len > self.max_context_len:
            raise ValueError(
                f"final_len must be <= max_context_len {self.max_context_len}, got {final_len}"
            )

    def admit(
        self, rid: int, token_ids: np.ndarray, final_len: int, max_new_tokens: int
    ) -> AdmitResult | None:
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already admitted")
        ids = _ids(token_ids)
        self._check_lengths(len(ids), final_len)
        non_negative_int("max_new_tokens", max_new_tokens)
        rows = self.req_to_token_pool.alloc(1)
        if rows is None:
            return None
        req = _Req(rows[0], ids, final_len)
        blocks, hashes = self._match(ids, (len(ids) - 1) // self.page_size)
        for b in blocks:  # touch: take hits off the free queue
            if self._ref[b] == 0:
                self._q_remove(b)
                self._num_free_hashed -= 1
            self._ref[b] += 1
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
        slots = bt[pos // ps - first] * ps + pos % ps
        self._table[req.row, start:end] = torch.from_numpy(slots).to(torch.int32)

    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        if len(rids) != len(target_lens):
            raise ValueError(
                f"rids and target_lens differ in length: {len(rids)} != {len(target_lens)}"
            )
        reqs = [self._req(r) for r in rids]
        if len(set(rids)) != len(reqs):
            raise ValueError("extend got the same request twice")
        ps = self.page_size
        need = 0
        for rid, req, t in zip(rids, reqs, target_lens, strict=True):
            if t < req.written:
                raise ValueError(f"target_len {t} of request {rid} is below written {req.written}")
            if t > self.max_context_len:
                raise ValueError(
                    f"target_len {t} of request {rid} exceeds max_context_len "
                    f"{self.max_context_len}"
                )
            need += cdiv(int(t), ps) - len(req.blocks)
        if need > self._num_free:
            return False
        for rid, req, t in zip(rids, reqs, target_lens, strict=True):
            t = int(t)
            for _ in range(cdiv(t, ps) - len(req.blocks)):
                req.blocks.append(self._pop_free())
            if t > req.written:
                self._write(req, req.written, t)
                req.written = t
                self._register_full(rid, req)
        return True

    def decode(self, rids: Sequence[int]) -> bool:
        reqs = [self._req(r) for r in rids]
        if len(set(rids)) != len(reqs):
            raise ValueError("decode got the same request twice")
        ps = self.page_size
        need = 0
        for rid, req in zip(rids, reqs, strict=True):
            if req.written >= self.max_context_len:
                raise ValueError(f"decode of request {rid} exceeds max_context_len")
            need += req.written == len(req.blocks) * ps
        if need > self._num_free:
            return False
        if not reqs:
            return True
        rows, pos, slots = [], [], []
        for req in reqs:
            w = req.written
            if w == len(req.blocks) * ps:
                req.blocks.append(self._pop_free())
            rows.append(req.row)
            pos.append(w)
            slots.append(req.blocks[w // ps] * ps + w % ps)
            req.written = w + 1
        self._table[torch.tensor(rows), torch.tensor(pos)] = torch.tensor(slots, dtype=torch.int32)
        for rid, req in zip(rids, reqs, strict=True):
            if req.written % ps == 0:
                self._register_full(rid, req)
        return True

    def decode_profile(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """Breakdown after each of the next n decode steps, without changing anything. New
        blocks come off the free-queue head in order; a hashed one popped there is a lazy
        eviction, so `cached` (not `free`) shrinks by that block."""
        b = self.breakdown(head_reservation)
        base = np.array([b.parts()[p] for p in PARTS], dtype=np.int64)
        reqs = [self._req(r) for r in rids]
        ps = self.page_size
        w = np.array([r.written for r in reqs], dtype=np.int64)
        final = np.array([r.final_len for r in reqs], dtype=np.int64)
        a0 = np.array([len(r.blocks) * ps for r in reqs], dtype=np.int64)
        wj = w[None, :] + np.arange(1, n + 1, dtype=np.int64)[:, None]
        aj = np.maximum(a0[None, :], -(-wj // ps) * ps)
        new_blocks = ((aj - a0[None, :]) // ps).sum(axis=1)
        hashed, blk = [0], self._next[self._head]
        for _ in range(int(new_blocks[-1]) if n else 0):
            hashed.append(hashed[-1] + (self._hash[blk] is not None))
            blk = self._next[blk]
        evicted = np.array(hashed, dtype=np.int64)[new_blocks]
        res0 = np.clip(np.minimum(a0, final) - w, 0, None).sum()
        rnd0 = np.clip(a0 - np.maximum(final, w), 0, None).sum()
        out = np.repeat(base[None, :], n, axis=0)
        out[:, 0] += np.arange(1, n + 1) * len(reqs)
        out[:, 1] -= evicted * ps
        out[:, 2] += np.clip(np.minimum(aj, final) - wj, 0, None).sum(axis=1) - res0
        out[:, 3] += np.clip(aj - np.maximum(final, wj), 0, None).sum(axis=1) - rnd0
        out[:, 5] -= (new_blocks - evicted) * ps
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
        for b in reversed(req.blocks):  # chain tail first: evicted first
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._q_append(b)
                if self._hash[b] is not None:
                    self._num_free_hashed += 1
        self.req_to_token_pool.free(req.row)
        del self._reqs[rid]

    # -- observation -----------------------------------------------------------------------
    def written(self, rid: int) -> int:
        return self._req(rid).written

    def available_tokens(self) -> int:
        return self._num_free * self.page_size

    def evictable_tokens(self) -> int:
        return self._num_free_hashed * self.page_size

    def cached_block_ids(self) -> list[int]:
        """Free-queue blocks that still carry a hash, head (next evicted) first."""
        out, b = [], self._next[self._head]
        while b != self._tail:
            if self._hash[b] is not None:
                out.append(b)
            b = self._next[b]
        return out

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
        free = (self._num_free - self._num_free_hashed) * ps
        return MemoryBreakdown(
            capacity=self.capacity,
            token_states=tokens,
            cached=self._num_free_hashed * ps,
            reserved=reserved,
            over_reservation=0,
            rounding=rounding,
            external=0,
            free=free,
            largest_free_hole=free,
            failed_allocs=0,
        )

    def page_table_entries(self) -> int:
        return sum(len(r.blocks) for r in self._reqs.values())

    def check_invariants(self) -> None:
        nb = self.num_pages + 1
        self.req_to_token_pool.check_invariants()
        # free queue walk
        seen: set[int] = set()
        b, prev = self._next[self._head], self._head
        while b != self._tail:
            if b in seen or not 1 <= b < nb:
                raise InvariantError(f"vllm: free queue has a bad or repeated block {b}")
            if self._prev[b] != prev:
                raise InvariantError(f"vllm: free queue back link broken at block {b}")
            seen.add(b)
            prev, b = b, self._next[b]
        if self._prev[self._tail] != prev or len(seen) != self._num_free:
            raise InvariantError("vllm: free queue tail or length out of sync")
        # ref counts = live holders
        holders = [0] * nb
        for rid, r in self._reqs.items():
            if len(set(r.blocks)) != len(r.blocks) or 0 in r.blocks:
                raise InvariantError(f"vllm: request {rid} holds a block twice or the null block")
            if len(r.blocks) != cdiv(r.written, self.page_size):
                raise InvariantError(f"vllm: request {rid} has blocks beyond its written tokens")
            if len(r.hashes) > r.written // self.page_size:
                raise InvariantError(f"vllm: request {rid} hashed a partial block")
            for i, b in enumerate(r.blocks):
                holders[b] += 1
                if i < len(r.hashes) and self._hash[b] != r.hashes[i]:
                    raise InvariantError(f"vllm: request {rid} block {b} lost its hash")
        for b in range(1, nb):
            if self._ref[b] != holders[b]:
                raise InvariantError(f"vllm: block {b} ref {self._ref[b]} != holders {holders[b]}")
            if (self._ref[b] == 0) != (b in seen):
                raise InvariantError(f"vllm: block {b} free-queue membership wrong")
            if self._ref[b] > 1 and self._hash[b] is None:
                raise InvariantError(f"vllm: unhashed block {b} is shared")
        if self._ref[0] != 0 or 0 in seen:
            raise InvariantError("vllm: the null block was handed out")
        # hash index
        hashed = {b for b in range(1, nb) if self._hash[b] is not None}
        indexed = set()
        for h, bs in self._cached.items():
            for b in bs:
                if self._hash[b] != h or block_hash(*self._key[b]) != h:
                    raise InvariantError(f"vllm: block {b} indexed under the wrong hash")
                indexed.add(b)
        if indexed != hashed:
            raise InvariantError("vllm: hash index out of sync with block hashes")
        if self._num_free_hashed != len(hashed & seen):
            raise InvariantError("vllm: cached-block counter out of sync")
        # page table
        ps = self.page_size
        for rid, r in self._reqs.items():
            pos = torch.arange(r.written)
            bt = torch.tensor(r.blocks, dtype=torch.int64)
            want = (bt[pos // ps] * ps + pos % ps).to(torch.int32) if r.written else pos.int()
            if not torch.equal(self._table[r.row, : r.written], want):
                raise InvariantError(f"vllm: page-table row of request {rid} is wrong")
        bd = self.breakdown(self.max_context_len)
        bd.check()
        if self.num_pages * ps != self.capacity:
            raise InvariantError("vllm: capacity is not num_pages * page_size")


@register_policy(
    "vllm",
    when="compare with vLLM v1: paged blocks, prefix caching of full blocks via chained hashes",
)
def _make_vllm(config: PolicyConfig) -> KVPolicy:
    return VLLMBlockPolicy(config)
