"""`SGLangPolicy`: SGLang's memory system as one manager for every layout, the `paged` and
`paged-nocache` policies (built in kvcore/sglang/__init__.py).

Full attention is the layout with no side pool: a `PagedAllocator` and a `RadixCache`. A hybrid
layout adds side pools (kvcore/sglang/pools.py: sliding-window KV allocated with the full
pages, Mamba state slots), each a `PoolKind` (kvcore/sglang/pool_kind.py) that the one radix
cache and this manager call at the same steps; a host (and storage) tier is the `HiCache`
member (kvcore/sglang/hicache.py). The manager's steps are the same for every layout.

Per request the page table row holds, left to right:

    [0, cached)              slots owned by the radix tree, locked via `node` while it runs
    [cached, written)        private slots the request wrote
    [written, ceil_ps(written))  the rest of its last private page: its next decode tokens

`cached` is always page-aligned (the tree only holds whole pages). Per-row state lives in numpy
arrays indexed by row so that batched calls touch the whole batch at once. The page table is
written only through `ReqToTokenPool` (numpy in, a numpy view of the table on CPU).

The breakdown reports the full-attention pool in token slots (the engine's columns) and
`available_tokens()` is that pool's, which the engine budgets admissions on; a short side pool
shows as a failed extend / decode or a refused admission, which the engine answers by undoing
admissions or preempting (SGLang retracts). The breakdown's sums over the rows are running
totals (kvcore/sglang/totals.py `Totals`) that each call updates for the rows it touches;
`check_invariants` compares them with a recount.

The engine asks what a policy can do by its class (kvcore/contract/capabilities.py), so the
capabilities a layout has are the classes at the end: full attention adds `DecodeStretch` (its
decode only grows the full pool, so n steps have a closed form), a host tier `LowerTiers`, side
pools `PoolKinds` (they step one decode at a time: a sliding window's frees happen when
SGLang's do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from kvcore.contract.breakdown import PARTS, MemoryBreakdown
from kvcore.contract.capabilities import (
    DecodeStretch,
    LowerTiers,
    PoolKinds,
    PoolUsage,
    PrefixCache,
)
from kvcore.contract.policy import AdmitResult, PolicyConfig, PrefixPeek
from kvcore.contract.req_to_token_pool import ReqToTokenPool, step_column
from kvcore.contract.tiers import TierHit, TierState
from kvcore.contract.validation import InvariantError
from kvcore.sglang.hicache import HiCache
from kvcore.sglang.node import TreeNode, as_key
from kvcore.sglang.pools import layout_pools
from kvcore.sglang.radix_cache import RadixCache
from kvcore.sglang.stretch import plan_stretch, steps_within, stretch_profile, stretch_slots
from kvcore.sglang.totals import Totals, grow_totals, recount_totals

__all__ = ["FullAttentionPolicy", "PoolKindsPolicy", "SGLangPolicy", "TieredPolicy"]

_I64 = torch.int64
_CACHED, _FREE = PARTS.index("cached"), PARTS.index("free")
_Len = TypeVar("_Len", int, np.ndarray)


def _ceil_to(x: _Len, ps: int) -> _Len:
    return (x + (ps - 1)) // ps * ps


class SGLangPolicy(PrefixCache):
    """Pages on demand, a shared radix prefix cache, LRU eviction of unlocked leaves; side pools
    and a host tier as the layout and configuration ask."""

    def __init__(self, config: PolicyConfig, cache_enabled: bool = True) -> None:
        pools = layout_pools(config, cache_enabled)
        ps = config.page_size
        super().__init__(pools.allocator.num_pages * ps, ps)
        self.name = "paged" if cache_enabled else "paged-nocache"
        self.config = config
        self.pools = pools
        self.allocator = pools.allocator
        self.kinds = pools.kinds
        self.req_to_token_pool = ReqToTokenPool(
            config.max_requests, config.max_context_len, config.device
        )
        self.tree = RadixCache(ps, self.allocator, eviction=config.eviction,
                               disable=not cache_enabled, kinds=self.kinds)
        for kind in self.kinds:
            kind.attach(self.tree, self.req_to_token_pool)
        caps = [kind.running_cap(cache_enabled) for kind in self.kinds]
        self.max_running = min([config.max_requests, *(c for c in caps if c is not None)])
        # the tier member exists exactly when the class declares the capability
        self.tiers = HiCache(config.tier_config, self.tree, self.allocator) \
            if isinstance(self, LowerTiers) else None
        rows = config.max_requests + 1
        self._written = np.zeros(rows, dtype=np.int64)
        self._cached = np.zeros(rows, dtype=np.int64)
        self._final = np.zeros(rows, dtype=np.int64)
        self._node: list[TreeNode | None] = [None] * rows
        self._row_of: dict[int, int] = {}
        self._members = 0  # bumped when the set of admitted requests changes (keys _rows_memo)
        self._rows_memo: tuple[int, list[int], np.ndarray] | None = None
        self._epoch = 0  # bumped by every mutating call; keys the breakdown memo
        self._breakdown_cache: tuple[int, int, MemoryBreakdown] | None = None
        self._tot = Totals()
        self._hit = self._queried = 0  # prefix tokens admissions got and asked for

    # -- helpers ---------------------------------------------------------------------------
    def row_of(self, rid: int) -> int:
        """The page-table row of an admitted request."""
        row = self._row_of.get(rid)
        if row is None:
            raise ValueError(f"request {rid} is not admitted")
        return row

    def _rows(self, rids: Sequence[int], op: str) -> np.ndarray:
        """Page-table rows of `rids` (each admitted, none twice: `op` names the call in the
        error). The engine asks about the same running list several times per pass (cost,
        profile, steps), so the last answer is kept until the list or the set of admitted
        requests changes; a kept list was checked when it was first seen."""
        memo = self._rows_memo
        if memo is not None and memo[0] == self._members and type(rids) is list \
                and memo[1] == rids:
            return memo[2]
        try:
            rows = np.fromiter(map(self._row_of.__getitem__, rids), dtype=np.int64,
                               count=len(rids))
        except KeyError as e:
            raise ValueError(f"request {e.args[0]} is not admitted") from None
        self.check_distinct(op, rids)
        self._rows_memo = (self._members, list(rids), rows)
        return rows

    def _make_room(self, slots: int) -> None:
        """Evict cache so that `slots` are free in the full pool, if the cache can give them,
        then let each side pool free its share of those pages."""
        short = slots - self.allocator.available_size()
        if short > 0:
            self.tree.evict(short)
        for kind in self.kinds:
            kind.make_room(slots // self.page_size)

    def _last_loc(self, rows: np.ndarray, written: np.ndarray) -> np.ndarray:
        """Slot of each row's last written token. Where a row wrote none the value is
        meaningless, and no caller reads it: such a row's next token starts a new page."""
        return self.req_to_token_pool.read_at(rows, written - 1)

    def _free_positions(self, row: int, start: int, end: int) -> None:
        """Free the pages behind positions [start, end) of a row. `start` is page-aligned and
        the pages are the row's own, so each page is freed once, with no sort."""
        ps = self.page_size
        read = self.req_to_token_pool.read_at
        if end - start > ps:
            firsts = read(row, slice(start, end, ps))  # first slot of each page
            self.allocator.push_host(firsts // ps if ps > 1 else firsts)
        elif end > start:  # one page (a finished request's partial last page)
            self.allocator.free_page(int(read(row, start)) // ps)

    def _lock(self, row: int, node: TreeNode) -> None:
        self.tree.inc_lock_ref(node)
        for kind in self.kinds:
            kind.lock(row, node)

    def _unlock(self, row: int, node: TreeNode) -> None:
        self.tree.dec_lock_ref(node)
        for kind in self.kinds:
            kind.unlock(row, node)

    def _move_lock(self, row: int, old: TreeNode, new: TreeNode) -> None:
        """The request on `row` now holds the prefix ending at `new` instead of `old` (full KV
        locked before it is unlocked, so no shared node is evictable in between)."""
        self.tree.inc_lock_ref(new)
        self.tree.dec_lock_ref(old)
        for kind in self.kinds:
            kind.unlock(row, old)
            kind.lock(row, new)

    # -- admission -------------------------------------------------------------------------
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        return self.tree.peek(token_ids)[0]

    def peek_admission(self, token_ids: np.ndarray) -> PrefixPeek:
        hit, evictable = self.tree.peek_evictable(token_ids)
        other = 0
        for kind in self.kinds:
            other += kind.other_pools(self.available_tokens())
        return PrefixPeek(hit, evictable, other)

    def admit(
        self, rid: int, token_ids: np.ndarray, final_len: int, max_new_tokens: int
    ) -> AdmitResult | None:
        return self._admit(rid, token_ids, final_len, 0)

    def _admit(self, rid: int, token_ids: np.ndarray, final_len: int,
               storage_allowance: int) -> AdmitResult | None:
        """`admit`; a host tier may load up to `storage_allowance` tokens from storage."""
        self._epoch += 1
        if rid in self._row_of:
            raise ValueError(f"request {rid} is already admitted")
        if final_len > self.req_to_token_pool.max_context_len:
            raise ValueError(
                f"final length {final_len} exceeds max_context_len "
                f"{self.req_to_token_pool.max_context_len}"
            )
        if len(self._row_of) >= self.max_running:
            return None
        row = self.req_to_token_pool.alloc_row()
        if row is None:
            return None
        key = as_key(token_ids)[: max(len(token_ids) - 1, 0)]
        match = self.tree.match_prefix(key)
        token_hit, node = match.token_hit, match.last_node
        self._lock(row, node)
        host = storage = 0
        if self.tiers is not None:
            match, host, storage = self.tiers.load(rid, key, match, storage_allowance)
            if match.last_node is not node:  # the loaded pages extend the held prefix
                self._move_lock(row, node, match.last_node)
                node = match.last_node
        cached = len(match.indices)
        for kind in self.kinds:
            if not kind.admit(row, node, cached):  # its pool is short: wait as for memory
                self._unlock(row, node)
                for k in self.kinds:
                    k.drop(row)
                self.req_to_token_pool.free_row(row)
                return None
        if cached:
            self.req_to_token_pool.write_range(row, 0, match.indices)
        self._members += 1
        self._row_of[rid] = row
        self._written[row] = cached
        self._cached[row] = cached
        self._final[row] = final_len
        self._node[row] = node
        tot, end = self._tot, _ceil_to(cached, self.page_size)
        tot.written += cached
        tot.cached += cached
        tot.end += end
        tot.rounding += max(end - final_len, 0)
        self._queried += len(key)
        self._hit += cached
        if not match.cuts:  # full attention (or the cache off): no rule but the page's
            return AdmitResult(row, cached, max(token_hit, cached), host, storage)
        lost = {"window": 0, "state": 0}
        for kind, before, after in zip(self.kinds, match.cuts[:-1], match.cuts[1:], strict=True):
            lost[kind.rule] += before - after
        # the token-level hit goes past the page-aligned match only where the page was the
        # cut, not a window or state rule (nor a state the pool evicted)
        return AdmitResult(row, cached, max(token_hit, cached) if cached == match.cuts[0]
                           else cached, host, storage, window_lost=lost["window"],
                           state_lost=lost["state"])

    # -- growth ----------------------------------------------------------------------------
    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        self._epoch += 1
        ps = self.page_size
        max_len = self.req_to_token_pool.max_context_len
        table = self.req_to_token_pool
        if len(rids) == 1:  # one prefill chunk (the common case): scalar arithmetic
            row = self.row_of(rids[0])
            w = int(self._written[row])
            self.check_extend_args(rids, target_lens, (w,), max_len)
            t = int(target_lens[0])
            for kind in self.kinds:
                kind.before_extend((row,), (w,), (int(self._cached[row]),))
            self._make_room(_ceil_to(t, ps) - _ceil_to(w, ps))
            last = int(table.read_at(row, w - 1)) if w else -1
            out = self.allocator.alloc_extend_one(w, t, last)
            if out is None:
                return False
            table.write_range(row, w, out)
            self._written[row] = t
            tot, f = self._tot, int(self._final[row])
            e0, e1 = _ceil_to(w, ps), _ceil_to(t, ps)
            tot.written += t - w
            tot.end += e1 - e0
            tot.rounding += max(e1 - f, 0) - max(e0 - f, 0)
            return True
        rows = self._rows(rids, "extend")
        w = self._written[rows]
        self.check_extend_args(rids, target_lens, w, max_len)
        target = np.asarray(target_lens, dtype=np.int64)
        for kind in self.kinds:
            kind.before_extend(rows, w, self._cached[rows])
        self._make_room(int((_ceil_to(target, ps) - _ceil_to(w, ps)).sum()))
        out = self.allocator.alloc_extend_host(w, target, self._last_loc(rows, w))
        if out is None:
            return False
        ext = target - w
        pos = np.arange(len(out)) + np.repeat(w - (np.cumsum(ext) - ext), ext)
        table.write_at(np.repeat(rows, ext), pos, out)
        self._written[rows] = target
        grow_totals(self._tot, ps, self._final[rows], w, target)
        return True

    def decode(self, rids: Sequence[int]) -> bool:
        self._epoch += 1
        rows = self._rows(rids, "decode")
        w = self._written[rows]
        wl = w.tolist()  # a few dozen Python ints: cheaper to scan than numpy calls
        self.check_decode_args(rids, wl, self.req_to_token_pool.max_context_len)
        for kind in self.kinds:
            kind.before_decode(rows, w, self._cached[rows])
        ps = self.page_size
        # the requests whose next token starts a new page (a few per step, so the totals
        # below take them one by one)
        need = self.allocator.fresh_page_rows(wl)
        n_new, w1 = len(need), w + 1
        self._make_room(n_new * ps)
        out = self.allocator.alloc_decode_rows(need, len(wl), lambda: self._last_loc(rows, w))
        if out is None:
            return False
        self.req_to_token_pool.write_run(rows, w, 1, out, max(wl, default=0))
        self._written[rows] = w1
        tot, final = self._tot, self._final
        tot.written += len(wl)
        tot.end += n_new * ps  # only a new page moves a row's end (by one page)...
        for i in need:  # ... and its rounding
            start, f = wl[i], final.item(rows.item(i))
            tot.rounding += max(start + ps - f, 0) - max(start - f, 0)
        return True

    # -- caching ---------------------------------------------------------------------------
    def _insert_written(self, row: int, token_ids: np.ndarray, n: int,
                        cached: int) -> tuple[int, TreeNode | None, bool]:
        """Insert the row's first `n` tokens (its whole written pages, n > cached) into the
        tree; free the request's own copies of pages someone else cached meanwhile. Returns
        (the prefix the tree now holds for it, the node ending there or None when nothing was
        inserted, whether the tree holds exactly the row's slots)."""
        for kind in self.kinds:
            if not kind.keeps(row, n):
                return cached, None, True
        key = as_key(token_ids)[:n]
        # the int32 row itself: the tree copies (as int64) only the part it did not have
        row_slots = self.req_to_token_pool.row_prefix(row, n)
        # the walk starts at the row's locked node: its path is token_ids[:cached] already
        already, node = self.tree.insert(key, row_slots, self._node[row], cached)
        for kind in self.kinds:
            kind.inserted(row, node, cached, already, n)
        if self.tiers is not None:
            self.tiers.inserted(key)
        self._free_positions(row, cached, already)
        return n, node, already == cached

    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        self._epoch += 1
        if self.tree.disable:
            return
        row = self.row_of(rid)
        self._cache_running(row, token_ids)
        if self.tiers is not None:
            self.tiers.landed(rid)  # prefill done: the load has landed

    def _cache_running(self, row: int, token_ids: np.ndarray) -> None:
        w, cached = int(self._written[row]), int(self._cached[row])
        n = w - w % self.page_size
        if len(token_ids) < w:
            raise ValueError(f"need {w} token ids for row {row}, got {len(token_ids)}")
        if n <= cached:
            return
        for kind in self.kinds:
            if not kind.may_cache(row, cached):
                return
        for kind in self.kinds:
            if not kind.offer(row, finishing=False):
                for k in self.kinds:
                    k.settle(row)
                return
        n, node, all_ours = self._insert_written(row, token_ids, n, cached)
        for kind in self.kinds:
            kind.settle(row)
        if node is None:
            return
        if all_ours:
            # the tree now holds exactly this row's slots for [0, n): no re-match, no rewrite
            # of the row; touch the path as the match would (LRU clock, hit counts)
            self.tree.touch_path(node)
        else:
            match = self.tree.match_prefix(as_key(token_ids)[:n])
            if len(match.indices) != n:
                raise InvariantError(f"row {row}: its cached prefix re-matched "
                                     f"{len(match.indices)} of {n} tokens")
            self.req_to_token_pool.write_range(row, cached, match.indices[cached:])
            node = match.last_node
        old = self._node[row]
        assert old is not None  # an admitted row holds its match (the root when none)
        self._move_lock(row, old, node)
        self._node[row] = node
        self._tot.cached += n - cached
        self._cached[row] = n
        for kind in self.kinds:
            kind.cached_to(row, n)

    # -- ending ----------------------------------------------------------------------------
    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        self._epoch += 1
        row = self.row_of(rid)
        w, cached = int(self._written[row]), int(self._cached[row])
        if len(token_ids) < w and not self.tree.disable:
            raise ValueError(f"need {w} token ids for row {row}, got {len(token_ids)}")
        for kind in self.kinds:
            kind.offer(row, finishing=True)
        if self.tree.disable:
            self._free_positions(row, 0, w)
        else:
            n = w - w % self.page_size
            kept = self._insert_written(row, token_ids, n, cached)[0] if n > cached else cached
            self._free_positions(row, kept, w)
        for kind in self.kinds:
            kind.settle(row)
        self._drop(rid, row)

    def release(self, rid: int) -> None:
        self._epoch += 1
        row = self.row_of(rid)
        self._free_positions(row, int(self._cached[row]), int(self._written[row]))
        for kind in self.kinds:
            kind.release(row)
        self._drop(rid, row)

    def _drop(self, rid: int, row: int) -> None:
        if self.tiers is not None:
            self.tiers.landed(rid)
        tot, w, f = self._tot, int(self._written[row]), int(self._final[row])
        end = _ceil_to(w, self.page_size)
        tot.written -= w
        tot.cached -= int(self._cached[row])
        tot.end -= end
        tot.rounding -= max(end - f, 0)
        node = self._node[row]
        if node is not None:
            self._unlock(row, node)
        for kind in self.kinds:
            kind.drop(row)
        self._node[row] = None
        self._written[row] = self._cached[row] = self._final[row] = 0
        del self._row_of[rid]
        self._members += 1
        self.req_to_token_pool.free_row(row)

    # -- observation -----------------------------------------------------------------------
    def written(self, rid: int) -> int:
        return int(self._written[self.row_of(rid)])

    def available_tokens(self) -> int:
        return self.allocator.available_size() + self.tree.evictable_size()

    def evictable_tokens(self) -> int:
        return self.tree.evictable_size()

    def free_tokens(self) -> int:
        return self.allocator.available_size()

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        # paged breakdowns do not depend on head_reservation; memoised until the next call
        # that changes the pool, or a side pool's own eviction (it frees full pages only by
        # deleting cached leaves, so the evictable size tells)
        evictable = self.tree.evictable_size()
        memo = self._breakdown_cache
        if memo is not None and memo[0] == self._epoch and memo[1] == evictable:
            return memo[2]
        b = self._breakdown_of(self._tot.as_tuple())
        self._breakdown_cache = (self._epoch, evictable, b)
        return b

    def _breakdown_of(self, totals: tuple[int, int, int, int]) -> MemoryBreakdown:
        """The breakdown from the row totals (written, cached, end, rounding) and the tree's
        and the allocator's counters. A live row's unwritten tail [written, end of its last
        page) is reserved up to its final length (written <= final always) and rounding
        beyond it (tail_split, summed)."""
        written, cached, end, rounding = totals
        return MemoryBreakdown.for_pages(
            self.capacity,
            token_states=self.tree.protected_size() + written - cached,
            cached=self.tree.evictable_size(),
            reserved=end - written - rounding,
            rounding=rounding,
            free=self.allocator.available_size(),
        )

    def page_table_entries(self) -> int:
        # each live row's entries end at its last page's end: a running total
        return self._tot.end // self.page_size

    def page_table_bytes(self) -> int:
        """The request-to-token table's device bytes."""
        return int(self.req_to_token_pool.nbytes)

    def _count_entries(self) -> int:
        return int(((self._written + self.page_size - 1) // self.page_size).sum())

    def check_invariants(self) -> None:
        ps = self.page_size
        self.allocator.check_invariants()
        self.tree.check_invariants()
        self.req_to_token_pool.check_invariants()
        if len(self._row_of) > self.max_running:
            raise InvariantError(f"{len(self._row_of)} running > cap {self.max_running}")
        owned = [self.allocator.free_pages_view(), self.tree.all_values()[::ps] // ps]
        holders: list[tuple[int, TreeNode]] = []
        for rid, row in self._row_of.items():
            w, c = int(self._written[row]), int(self._cached[row])
            if c % ps or not 0 <= c <= w <= self.req_to_token_pool.max_context_len:
                raise InvariantError(f"request {rid}: cached {c} / written {w} out of order")
            if w > self._final[row]:
                raise InvariantError(f"request {rid}: wrote {w} > final length {self._final[row]}")
            slots = self.req_to_token_pool.req_to_token[row, :w].to(_I64)
            pos = torch.arange(w, device=slots.device)
            if bool((slots % ps != pos % ps).any()) or bool((slots < ps).any()):
                raise InvariantError(f"request {rid}: slot not at its page offset (or dummy)")
            owned.append(slots[c:][(pos[c:] % ps) == 0] // ps)
            node = self._node[row]
            if node is None:
                raise InvariantError(f"request {rid}: holds no node")
            holders.append((row, node))
            depth = node.offset() + len(node.key) if node is not self.tree.root else 0
            if not self.tree.disable and depth != c:
                raise InvariantError(f"request {rid}: locked node depth {depth} != cached {c}")
            for kind in self.kinds:
                kind.check_row(rid, row, w, c, slots.cpu().numpy())
        pages = torch.cat(owned)
        counts = torch.bincount(pages, minlength=self.allocator.num_pages + 1)
        if int(counts.max()) > 1:
            dup = torch.nonzero(counts > 1).flatten().tolist()[:8]
            raise InvariantError(f"pages owned twice: {dup}")
        if len(pages) != self.allocator.num_pages or int(counts[0]) != 0:
            raise InvariantError(
                f"leak: free + private + cached = {len(pages)} pages, capacity "
                f"{self.allocator.num_pages}"
            )
        for kind in self.kinds:
            kind.check_invariants(holders)
        if self.tiers is not None:
            self.tiers.check(self._row_of)
        totals = self._tot.as_tuple()
        recount = recount_totals(self._written, self._cached, self._final, self.page_size)
        if totals != recount:
            raise InvariantError(f"running totals (written, cached, end, rounding) {totals} "
                                 f"!= recomputed {recount}")
        b, entries = self.breakdown(self.page_size), self.page_table_entries()
        b.check_invariants()
        if b != self._breakdown_of(recount) or entries != self._count_entries():
            raise InvariantError(f"memoised breakdown {b} or page-table entries {entries} "
                                 "disagree with a recomputation")

    def close(self) -> None:
        for kind in self.kinds:
            kind.close()


# -- the capability sets (the engine asks `isinstance`) --------------------------------------


class FullAttentionPolicy(SGLangPolicy, DecodeStretch):
    """The layout with no side pool: n decode steps only grow the full pool, in closed form
    (kvcore/sglang/stretch.py)."""

    def decode_cost(self, rids: Sequence[int], n: int) -> int:
        w, ps = self._written[self._rows(rids, "decode")], self.page_size
        return int(((w + (n + ps - 1)) // ps - (w + (ps - 1)) // ps).sum()) * ps

    def steps_within(self, rids: Sequence[int], k: int, slots: int) -> int:
        """The most steps n <= k with decode_cost(rids, n) <= slots (0 if none), in closed
        form instead of a search over decode_cost."""
        if slots < 0:
            return 0
        return steps_within(self._written[self._rows(rids, "decode")], self.page_size, k, slots)

    def decode_steps(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """n steps in one batch, popping pages in the order n single steps would (step-major,
        then batch order) so the page table ends up identical to stepping. Cache that stepping
        would evict is evicted up front in the same LRU order; the profile shows it leaving
        at the step where stepping would have evicted it."""
        rows = self._rows(rids, "decode")
        w = self._written[rows]
        wl = w.tolist()  # Python ints: the short stretch and the check work on them
        self.check_decode_args(rids, wl, self.req_to_token_pool.max_context_len, steps=n)
        ps = self.page_size
        plan = plan_stretch(self.breakdown(head_reservation), w, wl, self._final[rows], ps, n)
        profile, n_new = plan.profile, plan.new_pages
        self._epoch += 1
        if n_new * ps > self.available_tokens():  # before anything changes: no half step
            raise ValueError("decode_steps needs decode_cost <= available_tokens")
        free0 = self.allocator.available_size()
        if n_new * ps > free0:
            sizes: list[int] = []
            self.tree.evict(n_new * ps - free0, sizes)
            # slots stepping would be short of through each step
            shortfall = np.asarray(plan.taken) - free0
            cum = np.cumsum(sizes)
            idx = np.minimum(np.searchsorted(cum, np.maximum(shortfall, 1)), len(cum) - 1)
            evicted = np.where(shortfall > 0, cum[idx], 0)
            profile[:, _CACHED] -= evicted
            profile[:, _FREE] += evicted
        pages = self.allocator.pop_host(n_new)
        assert pages is not None
        slots = stretch_slots(plan, w, lambda: self._last_loc(rows, w), pages, step_column(n), ps)
        self.req_to_token_pool.write_run(rows, w, n, slots, max(wl, default=0))
        self._written[rows] = w + n
        if n:
            tot = self._tot
            tot.written += n * len(rows)
            tot.end += n_new * ps
            tot.rounding += plan.rounding
        return profile

    def decode_profile(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        rows = self._rows(rids, "decode")
        return stretch_profile(self.breakdown(head_reservation), self._written[rows],
                               self._final[rows], self.page_size, n)


class TieredPolicy(FullAttentionPolicy, LowerTiers):
    """Full attention with a host (and storage) tier (`tiers`, SGLang HiCache)."""

    tiers: HiCache

    def admit_prefetched(self, rid: int, token_ids: np.ndarray, final_len: int,
                         max_new_tokens: int, storage_allowance: int) -> AdmitResult | None:
        return self._admit(rid, token_ids, final_len, storage_allowance)

    def peek_tiers(self, token_ids: np.ndarray) -> TierHit:
        return self.tiers.peek(token_ids, self.tree.peek(token_ids)[0])

    def tier_state(self) -> TierState:
        return self.tiers.state()

    def host_breakdown(self) -> MemoryBreakdown:
        return self.tiers.host_breakdown()


class PoolKindsPolicy(SGLangPolicy, PoolKinds):
    """A hybrid layout: the full pool and each side pool in bytes."""

    def pool_usage(self) -> dict[str, PoolUsage]:
        """Every kind served the same hit: SGLang matches one tree, and a hit needs the full
        KV, the SWA KV of its last window and a state at its end."""
        bpt, hit, q = self.pools.full_bytes_per_token, self._hit, self._queried
        used = self.capacity - self.allocator.available_size()
        out = {"full": PoolUsage("full", self.capacity * bpt, used * bpt,
                                 self.tree.evictable_size() * bpt, hit, q)}
        for kind in self.kinds:
            out[kind.kind] = kind.usage(hit, q)
        return out
