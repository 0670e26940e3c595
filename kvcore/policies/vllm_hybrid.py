"""The `vllm` policy on a hybrid model: vLLM v1's hybrid KV cache manager over one `BlockPool`.

Layers are grouped into KV cache groups (kvcore/hybrid_groups.py, sized with the planner's own
functions); every group draws its blocks from ONE shared `BlockPool` (kvcore/block_pool.py:
ref counts, one free queue in LRU order, lazy eviction) and keeps, per request, its own
block table, where 0 is vLLM's null block (a position whose block is not needed). What each
kind of group does (vllm/v1/core/single_type_kv_cache_manager.py, main of 2026-Q2; the
behaviour below has held since v0.11 unless said):

* Full attention: one block per `block_size` tokens, all kept.
* Sliding window W / chunked local C: before a request's blocks are grown, those the next
  token no longer needs (before its last W - 1 tokens / before its current chunk) are freed
  to the free queue and replaced by the null block (`remove_skipped_blocks`); new positions
  already outside the window are null from the start (the skipped-block allocation of
  v0.11+). A freed full block keeps its hash: it is still a prefix hit until a pop reuses it.
* Mamba / linear attention, mode `none`: one state block per request, nothing cached (vLLM's
  Mamba block size is then `max_model_len`; prefix caching is off). Modes `align` / `all`: a
  request's table has one position per block of tokens, null except its running state block
  (at its last position) and the blocks that received a state this step; the running block
  of the previous step is freed at the next one (`last_state_block_idx` in `align`; the
  skipped tokens are all but the last in `all`). A block whose position ended on a block
  boundary holds the state there and is hashed like a full attention block. `all` gives
  every boundary a block; `align` only the boundary a scheduler step ends on: vLLM's
  scheduler cuts a prefill chunk at the prompt's last block boundary
  (`_mamba_block_aligned_split`), modelled here as the state at the last boundary a grow
  call crosses being kept.

Hashing: one hash chain per request (kvcore/block_hash.py) for all groups; `_holders` (per
group, hash -> blocks: vLLM's `BlockHashWithGroupId`) answers a lookup at any position. A
full block is hashed once its ids are known: prompt blocks at prefill, decode blocks at
`cache_prefix` / `finish` (a window or state decode block freed before then is not cached).

Units: a slot is 1 / block_size of a block in each attention group (`slot_groups`), so one
token costs one slot as under full attention; `peek_admission`'s `other_pools` tells the
engine's admission what the other groups (state blocks) need on top. Decode stretches:
kvcore/policies/vllm_hybrid_stretch.py. Bytes per kind: `pool_usage`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvcore.block_hash import NONE_HASH, ChainHasher
from kvcore.block_pool import BlockPool
from kvcore.breakdown import MemoryBreakdown
from kvcore.hybrid_groups import (
    MAMBA_CACHE_MODES,
    Cached,
    HybridGroups,
    longest_hit,
    vllm_groups,
)
from kvcore.layers import FULL
from kvcore.policies.base import AdmitResult, PolicyConfig, PrefixPeek
from kvcore.policies.capabilities import PoolKinds, PoolUsage, PrefixCache
from kvcore.policies.vllm_hybrid_state import HybridReq, check_hybrid_invariants, partial_tails
from kvcore.policies.vllm_hybrid_stretch import HybridDecodeStretch
from kvcore.validation import (
    InvariantError,
    cdiv,
    check_request_lengths,
    non_negative_int,
    positive_int,
)
from kvcore.vllm_rules import vllm_rules


def _ids(token_ids: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(token_ids, dtype=np.int64)


class VLLMHybridPolicy(PrefixCache, HybridDecodeStretch, PoolKinds):
    """vLLM v1's hybrid KV cache manager (see the module notes) behind the KVPolicy
    interface; built by `make_policy("vllm", cfg)` when `cfg.layout` is hybrid."""

    name = "vllm"

    def __init__(self, config: PolicyConfig) -> None:
        if config.layout is None:
            raise ValueError("policy vllm (hybrid): PolicyConfig.layout is required")
        mode = config.mamba_cache_mode
        if mode not in MAMBA_CACHE_MODES:
            raise ValueError(f"mamba_cache_mode must be one of {', '.join(MAMBA_CACHE_MODES)}, "
                             f"got {mode!r}")
        self.max_context_len = positive_int("max_context_len", config.max_context_len)
        positive_int("page_size", config.page_size)
        self.groups: HybridGroups = vllm_groups(
            config.layout, config.kv_bytes, self.max_context_len, kv_dtype=config.kv_dtype,
            block_size=config.page_size, rules=vllm_rules(config.vllm_version),
            mamba_cache_mode=mode)
        bs = self.groups.block_size
        #: attention groups: a slot is 1 / block_size of a block in each (vLLM's "GPU KV
        #: cache size" = blocks // groups x block size, kv_cache_utils.py, v0.11+)
        self.slot_groups = max(1, sum(s.count for s in self.groups.specs if not s.is_state))
        super().__init__(self.groups.num_blocks * bs // self.slot_groups, bs)
        self.mamba_cache_mode = mode
        self.specs = self.groups.specs
        self.has_state = any(s.is_state for s in self.specs)
        #: groups taking a block at each new block of tokens (not Mamba in mode none)
        self.alloc_groups = sum(s.count for s in self.specs
                                if not (s.is_state and mode == "none"))
        self.max_requests = positive_int("max_requests", config.max_requests)
        #: prefix caching: on, except with Mamba mode "none" on a model with state layers
        self.caching = not (self.has_state and mode == "none")
        self.spec_gids = self.groups.group_ids()
        #: per group: its spec's index
        self.gspec = [k for k, ids in enumerate(self.spec_gids) for _ in ids]
        self.pool = BlockPool(self.groups.num_blocks, bs)
        self.pool.on_evict = self._unhold
        self.group_of = np.full(self.groups.num_blocks + 1, -1, dtype=np.int64)
        #: per group: hash -> blocks holding that key, oldest first
        self._holders: list[dict[int, list[int]]] = [{} for _ in self.gspec]
        #: per state group: hashes whose state block the pool evicted while a full attention
        #: block of the same hash stays cached (the reuse accounting's capacity, not the
        #: state-boundary rule); bounded by the cached full blocks
        self._state_gone: list[set[int]] = [set() for _ in self.gspec]
        self._full_gids = [g for g, k in enumerate(self.gspec) if self.specs[k].kind == FULL]
        self._state_gids = [g for g, k in enumerate(self.gspec) if self.specs[k].is_state]
        self._last: tuple | None = None  # the last lookup's per-spec hits, for _cuts
        self.hasher = ChainHasher(bs, self.max_context_len)
        self._rows = list(range(self.max_requests - 1, -1, -1))
        self._reqs: dict[int, HybridReq] = {}
        # statistics per spec: the hit that spec alone accepted, and the tokens asked about
        self.spec_hits = [0] * len(self.specs)
        self.queried_tokens = 0
        self.hit_tokens = 0

    # -- the index ---------------------------------------------------------------------------
    def _unhold(self, evicted: np.ndarray) -> None:
        """Pool hook: evicted blocks (still carrying their keys) leave this index."""
        for b in evicted.tolist():
            g = int(self.group_of[b])
            index, h = self._holders[g], int(self.pool.block_hash[b])
            holders = index[h]
            holders.remove(b)
            if not holders:
                del index[h]
                if g in self._state_gids:
                    if any(h in self._holders[f] for f in self._full_gids):
                        self._state_gone[g].add(h)
                elif g in self._full_gids:
                    for sg in self._state_gids:
                        self._state_gone[sg].discard(h)

    def _find(self, g: int, i: int, chain: np.ndarray, ids: np.ndarray) -> int:
        """The oldest block of group g holding chain position i (its key checked), or 0."""
        for b in self._holders[g].get(int(chain[i]), ()):
            parent = int(chain[i - 1]) if i else NONE_HASH
            bs = self.page_size
            if int(self.pool.parent_hash[b]) == parent and np.array_equal(
                    self.pool.block_tokens[b], ids[i * bs:(i + 1) * bs]):
                return b
        return 0

    def _lookup(self, ids: np.ndarray, max_len: int) -> tuple[int, list[list[int]], list[int]]:
        """vLLM's cross-group hit for a prompt capped at `max_len` tokens: (hit tokens, per
        group the block table it gives, per spec the hit that spec accepts alone)."""
        n = len(self.specs)
        if not self.caching or not any(self._holders) or max_len < self.page_size:
            return 0, [[] for _ in self.gspec], [0] * n
        chain = self.hasher.chain(NONE_HASH, ids[: max_len // self.page_size * self.page_size])
        keys = chain.tolist()
        # per spec, the positions whose hash some block holds in every group of the spec (one
        # dict probe per position and group); only those are checked block by block
        per_group = [[h in index for h in keys] for index in self._holders]
        known = [per_group[gids[0]] if len(gids) == 1 else
                 np.logical_and.reduce([per_group[g] for g in gids]).tolist()
                 for gids in self.spec_gids]
        memo: dict[tuple[int, int], int] = {}

        def block(g: int, i: int) -> int:
            if (g, i) not in memo:
                memo[g, i] = self._find(g, i, chain, ids)
            return memo[g, i]

        def in_all(k: int) -> Cached:
            gids, hashed = self.spec_gids[k], known[k]
            return lambda i: hashed[i] and all(block(g, i) for g in gids)

        cached = [in_all(k) for k in range(n)]
        hit, first = longest_hit(self.specs, cached, max_len, self.page_size)
        alone = [longest_hit((s,), [c], max_len, self.page_size)[0]
                 for s, c in zip(self.specs, cached, strict=True)]
        nblk = hit // self.page_size
        tables = []
        for g, k in enumerate(self.gspec):
            lo = 0 if self.specs[k].kind == "full" else first[k]
            tables.append([0] * lo + [block(g, i) for i in range(lo, nblk)])
        self._last = (cached, alone, hit, max_len, keys)  # what admission's _cuts reads
        return hit, tables, alone

    def _cuts(self, cached: list[Cached], alone: list[int], hit: int, max_len: int,
              keys: list[int]) -> tuple[int, int, int]:
        """Where the groups' rules cut the hit (HybridRadixCache.ReuseCuts' meaning): the
        full attention groups' hit alone, the fixed point without the state groups, and
        the fixed point with every state block the pool evicted counted as kept."""
        specs, bs = self.specs, self.page_size
        plain = [k for k, s in enumerate(specs) if not s.is_state]
        windowed = longest_hit(tuple(specs[k] for k in plain), [cached[k] for k in plain],
                               max_len, bs)[0] if plain else max_len // bs * bs
        content = min((a for s, a in zip(specs, alone, strict=True) if s.kind == FULL),
                      default=windowed)
        if not self.has_state:
            return content, windowed, hit
        if not any(self._state_gone[g] for g in self._state_gids):
            return content, windowed, hit

        def kept(k: int) -> Cached:
            if not specs[k].is_state:
                return cached[k]
            gids = self.spec_gids[k]
            return lambda i: cached[k](i) or all(
                keys[i] in self._state_gone[g] or keys[i] in self._holders[g] for g in gids)

        boundary = longest_hit(specs, [kept(k) for k in range(len(specs))], max_len, bs)[0]
        return content, windowed, boundary

    # -- admission -------------------------------------------------------------------------
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        ids = _ids(token_ids)
        return self._lookup(ids, len(ids))[0]

    def peek_admission(self, token_ids: np.ndarray) -> PrefixPeek:
        """Hit blocks nobody holds sit in the free queue: admission takes them out of it.
        `other_pools`: vLLM allocates a new request's blocks in every KV cache group at once
        (`KVCacheManager.allocate_slots` asks the coordinator's
        `get_num_blocks_to_allocate`, the sum over groups; vllm/v1/core/kv_cache_manager.py
        and kv_cache_coordinator.py, v0.11+ to v0.24), Mamba state blocks included, while
        the engine's admission counts the prompt + 1 token's pages in one attention group's
        slots; the difference, in slots, for a prompt of len(token_ids) + 1 tokens."""
        ids = _ids(token_ids)
        hit, tables, _ = self._lookup(ids, len(ids))
        blocks = np.array([b for t in tables for b in t if b], dtype=np.int64)
        idle = int(np.count_nonzero(self.pool.ref_cnt[blocks] == 0)) if len(blocks) else 0
        bs, t = self.page_size, len(ids) + 2  # the prompt and its first output token
        pages = cdiv(t, bs) - hit // bs
        need = sum(self._new_blocks(g, len(tables[g]), hit, t) for g in range(len(self.gspec)))
        return PrefixPeek(hit, self._slots(idle), cdiv(need * bs, self.slot_groups) - pages * bs)

    def _new_blocks(self, g: int, have: int, w: int, t: int) -> int:
        """Blocks group g allocates from w to t tokens, `have` positions held (`_plan`)."""
        spec, bs = self.specs[self.gspec[g]], self.page_size
        if spec.is_state and self.mamba_cache_mode == "none":
            return 0 if have else 1
        want = cdiv(t, bs)
        if spec.is_state:
            return sum(1 for i in {want - 1, *self._boundaries(w, t)} if i >= have)
        return max(want - max(have, spec.skipped_tokens(w) // bs), 0)

    def admit(self, rid: int, token_ids: np.ndarray, final_len: int,
              max_new_tokens: int) -> AdmitResult | None:
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already admitted")
        ids = _ids(token_ids)
        check_request_lengths(len(ids), final_len, self.max_context_len, min_prompt=1)
        non_negative_int("max_new_tokens", max_new_tokens)
        if not self._rows:
            return None
        self._last = None
        hit, tables, alone = self._lookup(ids, len(ids) - 1)
        content, windowed, boundary = (0, 0, 0) if self._last is None else self._cuts(
            *self._last)
        if self.caching:
            self.queried_tokens += len(ids) - 1
            for k, a in enumerate(alone):
                self.spec_hits[k] += a
        held = np.array([b for t in tables for b in t if b], dtype=np.int64)
        if len(held):
            self.pool.touch(held)
        req = HybridReq(self._rows.pop(), ids, final_len, len(self.gspec))
        for g, t in enumerate(tables):
            req.tables[g] = t
            req.nhashed[g] = len(t)
        req.written = hit
        req.chain = self.hasher.chain(NONE_HASH, ids)
        self.hit_tokens += hit
        self._reqs[rid] = req
        return AdmitResult(row=req.row, cached_len=hit, window_lost=content - windowed,
                           state_lost=windowed - boundary)

    def caches_no_prefix(self) -> bool:
        """Mamba mode none turns prefix caching off for the whole model (vLLM keeps no
        state to resume from): the state rule, not capacity, loses every hit."""
        return self.has_state and not self.caching

    # -- growth ----------------------------------------------------------------------------
    def _req(self, rid: int) -> HybridReq:
        try:
            return self._reqs[rid]
        except KeyError:
            raise ValueError(f"request {rid} is not admitted") from None

    def _skip(self, req: HybridReq) -> None:
        """vLLM's remove_skipped_blocks at the request's written tokens: blocks the next
        token does not need are freed (keeping their hash) and nulled."""
        w, bs = req.written, self.page_size
        freed: list[int] = []
        for g, k in enumerate(self.gspec):
            spec, table = self.specs[k], req.tables[g]
            if spec.is_state and self.mamba_cache_mode == "none":
                continue
            # a state group's positions before the last call's skip point are null already
            lo = spec.skipped_tokens(req.skip_at) // bs if spec.is_state else 0
            for i in range(min(spec.skipped_tokens(w) // bs, len(table)) - 1, lo - 1, -1):
                if not table[i]:
                    if not spec.is_state:
                        break  # nulled by an earlier call, and so is everything before it
                    continue
                freed.append(table[i])
                table[i] = 0
        req.skip_at = w
        if freed:
            self.pool.free_blocks(np.array(freed, dtype=np.int64))

    def _plan(self, req: HybridReq, t: int) -> list[tuple[int, int]]:
        """(group, position) of every block growing `req` to `t` tokens allocates."""
        w, bs = req.written, self.page_size
        out = []
        for g, k in enumerate(self.gspec):
            spec, have = self.specs[k], len(req.tables[g])
            if spec.is_state and self.mamba_cache_mode == "none":
                if not have and t > 0:
                    out.append((g, 0))
                continue
            want = cdiv(t, bs)
            if spec.is_state:  # the running block, and those receiving a boundary state
                keep = {want - 1, *self._boundaries(w, t)}
                out.extend((g, i) for i in sorted(keep) if i >= have)
            else:
                first = max(have, spec.skipped_tokens(w) // bs)
                out.extend((g, i) for i in range(first, want))
        return out

    def _boundaries(self, w: int, t: int) -> list[int]:
        """Positions whose state block receives the state at its end boundary when a request
        grows from w to t tokens: `all`, every boundary in (w, t]; `align`, the last one (the
        step vLLM's aligned split ends there; none when no boundary is crossed)."""
        bs = self.page_size
        last = t // bs
        if last * bs <= w:
            return []
        if self.mamba_cache_mode == "all":
            return list(range(w // bs, last))
        return [last - 1]

    def _grow(self, reqs: list[HybridReq], targets: Sequence[int]) -> bool:
        """Grow each request to its target, all or nothing. As in vLLM's allocate_slots the
        skipped blocks are removed first, even when the allocation then fails: they are
        blocks no token of the request needs any more, so no request's result changes."""
        for req in reqs:
            self._skip(req)
        plans = [self._plan(req, int(t)) for req, t in zip(reqs, targets, strict=True)]
        need = sum(len(p) for p in plans)
        if need > self.pool.get_num_free_blocks():
            return False
        new = self.pool.get_new_blocks(need).tolist()
        at = 0
        for req, t, plan in zip(reqs, targets, plans, strict=True):
            for g, i in plan:
                table = req.tables[g]
                if len(table) <= i:
                    table.extend([0] * (i + 1 - len(table)))
                table[i] = new[at]
                self.group_of[new[at]] = g
                at += 1
            t = int(t)
            for g, k in enumerate(self.gspec):  # positions up to t, null where not needed
                if self.specs[k].is_state and self.mamba_cache_mode == "none":
                    continue
                table = req.tables[g]
                table.extend([0] * (cdiv(t, self.page_size) - len(table)))
                if self.specs[k].is_state:
                    req.states[g].update(self._boundaries(req.written, t))
            req.written = max(req.written, t)
            self._cache(req)
        return True

    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        reqs = [self._req(r) for r in rids]
        self.check_extend_args(rids, target_lens, [r.written for r in reqs],
                               self.max_context_len)
        return self._grow(reqs, target_lens)

    def decode(self, rids: Sequence[int]) -> bool:
        reqs = [self._req(r) for r in rids]
        self.check_distinct("decode", rids)
        written = [r.written for r in reqs]
        self.check_decode_args(rids, written, self.max_context_len)
        return self._grow(reqs, [w + 1 for w in written])

    # -- caching ---------------------------------------------------------------------------
    def _cache(self, req: HybridReq) -> None:
        """Hash every block that is full and whose token ids are known, group by group, in
        runs of consecutive blocks (a null position is skipped: nothing to cache there)."""
        if not self.caching:
            return
        bs = self.page_size
        full = min(req.written, len(req.ids)) // bs
        for g, k in enumerate(self.gspec):
            table, done = req.tables[g], req.nhashed[g]
            end = min(full, len(table))
            if self.specs[k].is_state:  # only blocks holding a boundary state, one by one
                for i in sorted(p for p in req.states[g] if done <= p < end and table[p]):
                    self._register(g, np.array([table[i]], dtype=np.int64), req, i)
                req.states[g] = {p for p in req.states[g] if p >= end}
                req.nhashed[g] = max(done, end)
                continue
            i = done
            while i < end:
                if not table[i]:
                    i += 1
                    continue
                j = i
                while j < end and table[j]:
                    j += 1
                self._register(g, np.array(table[i:j], dtype=np.int64), req, i)
                i = j
            req.nhashed[g] = max(done, end)

    def _register(self, g: int, blocks: np.ndarray, req: HybridReq, start: int) -> None:
        bs, k = self.page_size, len(blocks)
        # a hit block is already hashed (and indexed); only fresh blocks are registered
        fresh = ~self.pool.is_hashed[blocks]
        if not fresh.all():
            for i in np.flatnonzero(fresh).tolist():
                self._register(g, blocks[i:i + 1], req, start + i)
            return
        hashes = req.chain[start:start + k]
        parent = int(req.chain[start - 1]) if start else NONE_HASH
        self.pool.cache_full_blocks(blocks, hashes, parent,
                                    req.ids[start * bs:(start + k) * bs].reshape(k, bs), start)
        gone = self._state_gone[g]
        for b, h in zip(blocks.tolist(), hashes.tolist(), strict=True):
            self._holders[g].setdefault(int(h), []).append(b)
            gone.discard(int(h))

    def _learn(self, req: HybridReq, token_ids: np.ndarray) -> None:
        ids = _ids(token_ids)
        if len(ids) > len(req.ids):
            req.ids = ids
            req.chain = self.hasher.chain(NONE_HASH, ids)

    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        req = self._req(rid)
        self._learn(req, token_ids)
        self._cache(req)

    # -- ending ----------------------------------------------------------------------------
    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        self.cache_prefix(rid, token_ids)
        self.release(rid)

    def release(self, rid: int) -> None:
        """Every group's blocks, reversed (vLLM's pop_blocks_for_free: a chain's tail first)."""
        req = self._req(rid)
        blocks = [b for t in req.tables for b in t if b]
        if blocks:
            self.pool.free_blocks(np.array(blocks[::-1], dtype=np.int64))
        self._rows.append(req.row)
        del self._reqs[rid]

    # -- observation -----------------------------------------------------------------------
    def written(self, rid: int) -> int:
        return self._req(rid).written

    def block_tables(self, rid: int) -> list[list[int]]:
        """Per KV cache group, the request's block table (0: the null block)."""
        return [list(t) for t in self._req(rid).tables]

    def _slots(self, blocks: int) -> int:
        """Blocks of the shared pool as engine slots (see `slot_groups`)."""
        return blocks * self.page_size // self.slot_groups

    def available_tokens(self) -> int:
        return self._slots(self.pool.get_num_free_blocks())

    def evictable_tokens(self) -> int:
        return self._slots(self.pool.num_cached_free)

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        """The shared pool in slots: held blocks are token states, but for the unwritten
        tail of an attention group's last block (reserved up to the final length, rounding
        beyond it); hashed free blocks are cached; the rest is free."""
        non_negative_int("head_reservation", head_reservation)
        bs, pool = self.page_size, self.pool
        free = pool.get_num_free_blocks()
        tokens = (self.groups.num_blocks - free) * bs
        reserved = rounding = 0
        for r in self._reqs.values():
            empty, res, rnd = partial_tails(r, self.gspec, self.specs, bs)
            tokens, reserved, rounding = tokens - empty, reserved + res, rounding + rnd
        # the parts above are in blocks x block_size; as engine slots each is divided by
        # slot_groups (floors), and free takes the rest, so the parts still sum to capacity
        g = self.slot_groups
        tokens, cached, reserved, rounding = (tokens // g, pool.num_cached_free * bs // g,
                                              reserved // g, rounding // g)
        return MemoryBreakdown.for_pages(self.capacity, tokens, cached, reserved, rounding,
                                         self.capacity - tokens - cached - reserved - rounding)

    def page_table_entries(self) -> int:
        """The contract's sum of ceil(context / block size) over live requests: the blocks of
        one attention group's table (every group's table has that many positions, null or
        not; `block_tables` gives them all)."""
        bs = self.page_size
        return sum(cdiv(r.written, bs) for r in self._reqs.values())

    @property
    def page_table_nbytes(self) -> int:
        """vLLM's block tables: int32, max_num_reqs x cdiv(max_model_len, block_size) per KV
        cache group (vllm/v1/worker/block_table.py `MultiGroupBlockTable`, v0.11+; Mamba in
        mode none has block size max_model_len: one column)."""
        cols = [1 if self.specs[k].is_state and self.mamba_cache_mode == "none"
                else cdiv(self.max_context_len, self.page_size) for k in self.gspec]
        return self.max_requests * sum(cols) * 4

    @property
    def shared_pool(self) -> bool:
        return True  # every group draws block ids from one BlockPool

    def pool_usage(self) -> dict[str, PoolUsage]:
        """Per pool kind: the shared pool's bytes as capacity, the bytes its groups' blocks
        hold for live requests or as cache (PoolUsage's `used` counts both; `cached` the cache
        alone), and the hits that kind alone would give."""
        pool, bb = self.pool, self.groups.block_bytes
        held = pool.ref_cnt > 0
        cached = pool.is_hashed & ~held
        out: dict[str, PoolUsage] = {}
        for k, spec in enumerate(self.specs):
            mine = np.isin(self.group_of, self.spec_gids[k])
            prev = out.get(spec.pool_kind)
            used = int(np.count_nonzero(mine & (held | cached))) * bb
            cach = int(np.count_nonzero(mine & cached)) * bb
            hits = self.spec_hits[k]
            if prev is not None:  # two specs of one kind (two windows): summed, least hit
                used, cach = used + prev.used_bytes, cach + prev.cached_bytes
                hits = min(hits, prev.hit_tokens)
            out[spec.pool_kind] = PoolUsage(spec.pool_kind, self.groups.num_blocks * bb, used,
                                            cach, hits, self.queried_tokens)
        return out

    @property
    def reqs(self) -> dict[int, HybridReq]:  # read by the invariant checks and the stretch
        return self._reqs

    @property
    def holders(self) -> list[dict[int, list[int]]]:  # per group, hash -> blocks
        return self._holders

    def check_invariants(self) -> None:
        check_hybrid_invariants(self)
        for g in self._state_gids:  # an evicted state is remembered only beside its content
            for h in self._state_gone[g]:
                if h in self._holders[g] or not any(h in self._holders[f]
                                                    for f in self._full_gids):
                    raise InvariantError(f"vllm hybrid: group {g}: evicted state {h} is cached "
                                         "again, or no full attention block holds its hash")


__all__ = ["VLLMHybridPolicy"]
