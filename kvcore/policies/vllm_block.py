"""The `vllm` policy: vLLM v1's KV cache manager over a `BlockPool` (kvcore/block_pool.py).

Like `paged` (PagedAllocator + RadixCache), this is a thin policy over two structures: the
block pool (ref counts, free queue, prefix index; lazy LRU eviction) and the block hash chain
(kvcore/block_hash.py). What belongs to the manager, and so lives here:

* Per request the block table (`blocks`), the hashes of its full blocks, and its page-table
  row, written through `ReqToTokenPool`.
* A block is hashed as soon as it is full and its token ids are known: prompt blocks during
  prefill; decode blocks at `cache_prefix` / `finish`, whose `token_ids` cover every written
  token, or during decode when ids beyond the written tokens are already known (a
  re-admission after preemption; tests hand output ids in as vLLM hashes them, by a subclass
  in tests/kvcore/test_vllm_block.py).
* A lookup matches whole blocks of `prompt[:P-1]`: the last prompt token is always recomputed
  to get logits, so a block-aligned prompt recomputes its last block. Hits are touched (ref
  count + 1, out of the free queue when idle).
* Freeing hands the request's blocks to the pool in reverse order, so a chain's tail (the
  longest, least shareable prefix) is evicted first.

Capacity is `num_pages * page_size` like the paged policies (block 0 is the null block).
Per request: len(blocks) == ceil(written / page_size), and its row holds
`blocks[p // ps] * ps + p % ps` at every written position p.

Speed: at page size 1 every token is a block, so nothing here walks blocks in Python. A
request's block table is a numpy array (grown by doubling; at page size 1 with the page table
on the host, its page-table row itself: `_RowReq`), its full blocks' hashes one array
hashed once (`chain`; registering blocks slices it), and prompts asked about repeatedly
before admission are hashed once, compared only as far as a lookup's answer reads them,
and looked up again only when the cache changed under them (`ChainMemo`,
kvcore/chain_memo.py; a hit's generations are not re-read when no block was evicted since;
admission takes the entry out; a request released in the middle of its prefill hands its
chain back); an iteration's prefill chunks are cached in one call (`extend`), a stretch
of decode steps pops its blocks in one batch (`decode_steps`). With the pool's run-based
prefix index (kvcore/chain_index.py) this keeps `vllm` within 3x of `paged` at every page
size (benchmarks/bench_policies.py, docs/performance.md) with the same blocks hit, evicted
and freed in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvcore.block_hash import NONE_HASH, ChainHasher
from kvcore.block_pool import BlockPool
from kvcore.breakdown import PARTS, MemoryBreakdown, page_growth_profile, pages_at_steps
from kvcore.chain_memo import ChainEntry, ChainMemo
from kvcore.policies.base import AdmitResult, PolicyConfig, PrefixPeek
from kvcore.policies.capabilities import DecodeStretch, PrefixCache
from kvcore.policies.vllm_checks import check_admit_hits, check_block_policy
from kvcore.policies.vllm_grow import grow_tokens
from kvcore.policies.vllm_request import _ids, _Req, _RowReq
from kvcore.req_to_token_pool import ReqToTokenPool
from kvcore.validation import (
    InvariantError,
    cdiv,
    check_request_lengths,
    non_negative_int,
    positive_int,
)

_CACHED, _FREE = PARTS.index("cached"), PARTS.index("free")


_NO_BLOCKS = np.zeros(0, dtype=np.int64)


class VLLMBlockPolicy(PrefixCache, DecodeStretch):
    """vLLM v1 block pool + hash-keyed prefix cache behind the KVPolicy interface."""

    name = "vllm"

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config.capacity, positive_int("page_size", config.page_size))
        self.num_pages = positive_int("kv_tokens // page_size", config.num_pages)
        self.max_context_len = positive_int("max_context_len", config.max_context_len)
        self.req_to_token_pool = ReqToTokenPool(
            config.max_requests, self.max_context_len, config.device
        )
        self.pool = BlockPool(self.num_pages, self.page_size)
        self.hasher = ChainHasher(self.page_size, self.max_context_len)
        self.memo = ChainMemo(self.hasher)
        self._offsets = np.arange(self.page_size, dtype=np.int64)  # slots within a block
        # at page size 1 with the page table on the host, a request's block table is its
        # page-table row (kvcore/policies/vllm_request.py `_RowReq`): no second copy to write
        self._table = self.req_to_token_pool.host if self.page_size == 1 else None
        self._reqs: dict[int, _Req] = {}
        # per admitted request: its admission hit's length and where that lookup ended at a
        # miss (the index's newest caching then, or -1), handed to the memo at a release
        self._admit_hits: dict[int, tuple[int, int]] = {}
        # statistics
        self.hit_tokens = 0

    # -- hashing -----------------------------------------------------------------------------
    def _match(self, ids: np.ndarray, nblocks: int) -> np.ndarray:
        """Cached blocks for the first `nblocks` blocks of `ids`, up to the first miss."""
        if nblocks <= 0 or not self.pool.index.num_live:
            return _NO_BLOCKS
        known = self.memo.recall(ids, nblocks)
        if known is not None:  # tokens compared after, as far as the answer reads them
            hit = self._hit(*known, ids)
            if self.memo.confirm(known[0], ids, min(len(hit) + 1, nblocks)):
                return hit
        e, hashes = self.memo.chain(ids, nblocks)  # (a rewritten buffer: hashed afresh)
        return self._hit(e, hashes, ids)

    def _hit(self, e: ChainEntry, hashes: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The lookup of `_match` for the memo entry `e` of `ids` and its first hashes."""
        pool = self.pool
        known = e.hit
        hit = pool.longest_cache_hit(hashes, ids, known, e.gens, e.at, e.evicted)
        if hit is not known:  # (the same array: still indexed under the same generations)
            # a cut of the known hit (a view of its first blocks) keeps their generations
            cut = len(hit) <= len(known) and (not len(hit) or
                                              hit.ctypes.data == known.ctypes.data)
            e.hit, e.gens = hit, e.gens[: len(hit)] if cut else pool.gen[hit]
        e.evicted = pool.evicted_blocks
        e.at = pool.index.newest if len(hit) < len(hashes) else -1
        return hit

    def _register_full(self, req: _Req) -> None:
        """Hash every full block of `req` whose token ids are known."""
        run = self._full_run(req)
        if run is not None:
            self.pool.cache_full_blocks(*run)

    def _new_req(self, row: int, ids: np.ndarray, final_len: int) -> _Req:
        if self._table is not None:
            return _RowReq(row, ids, final_len, self.req_to_token_pool)
        return _Req(row, ids, final_len, self.page_size)

    def _full_run(self, req: _Req) -> tuple[np.ndarray, np.ndarray, int, np.ndarray, int,
                                            int] | None:
        """The arguments of `cache_full_blocks` for the full blocks of `req` not hashed yet
        whose token ids are known (hashing only those), marked hashed; None if none."""
        ps = self.page_size
        full = min(req.written, len(req.ids)) // ps
        done = req.nhashed
        if done >= full:
            return None
        self._hash_to(req, full)
        parent, after = (int(req.chain[done - 1]), req.block_at(done - 1)) if done \
            else (NONE_HASH, 0)
        req.nhashed = full
        return (req.block_slice(done, full), req.chain[done:full], parent,
                req.ids[done * ps : full * ps].reshape(-1, ps), done, after)

    # -- admission -------------------------------------------------------------------------
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        """Whole cached blocks of `token_ids` as given (the caller caps it)."""
        ids = _ids(token_ids)
        return len(self._match(ids, len(ids) // self.page_size)) * self.page_size

    def peek_admission(self, token_ids: np.ndarray) -> PrefixPeek:
        """Hit blocks with no holder sit in the free queue: admission takes them out of it
        (vLLM counts them among the blocks to allocate)."""
        ids = _ids(token_ids)
        blocks = self._match(ids, len(ids) // self.page_size)
        if not len(blocks):
            return PrefixPeek(0, 0)
        idle = int(np.count_nonzero(self.pool.ref_cnt[blocks] == 0))
        return PrefixPeek(len(blocks) * self.page_size, idle * self.page_size)

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
        ps = self.page_size
        req = self._new_req(row, ids, final_len)
        # the prompt's chain (kept by the request) and the lookup of all but its last token
        # in one memo visit, which takes the entry out: its tokens are compared once
        e, chain = self.memo.take(ids, len(ids) // ps)
        m = (len(ids) - 1) // ps
        blocks = self._hit(e, chain[:m], ids) if m > 0 and self.pool.index.num_live \
            else _NO_BLOCKS
        if len(blocks):
            self.pool.touch(blocks)
        self._admit_hits[rid] = (len(blocks), e.at)
        req.add_blocks(blocks)
        req.chain, req.nhashed = chain, len(blocks)
        req.written = cached = len(blocks) * ps
        if cached:
            self._write(req, 0, cached)
        self.hit_tokens += cached
        self._reqs[rid] = req
        return AdmitResult(row=req.row, cached_len=cached)

    # -- growth ----------------------------------------------------------------------------
    def _req(self, rid: int) -> _Req:
        try:
            return self._reqs[rid]
        except KeyError:
            raise ValueError(f"request {rid} is not admitted") from None

    def _reqs_of(self, rids: Sequence[int]) -> list[_Req]:
        """`_req` of each, one dict read each (an unknown one raises as `_req` does)."""
        try:
            reqs = self._reqs
            return [reqs[r] for r in rids]
        except KeyError:
            return [self._req(r) for r in rids]

    def _write(self, req: _Req, start: int, end: int) -> None:
        """Page-table entries of positions start..end-1 (their blocks already allocated)."""
        ps = self.page_size
        if ps == 1:  # a block per token: the slots are the blocks
            if self._table is None:  # (else the row is the block table: already written)
                self.req_to_token_pool.write_range(req.row, start, req.block_slice(start, end))
            return
        first = start // ps
        bt = req.block_slice(first, cdiv(end, ps))
        slots = (bt[:, None] * ps + self._offsets).ravel()  # every slot of those blocks
        self.req_to_token_pool.write_range(req.row, start,
                                           slots[start - first * ps : end - first * ps])

    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        """One engine iteration's prefill chunks: the blocks popped in one call, and the
        newly full blocks of every request cached in one call (`BlockPool.cache_runs`: each
        request still its own caching, in request order). With small chunks
        (`--chunked-prefill-size 64`) an iteration extends about ten requests by a few dozen
        blocks each, so what counts is the work per request, not per block."""
        reqs = self._reqs_of(rids)
        self.check_extend_args(rids, target_lens, [r.written for r in reqs],
                               self.max_context_len)
        ts = [int(t) for t in target_lens]
        ps = self.page_size
        need = sum(-(-t // ps) for t in ts) - sum(r.nblocks for r in reqs)
        if need > self.pool.get_num_free_blocks():
            return False
        new = self.pool.get_new_blocks(need)
        if ps == 1:  # a block per token: kvcore/policies/vllm_grow.py, per request-chunk
            args = grow_tokens(reqs, ts, new, self._hash_to, self.req_to_token_pool)
            if args is not None:
                self.pool.cache_runs(*args)
            return True
        at = 0
        runs: list[tuple[int, int, int, int]] = []  # (length, parent, start, after) each
        parts: list[tuple[_Req, int, int]] = []  # (request, first, end) of each run's blocks
        for req, t in zip(reqs, ts, strict=True):
            w = req.written
            if t <= w:
                continue
            k = -(-t // ps) - req.nblocks
            if k > 0:
                req.add_blocks(new[at : at + k])
                at += k
            self._write(req, w, t)
            req.written = t
            full = min(t, len(req.ids)) // ps
            done = req.nhashed
            if full > done:
                if len(req.chain) < full:
                    self._hash_to(req, full)
                runs.append((full - done, req.chain.item(done - 1) if done else NONE_HASH,
                             done, req.block_at(done - 1) if done else 0))
                parts.append((req, done, full))
                req.nhashed = full
        if len(parts) == 1:
            req, d, f = parts[0]
            self.pool.cache_runs(req.block_slice(d, f), req.chain[d:f],
                                 req.ids[d * ps : f * ps].reshape(-1, ps), runs)
        elif runs:
            every = np.concatenate([r.block_slice(d, f) for r, d, f in parts])
            hashes = np.concatenate([r.chain[d:f] for r, d, f in parts])
            tokens = np.concatenate([r.ids[d * ps : f * ps] for r, d, f in parts])
            self.pool.cache_runs(every, hashes, tokens.reshape(-1, ps), runs)
        return True

    def _hash_to(self, req: _Req, full: int) -> None:
        """Extend `req.chain` to its first `full` blocks (ids known), hashing only the new."""
        have = len(req.chain)
        if have < full:
            ps = self.page_size
            parent = int(req.chain[-1]) if have else NONE_HASH
            req.chain = np.concatenate([req.chain, self.hasher.chain(
                parent, req.ids[have * ps : full * ps])])

    def decode(self, rids: Sequence[int]) -> bool:
        reqs = self._reqs_of(rids)
        self.check_distinct("decode", rids)
        written = [r.written for r in reqs]
        self.check_decode_args(rids, written, self.max_context_len)
        ps = self.page_size
        if ps == 1:  # every request starts a block (written == nblocks)
            need = len(reqs)
        else:
            need = 0
            for req, w in zip(reqs, written, strict=True):
                need += w == req.nblocks * ps
        if need > self.pool.get_num_free_blocks():
            return False
        if not reqs:
            return True
        rows = np.array([r.row for r in reqs], dtype=np.int64)
        if ps == 1:  # every request starts a block (written == nblocks), and it is the slot
            got = self.pool.get_new_blocks(need)
            # one entry per row at its written length, bounded by the checks above (`top`)
            self.req_to_token_pool.write_run(rows, np.array(written, dtype=np.int64), 1, got,
                                             top=max(written))
            if self._table is not None:  # that write was the block tables' too
                for req, b in zip(reqs, got.tolist(), strict=True):
                    req.nblocks += 1  # (`_RowReq.grew(1, b)`, inline: ~100 k calls)
                    req.written += 1
                    req.last = b
            else:
                for req, b in zip(reqs, got.tolist(), strict=True):
                    req.add_block(b)
                    req.written += 1
        else:
            new = iter(self.pool.get_new_blocks(need).tolist())
            slots = []
            for req in reqs:
                w = req.written
                if w == req.nblocks * ps:
                    req.add_block(next(new))
                slots.append(req.last * ps + w % ps)
                req.written = w + 1
            self.req_to_token_pool.write_at(rows, np.array(written, dtype=np.int64),
                                            np.array(slots, dtype=np.int64))
        for req in reqs:  # blocks whose tokens are known are hashed
            w = req.written
            if w % ps == 0 and w <= len(req.ids):
                self._register_full(req)
        return True

    def decode_steps(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """n decode steps at once, exactly as n calls of `decode`: new blocks come off the
        free queue in stepping's order (step-major, then batch order; a block starts at every
        position that is a multiple of the page size), so block tables, lazy evictions and
        the page table end up identical. A stretch in which some block would be hashed as it
        fills (known ids beyond a request's written tokens) is stepped, so the prefix index
        sees its insertions in stepping's order."""
        reqs = self._reqs_of(rids)
        if n <= 0 or not reqs or any(len(r.ids) > r.written for r in reqs):
            return super().decode_steps(rids, n, head_reservation)
        self.check_distinct("decode", rids)
        ps = self.page_size
        w = np.array([r.written for r in reqs], dtype=np.int64)
        self.check_decode_args(rids, w, self.max_context_len, steps=n)
        pos = w[None, :] + np.arange(n, dtype=np.int64)[:, None]  # (step, request)
        starts = pos % ps == 0  # stepping pops a block here, in row-major order
        need = int(np.count_nonzero(starts))
        if need > self.pool.get_num_free_blocks():
            raise ValueError("decode_steps needs decode_cost <= available_tokens")
        profile = self.decode_profile(rids, n, head_reservation)
        new = self.pool.get_new_blocks(need)
        last = np.array([r.last for r in reqs], dtype=np.int64)
        # at page size 1 a new block every step: the pop order is the (step, request) grid
        block_at = new.reshape(n, len(reqs)) if ps == 1 else pages_at_steps(pos, new, last, ps)
        rows = np.array([r.row for r in reqs], dtype=np.int64)
        self.req_to_token_pool.write_at(rows[None, :], pos, block_at * ps + pos % ps)
        if self._table is not None:  # that write was the block tables' too (page size 1)
            for req, b in zip(reqs, block_at[-1].tolist(), strict=True):
                req.grew(n, b)  # type: ignore[attr-defined]
            return profile
        for i, req in enumerate(reqs):
            req.add_blocks(block_at[starts[:, i], i])
            req.written += n
        return profile

    def decode_profile(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """Breakdown after each of the next n decode steps, without changing anything. New
        blocks come off the free-queue head in order; a hashed one popped there is a lazy
        eviction, so `cached` (not `free`) shrinks by that block."""
        reqs = self._reqs_of(rids)
        ps = self.page_size
        w = np.array([r.written for r in reqs], dtype=np.int64)
        final = np.array([r.final_len for r in reqs], dtype=np.int64)
        a0 = np.array([r.nblocks * ps for r in reqs], dtype=np.int64)
        out, new_slots = page_growth_profile(self.breakdown(head_reservation), w, final, a0, ps, n)
        new_blocks = new_slots // ps
        hashed = self.pool.cached_among_next(int(new_blocks[-1]) if n else 0)
        evicted = hashed[new_blocks] * ps  # hashed blocks popped: cache, not free, pays
        out[:, _CACHED] -= evicted
        out[:, _FREE] += evicted
        return out

    def decode_cost(self, rids: Sequence[int], n: int) -> int:
        ps = self.page_size
        total = 0
        for rid in rids:
            req = self._req(rid)
            total += max(-(-(req.written + n) // ps) - req.nblocks, 0)
        return total * ps

    def decode_room(self, rid: int) -> int:
        req = self._req(rid)
        return req.nblocks * self.page_size - req.written

    # -- ending ----------------------------------------------------------------------------
    def _learn_ids(self, req: _Req, token_ids: np.ndarray) -> None:
        ids = _ids(token_ids)
        if len(ids) > len(req.ids):
            req.ids = ids

    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        req = self._req(rid)
        self._learn_ids(req, token_ids)
        self._register_full(req)

    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        req = self._req(rid)
        self._learn_ids(req, token_ids)
        self._register_full(req)
        self.release(rid)

    def release(self, rid: int) -> None:
        """Free the request's blocks. One released in the middle of its prefill (preempted,
        or taken back when its round ran short of memory) waits for admission again with
        the same prompt: its hash chain goes back to the prompt memo, so the next peek
        does not hash the whole prompt again (at page size 1 with small chunks, 688
        admissions of 300 requests hashed a whole prompt 678 times), and with it its
        admission hit: those blocks were held since, so none was evicted, and the next
        lookup walks the chain from the hit's end rather than from its start."""
        req = self._req(rid)
        m, at = self._admit_hits.pop(rid, (0, -1))
        if req.written < len(req.ids):  # (held blocks are never popped: still indexed)
            hit = req.block_slice(0, m)  # (a row's is a copy: the row is freed below)
            at = at if req.nhashed == m else -1  # its own chunks hold the miss: walk on
            self.memo.keep(req.ids, req.chain, hit, self.pool.gen[hit], at,
                           self.pool.evicted_blocks)
        # chain tail first; its first `nhashed` blocks carry hashes, the rest none (fresh
        # blocks only this request held: nobody else hashed them)
        self.pool.free_blocks(req.blocks[::-1], req.nhashed)
        self.req_to_token_pool.free_row(req.row)
        del self._reqs[rid]

    # -- observation -----------------------------------------------------------------------
    def written(self, rid: int) -> int:
        return self._req(rid).written

    def available_tokens(self) -> int:
        return self.pool.get_num_free_blocks() * self.page_size

    def evictable_tokens(self) -> int:
        return self.pool.num_cached_free * self.page_size

    def fresh_tokens(self) -> int:
        """Cached blocks sit in the free queue among plain free ones and a pop takes the head
        whatever it holds: the plain free blocks ahead of the first cached one."""
        return self.pool.fresh_blocks() * self.page_size

    def cached_block_ids(self) -> list[int]:
        """Free-queue blocks that still carry a hash, head (next evicted) first."""
        return self.pool.cached_free_blocks()

    def block_ids(self, rid: int) -> list[int]:
        return self._req(rid).blocks.tolist()

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        """Owned blocks split into token_states (shared full blocks once), reserved and rounding
        (a live request's partial last block); cached = hashed free blocks; no external
        fragmentation: any free block serves."""
        non_negative_int("head_reservation", head_reservation)
        ps = self.page_size
        pool = self.pool
        tokens = (self.num_pages - pool.get_num_free_blocks()) * ps
        reserved = rounding = 0
        for r in self._reqs.values() if ps > 1 else ():  # a one-token block is never partial
            w = r.written
            if w % ps:
                end = r.nblocks * ps
                tokens -= end - w
                fin = r.final_len
                reserved += max(min(end, fin) - w, 0)
                rounding += max(end - max(fin, w), 0)
        return MemoryBreakdown.for_pages(
            self.capacity,
            token_states=tokens,
            cached=pool.num_cached_free * ps,
            reserved=reserved,
            rounding=rounding,
            free=(pool.get_num_free_blocks() - pool.num_cached_free) * ps,
        )

    def page_table_entries(self) -> int:
        return sum(r.nblocks for r in self._reqs.values())

    def check_invariants(self) -> None:
        """The pool's equations and the requests' (kvcore/policies/vllm_checks.py), the
        breakdown's, and capacity == num_pages * page_size."""
        check_block_policy(self.pool, self._reqs, self.hasher, self.req_to_token_pool)
        check_admit_hits(self.pool, self._reqs, self._admit_hits)
        self.breakdown(self.max_context_len).check_invariants()
        if self.num_pages * self.page_size != self.capacity:
            raise InvariantError("vllm: capacity is not num_pages * page_size")
