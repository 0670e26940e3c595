"""The `vllm` policy: vLLM v1's KV cache manager over a `BlockPool` (kvcore/block_pool.py).

Like `paged` (PagedAllocator + RadixCache), this is a thin policy over two structures: the
block pool (ref counts, free queue, hash index; lazy LRU eviction) and the block hash chain
(kvcore/block_hash.py). What belongs to the manager, and so lives here:

* Per request the block table (`blocks`), the hashes of its full blocks, and its page-table
  row, written through `ReqToTokenPool`.
* A block is hashed as soon as it is full and its token ids are known: prompt blocks during
  prefill; decode blocks during decode when a token source is set (`set_token_source`),
  otherwise at `cache_prefix` / `finish`, whose `token_ids` cover every written token.
* A lookup matches whole blocks of `prompt[:P-1]`: the last prompt token is always recomputed
  to get logits, so a block-aligned prompt recomputes its last block. Hits are touched (ref
  count + 1, out of the free queue when idle).
* Freeing hands the request's blocks to the pool in reverse order, so a chain's tail (the
  longest, least shareable prefix) is evicted first.

Capacity is `num_pages * page_size` like the paged policies (block 0 is the null block).
Per request: len(blocks) == ceil(written / page_size), and its row holds
`blocks[p // ps] * ps + p % ps` at every written position p.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from kvcore.block_hash import NONE_HASH, ChainHasher
from kvcore.block_pool import BlockPool
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

#: (rid, start, end) -> token ids of positions start..end-1 of that request
TokenSource = Callable[[int, int, int], np.ndarray]

_CACHED, _FREE = PARTS.index("cached"), PARTS.index("free")


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
        self.pool = BlockPool(self.num_pages, self.page_size)
        self.hasher = ChainHasher(self.page_size, self.max_context_len)
        self._reqs: dict[int, _Req] = {}
        self._token_source: TokenSource | None = None
        # statistics
        self.queried_tokens = 0
        self.hit_tokens = 0

    def set_token_source(self, source: TokenSource | None) -> None:
        """Let decode hash blocks the moment they fill (as vLLM does) by asking `source` for
        output token ids; without one, decode blocks are hashed at cache_prefix/finish."""
        self._token_source = source

    @property
    def evicted_blocks(self) -> int:
        return self.pool.evicted_blocks

    # -- hashing -----------------------------------------------------------------------------
    def _match(self, ids: np.ndarray, nblocks: int) -> tuple[list[int], list[int]]:
        """Cached blocks for the first `nblocks` blocks of `ids`, up to the first miss."""
        if nblocks <= 0 or not self.pool.cached_block_hash_to_block:
            return [], []
        hashes = self.hasher.chain(NONE_HASH, ids[: nblocks * self.page_size])
        return self.pool.find_longest_cache_hit(hashes, ids)

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
        blocks = np.array(req.blocks[done:full], dtype=np.int64)
        req.hashes.extend(self.pool.cache_full_blocks(
            blocks, self.hasher.chain(parent, toks), parent, toks.reshape(-1, ps)))

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
        idle = int((self.pool.ref_cnt[np.array(blocks, dtype=np.int64)] == 0).sum())
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
        if blocks:
            self.pool.touch(np.array(blocks, dtype=np.int64))
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
        if need > self.pool.get_num_free_blocks():
            return False
        new = self.pool.get_new_blocks(need).tolist()
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
        if need > self.pool.get_num_free_blocks():
            return False
        if not reqs:
            return True
        new = iter(self.pool.get_new_blocks(need).tolist())
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
        self.pool.free_blocks(np.array(req.blocks[::-1], dtype=np.int64))  # chain tail first
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
        return list(self._req(rid).blocks)

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        """Owned blocks split into token_states (shared full blocks once), reserved and rounding
        (a live request's partial last block); cached = hashed free blocks; no external
        fragmentation: any free block serves."""
        non_negative_int("head_reservation", head_reservation)
        ps = self.page_size
        pool = self.pool
        tokens = (self.num_pages - pool.get_num_free_blocks()) * ps
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
            cached=pool.num_cached_free * ps,
            reserved=reserved,
            rounding=rounding,
            free=(pool.get_num_free_blocks() - pool.num_cached_free) * ps,
        )

    def page_table_entries(self) -> int:
        return sum(len(r.blocks) for r in self._reqs.values())

    def check_invariants(self) -> None:
        """The pool's equations, plus: ref_cnt[b] == #live requests holding b; a request
        holds ceil(written / ps) distinct non-null blocks and its hashed blocks keep their
        hashes; its page-table row matches its block table."""
        pool, ps = self.pool, self.page_size
        self.req_to_token_pool.check_invariants()
        pool.check_invariants()
        holders = np.zeros(self.num_pages + 1, dtype=np.int64)
        for rid, r in self._reqs.items():
            if len(set(r.blocks)) != len(r.blocks) or 0 in r.blocks:
                raise InvariantError(f"vllm: request {rid} holds a block twice or the null block")
            if len(r.blocks) != cdiv(r.written, ps):
                raise InvariantError(f"vllm: request {rid} has blocks beyond its written tokens")
            if len(r.hashes) > r.written // ps:
                raise InvariantError(f"vllm: request {rid} hashed a partial block")
            holders[r.blocks] += 1
            hb = np.array(r.blocks[: len(r.hashes)], dtype=np.int64)
            if not (pool.is_hashed[hb].all() and pool.block_hash[hb].tolist() == r.hashes):
                raise InvariantError(f"vllm: request {rid} has a block that lost its hash")
        for b in np.flatnonzero(pool.ref_cnt != holders).tolist():
            raise InvariantError(f"vllm: block {b} ref {pool.ref_cnt[b]} != holders {holders[b]}")
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

    # -- the pool's state under the names tests and debugging sessions use -------------------
    @property
    def _ref(self) -> np.ndarray:
        return self.pool.ref_cnt

    @property
    def _hash(self) -> np.ndarray:
        return self.pool.block_hash

    @property
    def _parent(self) -> np.ndarray:
        return self.pool.parent_hash

    @property
    def _cached(self) -> dict[int, int]:
        return self.pool.cached_block_hash_to_block

    @property
    def _qpos(self) -> np.ndarray:
        return self.pool.free_block_queue.positions

    def _holders(self, h: int) -> list[int]:
        return self.pool.get_cached_blocks(h)

    def _chain(self, parent: int, ids: np.ndarray) -> np.ndarray:
        return self.hasher.chain(parent, ids)


@register_policy(
    "vllm",
    when="compare with vLLM v1: paged blocks, prefix caching of full blocks via chained hashes",
)
def _make_vllm(config: PolicyConfig) -> KVPolicy:
    return VLLMBlockPolicy(config)
