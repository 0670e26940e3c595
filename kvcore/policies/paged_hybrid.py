"""`HybridPagedPolicy`: SGLang's memory system for a hybrid model, the `paged` policy (and
`paged-nocache`) when `PolicyConfig.layout` is hybrid (registered in kvcore/policies/paged.py).

The pools are sized by `kvcore.hybrid_plan.sglang_plan` from the rank's KV budget
(`PolicyConfig.kv_bytes`), so the planner and the simulation agree: a full-attention pool and,
with sliding-window (or chunked local) layers, an SWA pool of `swa_full_tokens_ratio` x its
tokens (kvcore/swa_pool.py); with linear-attention / Mamba layers, a state pool
(kvcore/mamba_pool.py) of `mamba_full_memory_ratio` or `max_mamba_cache_size` slots. The
radix cache is kvcore/hybrid_radix_cache.py. Engine rules followed, SGLang v0.5:

* **SWA KV out of the window** (managers/schedule_batch.py, `ScheduleBatch._evict_swa`, the
  form `max(swa_evicted_seqlen, pre_len - sliding_window_size)` floored to whole pages and
  never below `cache_protected_len`, from `prepare_for_decode`): a decoding request frees the
  SWA pages of its private tokens that left the window, once every `window` decode steps
  (`decode_batch_idx % sliding_window_size == 1`: the first decode step, then every window;
  here `(steps - 1) % window == 0`, the same for windows > 1). With the radix cache nothing
  is freed during prefill (the tree owns a prefilled prefix and tombstones it under SWA
  pressure); without it (`paged-nocache`, SGLang's chunk cache) each prefill chunk frees what
  precedes its window. These frees happen before a decode or chunk allocates and are not
  undone when the allocation then fails (SGLang's order).
* **Running requests capped by state slots** (model_executor/model_runner_kv_cache_mixin.py,
  `_calculate_mamba_ratio` with the `no_buffer` Mamba scheduler strategy, v0.5's default;
  later versions default to `auto`, whose `extra_buffer` choice adds 1 or 2 slots per request
  and tracks states inside prompts, not modelled): at most `slots // 3` run with the radix
  cache (a running request's own state, the cached state its hit locks, the fork made when
  its prefix is cached), `slots // 1` without it; and at most `max_requests`. `admit`
  returns None at the cap, which the engine treats as memory it must wait for (it retries
  once a request leaves).
* **Mamba states**: a running request owns one slot from admission (`HybridReqToTokenPool`);
  a hit copies the cached state into it (copy on write); caching a running prefix forks a new
  slot (`fork_from`, skipped when no slot can be freed); a finished request's slot goes to the
  tree, or back to the pool when the tree already holds a state there.
* Eviction when a pool is short: full leaves first (their SWA pages and states go with them),
  then SWA by its own LRU (SGLang `SWARadixCache.evict` with `swa_num_tokens`); states by
  their LRU when a slot is short (`evict_mamba`).

`breakdown()` reports the full-attention pool in token slots (the engine's columns) and
`available_tokens()` is that pool's, which the engine budgets admissions on; a short SWA or
state pool shows as a failed extend / decode or a refused admission, which the engine answers
by undoing admissions or preempting (SGLang retracts). `pool_usage()` reports every pool in
bytes. No DecodeStretch: the engine steps one decode at a
time, so the periodic SWA frees happen when SGLang's do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvcore.breakdown import MemoryBreakdown
from kvcore.hybrid_plan import MAMBA_SLOTS_PER_REQUEST, HybridPlan, sglang_plan
from kvcore.hybrid_radix_cache import HybridLock, HybridRadixCache
from kvcore.layers import CHUNKED, FULL, SLIDING, HybridLayout
from kvcore.mamba_pool import MambaPool
from kvcore.policies.base import AdmitResult, PolicyConfig, PrefixPeek
from kvcore.policies.capabilities import PoolKinds, PoolUsage, PrefixCache
from kvcore.radix_node import as_key
from kvcore.req_to_token_pool import ReqToTokenPool
from kvcore.swa_pool import SWAPagePool
from kvcore.validation import InvariantError, positive_int

__all__ = ["MAMBA_SLOTS_PER_REQUEST", "HybridPagedPolicy"]



@dataclass
class _Req:
    """A running request: its page-table row, tokens written, tokens the tree owns (locked
    through `lock`), final length, tokens [cached, swa_evicted) whose SWA KV is freed, decode
    steps taken, and its own state slot (-1: no state layers)."""

    row: int
    written: int
    cached: int
    final: int
    swa_evicted: int
    lock: HybridLock
    state: int
    decodes: int = 0


def _ceil_to(x: int, ps: int) -> int:
    return (x + ps - 1) // ps * ps


class HybridPagedPolicy(PrefixCache, PoolKinds):
    """SGLang's full + SWA pools, Mamba state pool and hybrid radix cache."""

    name = "paged"

    def __init__(self, config: PolicyConfig, cache_enabled: bool = True) -> None:
        layout = config.layout
        if layout is None or not layout.is_hybrid:
            raise ValueError("HybridPagedPolicy needs a hybrid layout (PolicyConfig.layout)")
        ps = positive_int("page_size", config.page_size)
        if config.kv_bytes <= 0:
            raise ValueError(f"kv_bytes must be > 0 for a hybrid layout (the KV budget of one "
                             f"rank in bytes), got {config.kv_bytes}")
        self.layout: HybridLayout = layout
        self.config = config
        self.plan: HybridPlan = sglang_plan(
            layout, config.kv_bytes, config.max_context_len, kv_dtype=config.kv_dtype,
            page_size=ps, swa_full_tokens_ratio=config.swa_full_tokens_ratio,
            mamba_full_memory_ratio=config.mamba_full_memory_ratio,
            max_mamba_cache_size=config.max_mamba_cache_size or None)
        full_pages = self.plan.kv_cache_tokens // ps
        if full_pages < 1:
            raise ValueError(f"kv_bytes {config.kv_bytes:,} holds less than one page of "
                             f"{ps} full-attention tokens")
        super().__init__(full_pages * ps, ps)
        windowed = [g for g in layout.attention_groups() if g.kind in (SLIDING, CHUNKED)]
        self.window: int | None = max(g.window or g.chunk for g in windowed) if windowed \
            else None
        swa_tokens = next((p.tokens for p in self.plan.pools if p.kind in (SLIDING, CHUNKED)),
                          0)
        if windowed and swa_tokens < ps:
            raise ValueError(f"the SWA pool ({swa_tokens} tokens) is smaller than one page")
        self.swa_kind = "swa" if any(g.kind == SLIDING for g in windowed) else "chunked"
        dt = config.kv_dtype
        self.full_bpt = sum(g.kv_bytes_per_token(dt) for g in layout.groups if g.kind == FULL)
        self.swa_bpt = sum(g.kv_bytes_per_token(dt) for g in windowed)
        self.state_bytes = layout.state_bytes_per_request(dt)
        slots = next((p.pages for p in self.plan.pools if p.note == "state slots"), 0)
        self.pool = SWAPagePool(full_pages, swa_tokens // ps, ps, config.device)
        self.states = MambaPool(slots, self.state_bytes, config.device, config.store_kv) \
            if self.state_bytes else None
        self.tree = HybridRadixCache(ps, self.pool, self.window, self.states,
                                     eviction=config.eviction, disable=not cache_enabled)
        self.req_to_token_pool = ReqToTokenPool(config.max_requests, config.max_context_len,
                                                config.device)
        self.max_running = config.max_requests
        if self.states is not None:
            per = MAMBA_SLOTS_PER_REQUEST if cache_enabled else 1
            self.max_running = min(self.max_running, slots // per)
            if self.max_running < 1:
                raise ValueError(f"{slots} Mamba state slots run no request: SGLang needs "
                                 f"{per} per running request (raise max_mamba_cache_size)")
        self._reqs: dict[int, _Req] = {}
        self._hit = self._queried = 0

    # -- helpers ---------------------------------------------------------------------------
    def _req(self, rid: int) -> _Req:
        r = self._reqs.get(rid)
        if r is None:
            raise ValueError(f"request {rid} is not admitted")
        return r

    def _pages_at(self, row: int, start: int, end: int) -> np.ndarray:
        """Pages behind positions [start, end) of a row (`start` page-aligned)."""
        if end <= start:
            return np.zeros(0, dtype=np.int64)
        ps = self.page_size
        return self.req_to_token_pool.read_at(row, slice(start, end, ps)).astype(np.int64) // ps

    def _free_positions(self, r: _Req, start: int, end: int) -> None:
        """Free the request's own pages behind [start, end), SWA pages included."""
        self.pool.free(self._pages_at(r.row, start, end))

    def _make_room(self, pages: int) -> bool:
        """Evict so that `pages` full pages and as many SWA pages are free, if the cache can
        give them: full leaves first, then SWA by its own LRU."""
        if pages <= 0:
            return True
        full_ok, swa_ok = self.pool.can_take(pages)
        if not full_ok:
            self.tree.evict((pages - self.pool.full.free_page_count()) * self.page_size)
            full_ok, swa_ok = self.pool.can_take(pages)
        if full_ok and not swa_ok:
            self.tree.evict_swa(pages - self.pool.swa_free_pages())
            full_ok, swa_ok = self.pool.can_take(pages)
        return full_ok and swa_ok

    def _alloc_state(self) -> int | None:
        assert self.states is not None
        slot = self.states.alloc()
        if slot is None and self.tree.evict_states(1):
            slot = self.states.alloc()
        return slot

    def _release_window(self, r: _Req, pre_len: int) -> None:
        """SGLang `_evict_swa(req, pre_len)`: free the SWA pages of the request's own tokens
        before `pre_len - window`, in whole pages, never below what the tree owns."""
        assert self.window is not None
        r.swa_evicted = max(r.swa_evicted, r.cached)
        new = max(r.swa_evicted, pre_len - self.window) // self.page_size * self.page_size
        if new > r.swa_evicted:
            self.pool.free_swa(self._pages_at(r.row, r.swa_evicted, new))
            r.swa_evicted = new

    def _grow(self, r: _Req, target: int) -> None:
        """Write slots for [written, target) (room made by the caller) and give the new full
        pages their SWA pages."""
        w, ps = r.written, self.page_size
        table = self.req_to_token_pool
        last = int(table.read_at(r.row, w - 1)) if w else -1
        out = self.pool.full.alloc_extend_one(w, target, last)
        assert out is not None, "room was made for this allocation"
        table.write_range(r.row, w, out)
        first_new = _ceil_to(w, ps) - w  # index in `out` of the first token on a new page
        self.pool.map_new(out[first_new::ps] // ps)
        r.written = target

    # -- admission -------------------------------------------------------------------------
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        return self.tree.peek_hybrid(token_ids)[0]

    def peek_admission(self, token_ids: np.ndarray) -> PrefixPeek:
        """`other_pools`: SGLang v0.5's PrefillAdder budgets a hybrid SWA model on the smaller
        of the two pools (`rem_total_tokens`: min of full and SWA available + evictable,
        managers/schedule_policy.py), so what the full pool has beyond the SWA pool is not
        available (the SWA walk only when the SWA pool's free pages alone fall short)."""
        hit, evictable = self.tree.peek_hybrid(token_ids)
        if self.pool.swa is None:
            return PrefixPeek(hit, evictable)
        avail, swa = self.available_tokens(), self.pool.swa_free_pages() * self.page_size
        if swa < avail:
            swa += self.tree.swa_sizes()[0]
        return PrefixPeek(hit, evictable, max(avail - swa, 0))

    def admit(self, rid: int, token_ids: np.ndarray, final_len: int,
              max_new_tokens: int) -> AdmitResult | None:
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already admitted")
        table = self.req_to_token_pool
        if final_len > table.max_context_len:
            raise ValueError(f"final length {final_len} exceeds max_context_len "
                             f"{table.max_context_len}")
        if len(self._reqs) >= self.max_running:
            return None
        row = table.alloc_row()
        if row is None:
            return None
        key = as_key(token_ids)[: max(len(token_ids) - 1, 0)]
        token_hit = 0 if self.tree.disable else self.tree.peek(key)[1]
        cuts = self.tree.reuse_cuts(key)
        indices, node = self.tree.match(key)
        lock = self.tree.lock(node)
        state = -1
        if self.states is not None:
            slot = self._alloc_state()
            if slot is None:
                self.tree.unlock(lock)
                table.free_row(row)
                return None
            state = slot
            if len(indices):  # copy on write: the cached state into the request's slot
                self.states.copy(node.state, state)
        cached = len(indices)
        if cached:
            table.write_range(row, 0, indices)
        self._queried += len(key)
        self._hit += cached
        self._reqs[rid] = _Req(row, cached, cached, final_len, cached, lock, state)
        # past a page-aligned match only where the page was the cut, not a window or state
        token_hit = max(token_hit, cached) if cached == cuts.content else cached
        return AdmitResult(row, cached, token_hit, window_lost=cuts.content - cuts.windowed,
                           state_lost=cuts.windowed - cuts.boundary)

    # -- growth ----------------------------------------------------------------------------
    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        reqs = [self._req(rid) for rid in rids]
        self.check_extend_args(rids, target_lens, [r.written for r in reqs],
                               self.req_to_token_pool.max_context_len)
        ps = self.page_size
        if self.window is not None and self.tree.disable:  # chunk cache: free before chunk
            for r in reqs:
                self._release_window(r, r.written)
        need = sum(_ceil_to(int(t), ps) // ps - _ceil_to(r.written, ps) // ps
                   for r, t in zip(reqs, target_lens, strict=True))
        if not self._make_room(need):
            return False
        for r, t in zip(reqs, target_lens, strict=True):
            if int(t) > r.written:
                self._grow(r, int(t))
        return True

    def decode(self, rids: Sequence[int]) -> bool:
        self.check_distinct("decode", rids)
        reqs = [self._req(rid) for rid in rids]
        self.check_decode_args(rids, [r.written for r in reqs],
                               self.req_to_token_pool.max_context_len)
        ps, window = self.page_size, self.window
        for r in reqs:
            r.decodes += 1
            if window is not None and (r.decodes - 1) % window == 0:
                self._release_window(r, r.written)
        if not self._make_room(sum(1 for r in reqs if r.written % ps == 0)):
            return False
        for r in reqs:
            self._grow(r, r.written + 1)
        return True

    # -- ending ----------------------------------------------------------------------------
    def _insert(self, r: _Req, token_ids: np.ndarray, state: int):
        """Insert the request's whole written pages; free its duplicates. Returns (kept,
        node, adopted) as HybridRadixCache.insert_hybrid."""
        w = r.written
        if len(token_ids) < w:
            raise ValueError(f"need {w} token ids for row {r.row}, got {len(token_ids)}")
        n = w - w % self.page_size
        row_slots = self.req_to_token_pool.read_at(r.row, slice(0, n))
        dup, kept, node, adopted = self.tree.insert_hybrid(
            as_key(token_ids)[:n], row_slots, r.cached, r.swa_evicted, state)
        self._free_positions(r, r.cached, dup)
        return kept, node, adopted

    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        if self.tree.disable:
            return
        r = self._req(rid)
        n = r.written - r.written % self.page_size
        if n <= r.cached or r.swa_evicted > r.cached:
            # nothing new, or decoding already freed SWA KV of its own tokens: SGLang caches a
            # running request only between prefill chunks (cache_unfinished_req), before any
            return
        fork = -1
        if self.states is not None:  # the tree gets a copy; the request keeps running
            slot = self._alloc_state()
            if slot is None:
                return  # no state slot to snapshot into: cache nothing now
            fork = slot
            self.states.copy(r.state, fork)
        kept, node, adopted = self._insert(r, token_ids, fork)
        if fork >= 0 and not adopted:
            assert self.states is not None
            self.states.free(fork)
        if node is None:
            return
        indices, mnode = self.tree.match(as_key(token_ids)[:kept])
        if len(indices) != kept:
            raise InvariantError(f"request {rid}: its cached prefix re-matched {len(indices)} "
                                 f"of {kept} tokens")
        self.req_to_token_pool.write_range(r.row, r.cached, indices[r.cached:])
        lock = self.tree.lock(mnode)
        self.tree.unlock(r.lock)
        r.lock, r.cached = lock, kept
        r.swa_evicted = max(r.swa_evicted, kept)

    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        r = self._req(rid)
        if self.tree.disable:
            self._free_positions(r, 0, r.written)
            kept, adopted = 0, False
        else:
            kept, _, adopted = self._insert(r, token_ids, r.state)
            self._free_positions(r, kept, r.written)
        if r.state >= 0 and not adopted:
            assert self.states is not None
            self.states.free(r.state)
        self._drop(rid, r)

    def release(self, rid: int) -> None:
        r = self._req(rid)
        self._free_positions(r, r.cached, r.written)
        if r.state >= 0:
            assert self.states is not None
            self.states.free(r.state)
        self._drop(rid, r)

    def _drop(self, rid: int, r: _Req) -> None:
        self.tree.unlock(r.lock)
        self.req_to_token_pool.free_row(r.row)
        del self._reqs[rid]

    # -- observation -----------------------------------------------------------------------
    def written(self, rid: int) -> int:
        return self._req(rid).written

    def available_tokens(self) -> int:
        return self.pool.full.available_size() + self.tree.evictable_size()

    def evictable_tokens(self) -> int:
        return self.tree.evictable_size()

    def free_tokens(self) -> int:
        return self.pool.full.available_size()

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        """The full-attention pool, as `paged` reports its one pool."""
        ps = self.page_size
        written = sum(r.written for r in self._reqs.values())
        end = sum(_ceil_to(r.written, ps) for r in self._reqs.values())
        rounding = sum(max(_ceil_to(r.written, ps) - r.final, 0) for r in self._reqs.values())
        cached = sum(r.cached for r in self._reqs.values())
        return MemoryBreakdown.for_pages(
            self.capacity, token_states=self.tree.protected_size() + written - cached,
            cached=self.tree.evictable_size(), reserved=end - written - rounding,
            rounding=rounding, free=self.pool.full.available_size())

    def page_table_entries(self) -> int:
        ps = self.page_size
        return sum(_ceil_to(r.written, ps) // ps for r in self._reqs.values())

    def pool_usage(self) -> dict[str, PoolUsage]:
        """Each pool in bytes. Every kind served the same hit: SGLang matches one tree, and a
        hit needs the full KV, the SWA KV of its last window and a state at its end."""
        ps, hit, q = self.page_size, self._hit, self._queried
        full_used = self.capacity - self.pool.full.available_size()
        out = {"full": PoolUsage("full", self.capacity * self.full_bpt, full_used * self.full_bpt,
                                 self.tree.evictable_size() * self.full_bpt, hit, q)}
        if self.pool.swa is not None:
            swa_ev = self.tree.swa_sizes()[0]
            out[self.swa_kind] = PoolUsage(
                self.swa_kind, self.pool.swa.num_pages * ps * self.swa_bpt,
                self.pool.swa_used_pages() * ps * self.swa_bpt, swa_ev * self.swa_bpt, hit, q)
        if self.states is not None:
            sb = self.state_bytes
            out["mamba"] = PoolUsage("mamba", self.states.size * sb, self.states.used_size() * sb,
                                     self.tree.state_sizes()[0] * sb, hit, q)
        return out

    def check_invariants(self) -> None:
        ps = self.page_size
        self.pool.check_invariants()
        self.tree.check_invariants()
        self.req_to_token_pool.check_invariants()
        if len(self._reqs) > self.max_running:
            raise InvariantError(f"{len(self._reqs)} running > cap {self.max_running}")
        owned = [self.pool.full.free_pages_view().numpy(),
                 self.tree.all_values().numpy()[::ps] // ps]
        own_states = []
        for rid, r in self._reqs.items():
            w, c = r.written, r.cached
            if c % ps or r.swa_evicted % ps or not 0 <= c <= w <= r.final:
                raise InvariantError(f"request {rid}: cached {c} / written {w} / final "
                                     f"{r.final} / swa_evicted {r.swa_evicted} out of order")
            slots = self.req_to_token_pool.read_at(r.row, slice(0, w)).astype(np.int64)
            if ((slots % ps) != (np.arange(w) % ps)).any() or (slots < ps).any():
                raise InvariantError(f"request {rid}: slot not at its page offset (or dummy)")
            own = slots[c::ps] // ps
            owned.append(own)
            pos = np.arange(c, w, ps)
            if self.window is not None:
                want = pos >= r.swa_evicted
                if (self.pool.has_swa(own) != want).any():
                    raise InvariantError(f"request {rid}: SWA pages disagree with "
                                         f"swa_evicted {r.swa_evicted}")
                lo = max(0, w - self.window)
                if not self.pool.has_swa(slots[lo:w] // ps).all():
                    raise InvariantError(f"request {rid}: a freed SWA page is in its window "
                                         f"[{lo}, {w})")
            depth = sum(len(n.key) for n in r.lock.node.path_to_root())
            if not self.tree.disable and depth != c:
                raise InvariantError(f"request {rid}: locked node depth {depth} != cached {c}")
            if r.state >= 0:
                own_states.append(r.state)
        pages = np.concatenate(owned)
        counts = np.bincount(pages, minlength=self.pool.full.num_pages + 1)
        if counts.max() > 1 or counts[0] or len(pages) != self.pool.full.num_pages:
            raise InvariantError(f"full pages: free + cached + private = {len(pages)} (pages "
                                 f"owned twice: {np.flatnonzero(counts > 1)[:8].tolist()}), "
                                 f"capacity {self.pool.full.num_pages}")
        if self.states is not None:
            held = own_states + self.tree.node_states()
            if len(set(held)) != len(held) or len(held) != self.states.used_size():
                raise InvariantError(f"state slots in use {self.states.used_size()} != "
                                     f"running {len(own_states)} + cached "
                                     f"{len(self.tree.node_states())}")
            self.states.check_invariants()
        self.tree.check_locks([r.lock for r in self._reqs.values()])
        self.breakdown(ps).check_invariants()

    def close(self) -> None:
        if self.states is not None:
            self.states.buffer = None
