"""The `vllm` policy: vLLM v1's KV cache manager (vllm/v1/core/kv_cache_manager.py, v0.11),
its coordinator and its single-type managers over one block pool, behind the KVPolicy
interface.

A model's layers form KV cache groups (kvcore/vllm/kv_cache_groups.py): a model whose layers
are all full attention is one group; a hybrid model has a group per layer kind and size
(sliding window, chunked local, Mamba / linear attention). Every group draws its blocks from
ONE `BlockPool` (kvcore/vllm/block_pool.py: ref counts, one free queue in LRU order, lazy
eviction, a chain index per group) and keeps, per request, its own block table
(kvcore/vllm/block_table.py). What this module owns:

* Per request (kvcore/vllm/request.py) its token ids, their block hash chain (one for every
  group: vLLM hashes a block once) and its tables. A block is hashed as soon as it is full
  and its token ids are known: prompt blocks during prefill; decode blocks at `cache_prefix`
  / `finish`, whose `token_ids` cover every written token, or during decode when ids beyond
  the written tokens are already known (a re-admission after preemption).
* Admission (`KVCacheManager.get_computed_blocks` + `allocate_slots`): the coordinator's hit
  (kvcore/vllm/coordinator.py) of `prompt[:P-1]` (the last prompt token is always recomputed
  to get logits, so a block-aligned prompt recomputes its last block); hits are touched (ref
  count + 1, out of the free queue when idle).
* Growth (`allocate_slots`): first the blocks the next token no longer needs are freed, in
  every group that frees any (`remove_skipped_blocks`, even when the allocation then fails:
  no token of the request needs them), then every group's new blocks are popped in one call,
  request by request and group by group, all or nothing; what each group does is its rule's
  (kvcore/vllm/group_rules.py).
* Freeing (`free`): a request's blocks go back group by group in reverse order of
  allocation (`pop_blocks_for_free`, freed reversed), so a chain's tail (the longest, least
  shareable prefix) is evicted first.

Units: a slot is 1 / block_size of a block in each attention group (`slot_groups`), so one
token costs one slot as under full attention (vLLM's "GPU KV cache size" = blocks // groups
x block size, kv_cache_utils.py, v0.11+); a full-attention model's capacity is then
`num_pages * page_size`. `peek_admission`'s `other_pools` tells the engine's admission what
the other groups (state blocks) need on top. Decode stretches: kvcore/vllm/stretch.py.

Prompts asked about repeatedly before admission are hashed once, compared only as far as a
lookup's answer reads them, and looked up again only when the cache changed under them
(`ChainMemo`, kvcore/vllm/chain_memo.py); admission takes the entry out; a request released in
the middle of its prefill hands its chain and admission hits back.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from kvcore.contract.breakdown import MemoryBreakdown
from kvcore.contract.capabilities import DecodeStretch, PrefixCache
from kvcore.contract.policy import MAMBA_CACHE_MODES, AdmitResult, PolicyConfig, PrefixPeek
from kvcore.contract.req_to_token_pool import ReqToTokenPool
from kvcore.contract.validation import (
    InvariantError,
    cdiv,
    check_request_lengths,
    non_negative_int,
    positive_int,
)
from kvcore.model.vllm_rules import vllm_rules
from kvcore.vllm.block_hash import NONE_HASH, ChainHasher
from kvcore.vllm.block_pool import BlockPool
from kvcore.vllm.block_table import (
    BlockTable,
    GroupBlockTables,
    PageTable,
    RowBlockTables,
    TokenSlotTable,
)
from kvcore.vllm.chain_memo import ChainMemo, KnownHit
from kvcore.vllm.coordinator import coordinator
from kvcore.vllm.group_rules import (
    FullAttention,
    GroupRule,
    MambaSingle,
    MambaState,
    group_rules,
)
from kvcore.vllm.kv_cache_groups import KVCacheGroups, full_attention_groups, vllm_groups
from kvcore.vllm.request import Request
from kvcore.vllm.state_evictions import StateEvictions
from kvcore.vllm.stretch import Stretch


def as_ids(token_ids: np.ndarray) -> np.ndarray:
    """Token ids as the manager keeps them: contiguous int64 (the memo keys on the buffer)."""
    return np.ascontiguousarray(token_ids, dtype=np.int64)


def layout_groups(config: PolicyConfig) -> KVCacheGroups:
    """The KV cache groups of the configured model: one full-attention group of `num_pages`
    blocks, or a hybrid layout's groups sized from its byte budget."""
    page_size = positive_int("page_size", config.page_size)
    if config.is_hybrid:
        assert config.layout is not None
        return vllm_groups(config.layout, config.kv_bytes, config.max_context_len,
                           kv_dtype=config.kv_dtype, block_size=page_size,
                           rules=vllm_rules(config.vllm_version),
                           mamba_cache_mode=config.mamba_cache_mode)
    return full_attention_groups(positive_int("kv_tokens // page_size", config.num_pages),
                                 page_size)


class VLLMManager(PrefixCache, DecodeStretch):
    """vLLM v1's KV cache manager (see the module notes) behind the KVPolicy interface."""

    name = "vllm"

    def __init__(self, config: PolicyConfig) -> None:
        mode = config.mamba_cache_mode
        if mode not in MAMBA_CACHE_MODES:
            raise ValueError(f"mamba_cache_mode must be one of {', '.join(MAMBA_CACHE_MODES)}, "
                             f"got {mode!r}")
        self.max_context_len = positive_int("max_context_len", config.max_context_len)
        self.max_requests = positive_int("max_requests", config.max_requests)
        self.groups = layout_groups(config)
        self.specs = self.groups.specs
        bs, nb = self.groups.block_size, self.groups.num_blocks
        self.rules = group_rules(self.specs, bs, mode)
        #: attention groups: a slot is 1 / block_size of a block in each
        self.slot_groups = max(1, sum(rule.attention for rule in self.rules))
        super().__init__(nb * bs // self.slot_groups, bs)
        self.mamba_cache_mode = mode
        #: prefix caching: on, except with Mamba mode "none" on a model with state layers
        self.caching = not any(s.is_state for s in self.specs) or mode != "none"
        self.pool = BlockPool(nb, bs, len(self.rules))
        self.hasher = ChainHasher(bs, self.max_context_len)
        self.memo = ChainMemo(self.hasher, len(self.rules))
        #: the state blocks the pool evicted while their full-attention KV stays cached (the
        #: reuse accounting's capacity): kept with prefix caching, state and full groups only
        self.state_evictions: StateEvictions | None = None
        full = [rule.gid for rule in self.rules if isinstance(rule, FullAttention)]
        states = [rule.gid for rule in self.rules if isinstance(rule, MambaState)]
        if self.caching and full and states:
            self.state_evictions = StateEvictions(self.pool, full, states)
            self.pool.on_unindexed = self.state_evictions.evicted
            self.pool.on_cached = self.state_evictions.cached
        self.coordinator = coordinator(self.pool, self.rules, self.specs, self.memo,
                                       self.caching, self.state_evictions)
        #: the token-to-slot page table of a full-attention model (None for a hybrid one,
        #: whose per-group block tables are its page table)
        self.req_to_token_pool: ReqToTokenPool | None = None
        self.page_table = self._page_table(config)
        self.requests: dict[int, Request] = {}
        self._skipping = [rule for rule in self.rules if rule.skips]
        self._allocating = [rule for rule in self.rules if rule.allocates]
        self._singles = [rule for rule in self.rules if isinstance(rule, MambaSingle)]
        self._takers = [rule for rule in self.rules if rule.allocates or rule in self._singles]
        self._states = [rule for rule in self.rules if isinstance(rule, MambaState)]
        #: groups holding tokens' KV: each has the unwritten tail of its last block
        self.attention_groups = sum(rule.attention for rule in self.rules)
        # per admitted request and group: its admission hit's length and where that lookup
        # ended at a miss (the index's newest caching then, or -1), handed to the memo when
        # the request is released in its prefill (prefix groups only)
        self._admit_hits: dict[int, list[tuple[int, int]]] = {}
        # statistics: tokens hit; per spec, the hit that spec alone accepted; tokens asked
        self.hit_tokens = 0
        self.spec_hits = [0] * len(self.specs)
        self.queried_tokens = 0

    def _page_table(self, config: PolicyConfig) -> PageTable:
        if config.is_hybrid:
            return GroupBlockTables(self.max_requests, [rule.columns(self.max_context_len)
                                                        for rule in self.rules])
        pool = ReqToTokenPool(self.max_requests, self.max_context_len, config.device)
        self.req_to_token_pool = pool
        if self.page_size == 1 and pool.host is not None:
            return RowBlockTables(pool)
        return TokenSlotTable(pool, self.page_size)

    @property
    def page_table_nbytes(self) -> int:
        """Device bytes of the page table (vLLM's block tables, or the token-to-slot table)."""
        return self.page_table.nbytes

    def page_table_bytes(self) -> int:
        """The token-to-slot table's device bytes for a full-attention model, else the
        per-group block tables' (`page_table_nbytes`)."""
        pool = self.req_to_token_pool
        return int(pool.nbytes) if pool is not None else int(self.page_table_nbytes)

    def _slots(self, blocks: int) -> int:
        """Blocks of the shared pool as engine slots (see `slot_groups`)."""
        return blocks * self.page_size // self.slot_groups

    # -- requests ----------------------------------------------------------------------------
    def _req(self, rid: int) -> Request:
        try:
            return self.requests[rid]
        except KeyError:
            raise ValueError(f"request {rid} is not admitted") from None

    def _reqs_of(self, rids: Sequence[int]) -> list[Request]:
        """`_req` of each, one dict read each (an unknown one raises as `_req` does)."""
        try:
            reqs = self.requests
            return [reqs[r] for r in rids]
        except KeyError:
            return [self._req(r) for r in rids]

    def _hash_to(self, req: Request, full: int) -> None:
        """Extend `req.chain` to its first `full` blocks (ids known), hashing only the new."""
        have = len(req.chain)
        if have < full:
            bs = self.page_size
            parent = int(req.chain[-1]) if have else NONE_HASH
            req.chain = np.concatenate([req.chain, self.hasher.chain(
                parent, req.ids[have * bs : full * bs])])

    # -- admission -------------------------------------------------------------------------
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        """Whole cached blocks of `token_ids` as given (the caller caps it)."""
        ids = as_ids(token_ids)
        return self.coordinator.peek(ids, len(ids)).tokens

    def peek_admission(self, token_ids: np.ndarray) -> PrefixPeek:
        """Hit blocks nobody holds sit in the free queue: admission takes them out of it
        (vLLM counts them among the blocks to allocate). `other_pools`: vLLM allocates a new
        request's blocks in every KV cache group at once (`KVCacheManager.allocate_slots`
        asks the coordinator's `get_num_blocks_to_allocate`, the sum over groups; v0.11+ to
        v0.24), Mamba state blocks included, while the engine's admission counts the prompt
        + 1 token's pages in one attention group's slots; the difference, in slots, for a
        prompt of len(token_ids) + 1 tokens."""
        ids = as_ids(token_ids)
        hit = self.coordinator.peek(ids, len(ids))
        other = self.coordinator.other_pools(hit, len(ids) + 2, self.slot_groups)
        if not hit.tokens:
            return PrefixPeek(0, 0, other)
        blocks = hit.held(self.rules)
        idle = int(np.count_nonzero(self.pool.ref_cnt[blocks] == 0))
        return PrefixPeek(hit.tokens, self._slots(idle), other)

    def admit(self, rid: int, token_ids: np.ndarray, final_len: int,
              max_new_tokens: int) -> AdmitResult | None:
        if rid in self.requests:
            raise ValueError(f"request {rid} is already admitted")
        ids = as_ids(token_ids)
        check_request_lengths(len(ids), final_len, self.max_context_len, min_prompt=1)
        non_negative_int("max_new_tokens", max_new_tokens)
        row = self.page_table.alloc_row()
        if row is None:
            return None
        bs = self.page_size
        # the prompt's chain (kept by the request) and the lookup of all but its last token
        # in one memo visit, which takes the entry out: its tokens are compared once
        e, chain = self.memo.take(ids, len(ids) // bs)
        top = len(ids) - 1
        hit = self.coordinator.admission(e, chain[: top // bs], ids, top) \
            if top >= bs and self.pool.num_indexed else self.coordinator.none
        if hit.tokens:
            self.pool.touch(hit.held(self.rules))
        tables = [self.page_table.table(row, rule.capacity(final_len)) for rule in self.rules]
        admitted = []
        for rule, table, blocks in zip(self.rules, tables, hit.tables, strict=True):
            table.append(blocks)
            table.hashed = len(blocks)
            known = e.hits[rule.gid]
            admitted.append((len(blocks), known.at if len(blocks) == len(known.blocks)
                             else -1) if isinstance(rule, FullAttention) else (0, -1))
        self._admit_hits[rid] = admitted
        req = Request(row, ids, final_len, tables)
        req.chain = chain
        req.written = hit.tokens
        if hit.tokens:
            self.page_table.write_grow(row, tables[0], 0, hit.tokens)
        self.hit_tokens += hit.tokens
        if self.caching:
            self.queried_tokens += top
            for k, a in enumerate(hit.alone):
                self.spec_hits[k] += a
        self.requests[rid] = req
        return AdmitResult(row=row, cached_len=hit.tokens, window_lost=hit.window_lost,
                           state_lost=hit.state_lost)

    # -- growth ----------------------------------------------------------------------------
    def _skip(self, reqs: Sequence[Request]) -> None:
        """vLLM's remove_skipped_blocks at each request's written tokens: blocks the next
        token does not need are freed (keeping their hash) and nulled, a request's in one
        call."""
        for req in reqs:
            w, freed = req.written, []
            for rule in self._skipping:
                freed += rule.remove_skipped(req.tables[rule.gid], w, req.skip_at)
            req.skip_at = w
            if freed:
                self.pool.free_blocks(np.array(freed, dtype=np.int64))

    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        """One engine iteration's prefill chunks: every group's blocks popped in one call
        (request by request, group by group) and the newly full blocks of every request
        cached in one call per group (`BlockPool.cache_runs`: each request still its own
        caching, in request order)."""
        reqs = self._reqs_of(rids)
        ws = [r.written for r in reqs]
        self.check_extend_args(rids, target_lens, ws, self.max_context_len)
        if self._skipping:
            self._skip(reqs)
        ts = [int(t) for t in target_lens]
        rules = self.rules
        counts = [rule.counts(reqs, ws, ts) for rule in rules]
        need = sum(map(sum, counts))
        if need > self.pool.get_num_free_blocks():
            return False
        new = self.pool.get_new_blocks(need)
        # where each request's blocks of each group start in `new`: request-major
        starts = [0, *accumulate(map(sum, zip(*counts, strict=True)))][:-1]
        fulls = self._fulls(reqs, ts) if self.caching else None
        pool = self.pool
        for j, (rule, k) in enumerate(zip(rules, counts, strict=True)):
            rule.extend(reqs, ws, ts, new, starts, k, fulls, pool)
            if j + 1 < len(rules):
                starts = [s + c for s, c in zip(starts, k, strict=True)]
        self.page_table.write_grown(reqs, ws, ts)
        for req, t in zip(reqs, ts, strict=True):
            req.written = t  # (t >= written: checked)
        return True

    def _fulls(self, reqs: Sequence[Request], ts: Sequence[int]) -> list[int]:
        """Per request growing to ts tokens, its full blocks with known ids, its chain hashed
        that far."""
        bs = self.page_size
        fulls = [min(t, len(r.ids)) // bs for r, t in zip(reqs, ts, strict=True)]
        for req, full in [(r, f) for r, f in zip(reqs, fulls, strict=True) if len(r.chain) < f]:
            self._hash_to(req, full)
        return fulls

    def decode(self, rids: Sequence[int]) -> bool:
        """One token each: `extend` by one token, with the growth each rule gives a single
        step (kvcore/vllm/group_rules.py): a block in every allocating group exactly when the
        written tokens are a multiple of the block size, a Mamba state in mode none at the
        first token, a state group's boundary state when the step ends on one. Popped request
        by request, group by group: a layout's state groups come last and are either all
        allocating or all single."""
        reqs = self._reqs_of(rids)
        self.check_distinct("decode", rids)
        written = [r.written for r in reqs]
        self.check_decode_args(rids, written, self.max_context_len)
        if self._skipping:
            self._skip(reqs)
        bs = self.page_size
        starts = [req for req, w in zip(reqs, written, strict=True) if w % bs == 0]
        need = len(starts) * len(self._allocating) + sum(
            not req.tables[rule.gid].n for rule in self._singles for req in starts)
        if need > self.pool.get_num_free_blocks():
            return False
        if not reqs:
            return True
        it = iter(self.pool.get_new_blocks(need).tolist() if need else ())
        for req in starts:
            tables = req.tables
            for rule in self._takers:
                table = tables[rule.gid]
                if rule.allocates or not table.n:
                    table.append_one(next(it))
        for state in self._states:
            for req, w in zip(reqs, written, strict=True):
                req.tables[state.gid].states.update(state.boundaries(w, w + 1))
        self.page_table.write_step(reqs, written)
        for req in reqs:
            req.written += 1
        # blocks whose ids are known fill here only when the ids run ahead of the tokens
        self._cache([r for r in reqs if r.written % bs == 0 and r.written <= len(r.ids)])
        return True

    # -- caching ---------------------------------------------------------------------------
    def _cache(self, reqs: Sequence[Request]) -> None:
        """Hash every block of `reqs` that is full and whose token ids are known, group by
        group (kvcore/vllm/group_rules.py `GroupRule.cache`): after a decode step whose ids
        ran ahead, and at `cache_prefix` / `finish`."""
        if not self.caching or not reqs:
            return
        written = [r.written for r in reqs]
        todo = [(i, r, f) for i, (r, f) in enumerate(zip(reqs, self._fulls(reqs, written),
                                                         strict=True)) if f > r.tables[0].hashed]
        if todo:
            for rule in self.rules:
                rule.cache(todo, self.pool)

    def _learn_ids(self, req: Request, ids: np.ndarray) -> None:
        ids = as_ids(ids)
        if len(ids) > len(req.ids):
            req.ids = ids

    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        req = self._req(rid)
        self._learn_ids(req, token_ids)
        self._cache([req])

    # -- ending ----------------------------------------------------------------------------
    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        self.cache_prefix(rid, token_ids)
        self.release(rid)

    def release(self, rid: int) -> None:
        """Free the request's blocks. One released in the middle of its prefill (preempted,
        or taken back when its round ran short of memory) waits for admission again with
        the same prompt: its hash chain goes back to the prompt memo, so the next peek does
        not hash the whole prompt again, and with it its admission hits: those blocks were
        held since, so none was evicted, and the next lookup walks the chain from the hit's
        end rather than from its start."""
        req = self._req(rid)
        admitted = self._admit_hits.pop(rid)
        pool = self.pool
        if req.written < len(req.ids):  # (held blocks are never popped: still indexed)
            hits = []
            for rule, table, (m, at) in zip(self.rules, req.tables, admitted, strict=True):
                hit = table.block_slice(0, m).copy()
                # its own chunks hold the miss when it cached past its hit: walk on
                hits.append(KnownHit(hit, pool.indexes[rule.gid].gen[hit],
                                     at if table.hashed == m else -1, pool.evicted_blocks))
            self.memo.keep(req.ids, req.chain, hits)
        # group by group, each table's blocks reversed, the last group's first: the blocks
        # in reverse order of allocation
        parts = [rule.held(table.blocks)[::-1]
                 for rule, table in zip(self.rules, req.tables, strict=True)]
        counts = [rule.hashed_count(table) for rule, table in zip(self.rules, req.tables,
                                                                   strict=True)]
        pool.free_blocks(np.concatenate(parts[::-1]), -1 if -1 in counts else sum(counts))
        self.page_table.free_row(req.row)
        del self.requests[rid]

    # -- the decode stretch ------------------------------------------------------------------
    def _stretch(self, rids: Sequence[int], n: int) -> Stretch | None:
        """The plan of n decode steps; None while a request knows ids beyond its written
        tokens (stepping would hash blocks as they fill: such steps are taken one by one)."""
        reqs = self._reqs_of(rids)
        return None if any(len(r.ids) > r.written for r in reqs) else Stretch(self, reqs, n)

    def decode_cost(self, rids: Sequence[int], n: int) -> int:
        """The new blocks of n steps (one per allocating group each time a request reaches
        a new block) as slots, rounded up: fitting in `available_tokens` means fitting in
        the free blocks, which the batched pops need. A request that knows ids beyond its
        written tokens is stepped: more than the pool."""
        reqs = self._reqs_of(rids)
        if any(len(r.ids) > r.written for r in reqs):
            return self.capacity + 1
        bs = self.page_size
        blocks = sum(cdiv(r.written + n, bs) - cdiv(r.written, bs) for r in reqs)
        return cdiv(blocks * len(self._allocating) * bs, self.slot_groups)

    def fresh_tokens(self) -> int:
        """Cached blocks sit in the free queue among plain free ones and a pop takes the head
        whatever it holds: the plain free blocks ahead of the first cached one."""
        return self._slots(self.pool.fresh_blocks())

    def steps_before_release(self, rids: Sequence[int], n: int) -> int:
        plan = self._stretch(rids, n)
        return n if plan is None else min(n, plan.release_step())

    def decode_profile(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        self.check_distinct("decode", rids)
        plan = self._stretch(rids, n)
        if plan is None:
            raise ValueError("decode_profile: a request knows ids beyond its written tokens")
        return plan.profile(head_reservation)

    def decode_steps(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """n decode steps with the pool calls of n `decode` calls (kvcore/vllm/stretch.py)."""
        self.check_distinct("decode", rids)
        reqs = self._reqs_of(rids)
        self.check_decode_args(rids, [r.written for r in reqs], self.max_context_len,
                               steps=n)
        # decode_cost <= available_tokens, read in blocks: every request's ids known only up
        # to its written tokens, and the stretch's pops within the free blocks
        plan = Stretch(self, reqs, n)
        if (any(len(r.ids) > r.written for r in reqs)
                or plan.need > self.pool.get_num_free_blocks()):
            raise ValueError("decode_steps needs decode_cost <= available_tokens")
        profile = plan.profile(head_reservation)
        self._before_stretch(plan)
        plan.apply()
        return profile

    def _before_stretch(self, plan: Stretch) -> None:
        """Called with a stretch's plan just before it is applied."""

    # -- observation -----------------------------------------------------------------------
    def written(self, rid: int) -> int:
        return self._req(rid).written

    def available_tokens(self) -> int:
        return self._slots(self.pool.get_num_free_blocks())

    def evictable_tokens(self) -> int:
        return self._slots(self.pool.num_cached_free)

    def tails(self, req: Request) -> tuple[int, int, int]:
        """The unwritten tails of a request's last attention blocks, one per attention group
        (a state block holds a state, not tokens; an attention group always holds the block
        of the last written token): (slots past its written tokens, the part of them up to
        its final length = reserved, the part beyond = rounding), in blocks x block_size."""
        w, bs, a = req.written, self.page_size, self.attention_groups
        if not w % bs:
            return 0, 0, 0
        end = -(-w // bs) * bs
        fin = req.final_len
        return (end - w) * a, max(min(end, fin) - w, 0) * a, max(end - max(fin, w), 0) * a

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        """The shared pool in slots: held blocks are token states, but for the unwritten
        tail of an attention group's last block (reserved up to the final length, rounding
        beyond it); hashed free blocks are cached; the rest is free. No external
        fragmentation: any free block serves."""
        non_negative_int("head_reservation", head_reservation)
        bs, pool = self.page_size, self.pool
        tokens = (self.groups.num_blocks - pool.get_num_free_blocks()) * bs
        empty = reserved = rounding = 0
        # `tails` of every request, inlined (the engine reads the breakdown every iteration)
        # and summed over one attention group, times their number after
        for r in self.requests.values() if bs > 1 else ():  # one-token blocks are never partial
            w = r.written
            if w % bs:
                end = -(-w // bs) * bs
                fin = r.final_len
                empty += end - w
                reserved += max(min(end, fin) - w, 0)
                rounding += max(end - max(fin, w), 0)
        a = self.attention_groups
        tokens, reserved, rounding = tokens - empty * a, reserved * a, rounding * a
        # the parts above are in blocks x block_size; as engine slots each is divided by
        # slot_groups (floors), and free takes the rest, so the parts still sum to capacity
        g = self.slot_groups
        tokens, cached, reserved, rounding = (tokens // g, pool.num_cached_free * bs // g,
                                              reserved // g, rounding // g)
        return MemoryBreakdown.for_pages(self.capacity, tokens, cached, reserved, rounding,
                                         self.capacity - tokens - cached - reserved - rounding)

    def page_table_entries(self) -> int:
        """The contract's sum of ceil(context / block size) over live requests: the blocks of
        one attention group's table (every attention group's table has that many positions,
        null or not)."""
        bs = self.page_size
        return sum(-(-r.written // bs) for r in self.requests.values())

    def check_invariants(self) -> None:
        """The pool's equations and, with holders(b) = the live table positions naming b:

        * ref_cnt[b] == holders(b); a block is in one group's tables, and indexed, if
          hashed, in that group's index;
        * per request: its hash chain is that of its ids; per group its rule's shape
          (`_check_table`); the first `hashed` positions of a full-attention table carry
          the chain's hashes;
        * the page table's rows (kvcore/vllm/block_table.py) and the admission hits a
          release hands to the memo are in sync;
        * the breakdown sums to the capacity, which is num_blocks x block_size over the
          attention groups."""
        pool, bs = self.pool, self.page_size
        pool.check_invariants()
        self.page_table.check_invariants(
            [(rid, r.row, r.written, r.tables[0]) for rid, r in self.requests.items()])
        holders = np.zeros(self.groups.num_blocks + 1, dtype=np.int64)
        owner = np.full(self.groups.num_blocks + 1, -1, dtype=np.int64)
        for rid, r in self.requests.items():
            if len(r.chain) and not np.array_equal(
                    self.hasher.chain(NONE_HASH, r.ids[: len(r.chain) * bs]), r.chain):
                raise InvariantError(f"vllm: request {rid} keeps a wrong hash chain")
            for rule, t in zip(self.rules, r.tables, strict=True):
                real = rule.held(t.blocks)
                if len(np.unique(real)) != len(real) or ((owner[real] != -1) &
                                                         (owner[real] != rule.gid)).any():
                    raise InvariantError(f"vllm: request {rid} holds a block twice or "
                                         "another group's block")
                owner[real] = rule.gid
                holders[real] += 1
                self._check_table(rid, r, rule, t)
        for b in np.flatnonzero(pool.ref_cnt != holders).tolist():
            raise InvariantError(f"vllm: block {b} ref {pool.ref_cnt[b]} != holders "
                                 f"{holders[b]}")
        for g, index in enumerate(pool.indexes):
            if ((owner >= 0) & (owner != g) & (index.gen > 0)).any():
                raise InvariantError(f"vllm: a block held in another group is indexed in {g}")
        self._check_admit_hits()
        if self.state_evictions is not None:
            self.state_evictions.check_invariants()
        self.breakdown(self.max_context_len).check_invariants()
        if self.groups.num_blocks * bs // self.slot_groups != self.capacity:
            raise InvariantError("vllm: capacity is not num_blocks x block size per group")

    def _check_table(self, rid: int, r: Request, rule: GroupRule, t: BlockTable) -> None:
        """One request's table in one group against its rule: full attention holds a real
        block at each of cdiv(written, bs) positions and its first `hashed` carry the
        chain's hashes; a window or state holds nothing before its last skip point, a window
        everything its next token needs, a state its running block; Mamba in mode none one
        block once anything is written."""
        bs, w, pool = self.page_size, r.written, self.pool
        blocks = t.blocks
        if isinstance(rule, MambaSingle):
            if t.n != (1 if w else 0):
                raise InvariantError(f"vllm: request {rid} holds {t.n} state blocks in mode "
                                     "none")
            return
        if t.n != cdiv(w, bs) or (t.n and t.last != blocks[-1]):
            raise InvariantError(f"vllm: request {rid} group {rule.gid} has {t.n} positions "
                                 f"for {w} tokens")
        if t.hashed > w // bs or t.hashed > len(r.chain):
            raise InvariantError(f"vllm: request {rid} hashed a partial block")
        if isinstance(rule, FullAttention):
            hb = blocks[: t.hashed]
            if (blocks == 0).any() or not (pool.is_hashed[hb].all() and np.array_equal(
                    pool.block_hash[hb], r.chain[: t.hashed])):
                raise InvariantError(f"vllm: request {rid} has a block that lost its hash")
            return
        if blocks[: rule.spec.skipped_tokens(r.skip_at) // bs].any():
            raise InvariantError(f"vllm: request {rid} group {rule.gid} keeps a block before "
                                 "its skip point")
        if isinstance(rule, MambaState):
            if w and not t.last:
                raise InvariantError(f"vllm: request {rid} lost its running state")
        elif not blocks[rule.spec.skipped_tokens(w) // bs :].all():
            raise InvariantError(f"vllm: request {rid} group {rule.gid} freed a block its "
                                 "window still needs")

    def _check_admit_hits(self) -> None:
        """The admission hits a release hands to the memo: one per admitted request and
        group, each the first blocks of its table, offered to the cache, still indexed
        (held blocks are never popped), and a miss position no newer than the index's
        newest caching."""
        if self._admit_hits.keys() != self.requests.keys():
            raise InvariantError("vllm: admission hits kept for other requests than the "
                                 "admitted")
        for rid, admitted in self._admit_hits.items():
            r = self.requests[rid]
            for (m, at), t, index in zip(admitted, r.tables, self.pool.indexes, strict=True):
                hb = t.block_slice(0, m)
                if not 0 <= m <= t.hashed or at > index.newest or not (index.gen[hb] > 0).all():
                    raise InvariantError(f"vllm: request {rid}'s admission hit is out of sync")


__all__ = ["VLLMManager", "as_ids", "layout_groups"]
