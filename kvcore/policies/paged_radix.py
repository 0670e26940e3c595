"""`PagedPolicy`: SGLang's memory system (PagedAllocator + RadixCache), the device half of
`paged` and `paged-nocache` (registered in kvcore/policies/paged.py).

Per request the page table row holds, left to right:

    [0, cached)              slots owned by the radix tree, locked via `node` while it runs
    [cached, written)        private slots the request wrote
    [written, ceil_ps(written))  the rest of its last private page: its next decode tokens

`cached` is always page-aligned (the tree only holds whole pages). Per-row state lives in numpy
arrays indexed by row so that batched calls touch the whole batch at once. The page table is
written only through `ReqToTokenPool` (numpy in, a numpy view of the table on CPU).

The breakdown's sums over the rows are running totals (kvcore/policies/paged_rows.py `Totals`)
that each call updates for the rows it touches; `check_invariants` compares them with a recount.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from kvcore.allocator import PagedAllocator
from kvcore.breakdown import (
    PARTS,
    MemoryBreakdown,
    page_growth_profile,
    page_growth_within_page,
)
from kvcore.kv_pool import MHATokenToKVPool
from kvcore.policies.base import AdmitResult, PolicyConfig, PrefixPeek
from kvcore.policies.capabilities import DecodeStretch, PrefixCache
from kvcore.policies.paged_rows import (
    Totals,
    grow_totals,
    recount_totals,
    short_stretch,
    short_stretch_slots,
    steps_within,
    stretch_pages,
)
from kvcore.radix_cache import RadixCache
from kvcore.radix_node import MatchResult, TreeNode, as_key, partial_page_hit
from kvcore.req_to_token_pool import ReqToTokenPool, step_column
from kvcore.validation import InvariantError, positive_int

_I64 = torch.int64
_CACHED, _INTERNAL, _FREE = (PARTS.index(p) for p in ("cached", "internal", "free"))
_Len = TypeVar("_Len", int, np.ndarray)


def _ceil_to(x: _Len, ps: int) -> _Len:
    return (x + (ps - 1)) // ps * ps


class PagedPolicy(PrefixCache, DecodeStretch):
    """Pages on demand, a shared radix prefix cache, LRU eviction of unlocked leaves."""

    name = "paged"

    def __init__(self, config: PolicyConfig, cache_enabled: bool = True) -> None:
        ps = positive_int("page_size", config.page_size)
        num_pages = config.kv_tokens // ps
        if num_pages < 1:
            raise ValueError(
                f"kv_tokens {config.kv_tokens} is smaller than one page of {ps} tokens"
            )
        super().__init__(num_pages * ps, ps)
        self.config = config
        self.allocator = PagedAllocator(num_pages, ps, config.device)
        self.req_to_token_pool = ReqToTokenPool(
            config.max_requests, config.max_context_len, config.device
        )
        self.kv_pool = MHATokenToKVPool(
            num_pages, ps, config.num_layers, config.num_kv_heads, config.head_dim,
            config.kv_dtype, config.device, store=config.store_kv,
        )  # fmt: skip
        self.tree = RadixCache(ps, self.allocator, eviction=config.eviction,
                               disable=not cache_enabled)
        rows = config.max_requests + 1
        self._written = np.zeros(rows, dtype=np.int64)
        self._cached = np.zeros(rows, dtype=np.int64)
        self._final = np.zeros(rows, dtype=np.int64)
        self._node: list[TreeNode | None] = [None] * rows
        self._row_of: dict[int, int] = {}
        self._members = 0  # bumped when the set of admitted requests changes (keys _rows_memo)
        self._rows_memo: tuple[int, list[int], np.ndarray] | None = None
        self._epoch = 0  # bumped by every mutating call; keys the breakdown memo
        self._breakdown_cache: tuple[int, MemoryBreakdown] | None = None
        self._tot = Totals()

    # -- helpers ---------------------------------------------------------------------------
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

    def _row_of_checked(self, rid: int) -> int:
        row = self._row_of.get(rid)
        if row is None:
            raise ValueError(f"request {rid} is not admitted")
        return row

    def _make_room(self, slots: int) -> None:
        """Evict cache so that `slots` are free, if the cache can give them."""
        short = slots - self.allocator.available_size()
        if short > 0:
            self.tree.evict(short)

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

    # -- admission -------------------------------------------------------------------------
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        return self.tree.peek(token_ids)[0]

    def peek_admission(self, token_ids: np.ndarray) -> PrefixPeek:
        return PrefixPeek(*self.tree.peek_evictable(token_ids))

    def _load(self, row: int, key: np.ndarray, match: MatchResult) -> MatchResult:
        """The locked device match, extended by what lower tiers load (kvcore/policies/
        paged_tiers.py; none here)."""
        return match

    def admit(
        self, rid: int, token_ids: np.ndarray, final_len: int, max_new_tokens: int
    ) -> AdmitResult | None:
        self._epoch += 1
        if rid in self._row_of:
            raise ValueError(f"request {rid} is already admitted")
        if final_len > self.req_to_token_pool.max_context_len:
            raise ValueError(
                f"final length {final_len} exceeds max_context_len "
                f"{self.req_to_token_pool.max_context_len}"
            )
        row = self.req_to_token_pool.alloc_row()
        if row is None:
            return None
        key = as_key(token_ids)[: max(len(token_ids) - 1, 0)]
        match = self.tree.match_prefix(key)  # then the token-level hit from where it ends
        token_hit = len(match.indices) + partial_page_hit(match.last_node, key,
                                                          len(match.indices))
        self.tree.inc_lock_ref(match.last_node)
        match = self._load(row, key, match)
        cached = len(match.indices)
        if cached:
            self.req_to_token_pool.write_range(row, 0, match.indices)
        self._members += 1
        self._row_of[rid] = row
        self._written[row] = cached
        self._cached[row] = cached
        self._final[row] = final_len
        self._node[row] = match.last_node
        tot, end = self._tot, _ceil_to(cached, self.page_size)
        tot.written += cached
        tot.cached += cached
        tot.end += end
        tot.rounding += max(end - final_len, 0)
        return AdmitResult(row, cached, max(token_hit, cached))

    # -- growth ----------------------------------------------------------------------------
    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        self._epoch += 1
        ps = self.page_size
        max_len = self.req_to_token_pool.max_context_len
        table = self.req_to_token_pool
        if len(rids) == 1:  # one prefill chunk (the common case): scalar arithmetic
            row = self._row_of_checked(rids[0])
            w = int(self._written[row])
            self.check_extend_args(rids, target_lens, (w,), max_len)
            t = int(target_lens[0])
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
        ps = self.page_size
        # a request needs a new page when its last one is full (or it has none): a batch
        # index each (a few per step, so the totals below take them one by one)
        need = list(range(len(wl))) if ps == 1 else [i for i, x in enumerate(wl) if not x % ps]
        n_new, w1 = len(need), w + 1
        self._make_room(n_new * ps)
        if ps == 1:
            out = self.allocator.pop_host(n_new)
        else:
            out = self.allocator.alloc_decode_host(w1, self._last_loc(rows, w), need, n_new)
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

    def decode_cost(self, rids: Sequence[int], n: int) -> int:
        w, ps = self._written[self._rows(rids, "decode")], self.page_size
        return int(((w + (n + ps - 1)) // ps - (w + (ps - 1)) // ps).sum()) * ps

    def steps_within(self, rids: Sequence[int], k: int, slots: int) -> int:
        """The most steps n <= k with decode_cost(rids, n) <= slots (0 if none), in closed
        form (kvcore/policies/paged_rows.py) instead of a search over decode_cost."""
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
        wl = w.tolist()  # Python ints: the short stretch below and the check work on them
        self.check_decode_args(rids, wl, self.req_to_token_pool.max_context_len, steps=n)
        ps = self.page_size
        base = self.breakdown(head_reservation)
        short = 0 < n <= ps  # at most one new page each (the usual stretch): closed form
        if short:
            profile, taken, order, rounding = short_stretch(
                base.as_tuple(), wl, self._final[rows].tolist(), ps, n)
            n_new = len(order)
        else:
            have = w + (-w) % ps  # where each request's last page ends
            profile, taken_a = page_growth_profile(base, w, self._final[rows], have, ps, n)
            n_new = int(taken_a[-1]) // ps if n else 0  # taken: new slots through each step
            rounding = int(profile[-1, _INTERNAL]) - base.internal if n else 0
        self._epoch += 1
        if n_new * ps > self.available_tokens():  # before anything changes: no half step
            raise ValueError("decode_steps needs decode_cost <= available_tokens")
        free0 = self.allocator.available_size()
        if n_new * ps > free0:
            sizes: list[int] = []
            self.tree.evict(n_new * ps - free0, sizes)
            # slots stepping would be short of through each step
            shortfall = (np.array(taken) if short else taken_a) - free0
            cum = np.cumsum(sizes)
            idx = np.minimum(np.searchsorted(cum, np.maximum(shortfall, 1)), len(cum) - 1)
            evicted = np.where(shortfall > 0, cum[idx], 0)
            profile[:, _CACHED] -= evicted
            profile[:, _FREE] += evicted
        pages = self.allocator.pop_host(n_new)
        assert pages is not None
        steps = step_column(n)
        if ps == 1:  # a new page every step, step-major: exactly the pop order
            slots = pages.reshape(n, len(rows))
        elif short:
            slots = short_stretch_slots(self._last_loc(rows, w) + 1, (-w) % ps, order, pages,
                                        steps, ps)
        else:
            pos = w + steps  # (n, batch) positions
            last_page = self._last_loc(rows, w) // ps
            slots = stretch_pages(pos, pages, last_page, ps) * ps + pos % ps
        self.req_to_token_pool.write_run(rows, w, n, slots, max(wl, default=0))
        self._written[rows] = w + n
        if n:
            tot = self._tot
            tot.written += n * len(rows)
            tot.end += n_new * ps
            tot.rounding += rounding
        return profile

    def decode_profile(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        rows = self._rows(rids, "decode")
        w, ps = self._written[rows], self.page_size
        have, base, final = _ceil_to(w, ps), self.breakdown(head_reservation), self._final[rows]
        if 0 < n <= ps:
            return page_growth_within_page(base, have - w, final, have, ps, n)[0]
        return page_growth_profile(base, w, final, have, ps, n)[0]

    # -- ending ----------------------------------------------------------------------------
    def _insert_written(self, row: int, token_ids: np.ndarray):
        """Insert the row's whole written pages into the tree; free the request's own copies
        of pages someone else cached meanwhile. Returns (page-aligned inserted length, tree
        node ending there or None when nothing new was inserted, were all its pages ours)."""
        w = int(self._written[row])
        n = w - w % self.page_size
        cached = int(self._cached[row])
        if len(token_ids) < w:
            raise ValueError(f"need {w} token ids for row {row}, got {len(token_ids)}")
        if n <= cached:
            return cached, None, True
        # the int32 row itself: the tree copies (as int64) only the part it did not have
        row_slots = self.req_to_token_pool.row_prefix(row, n)
        # the walk starts at the row's locked node: its path is token_ids[:cached] already
        already, node = self.tree.insert_path(as_key(token_ids)[:n], row_slots,
                                              self._node[row], cached)
        self._inserted(token_ids, n)
        self._free_positions(row, cached, already)
        return n, node, already == cached

    def _inserted(self, token_ids: np.ndarray, n: int) -> None:
        """The device tree took token_ids[:n] (a tier's write_through backs it up)."""

    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        self._epoch += 1
        if self.tree.disable:
            return
        row = int(self._row_of_checked(rid))
        n, node, all_ours = self._insert_written(row, token_ids)
        if node is None:
            return
        if all_ours:
            # the tree now holds exactly this row's slots for [0, n): no re-match, no rewrite
            # of the row; touch the path as the match would (LRU clock, hit counts)
            self.tree.touch_path(node)
        else:
            match = self.tree.match_prefix(as_key(token_ids)[:n])
            self.req_to_token_pool.write_range(row, 0, match.indices)
            node = match.last_node
        self.tree.inc_lock_ref(node)
        old = self._node[row]
        if old is not None:  # always, for an admitted row (the root when nothing matched)
            self.tree.dec_lock_ref(old)
        self._node[row] = node
        self._tot.cached += n - int(self._cached[row])
        self._cached[row] = n

    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        self._epoch += 1
        row = int(self._row_of_checked(rid))
        w = int(self._written[row])
        if self.tree.disable:
            self._free_positions(row, 0, w)
        else:
            n = self._insert_written(row, token_ids)[0]
            self._free_positions(row, n, w)
        self._drop(rid, row)

    def release(self, rid: int) -> None:
        self._epoch += 1
        row = int(self._row_of_checked(rid))
        self._free_positions(row, int(self._cached[row]), int(self._written[row]))
        self._drop(rid, row)

    def _drop(self, rid: int, row: int) -> None:
        tot, w, f = self._tot, int(self._written[row]), int(self._final[row])
        end = _ceil_to(w, self.page_size)
        tot.written -= w
        tot.cached -= int(self._cached[row])
        tot.end -= end
        tot.rounding -= max(end - f, 0)
        node = self._node[row]
        if node is not None:
            self.tree.dec_lock_ref(node)
        self._node[row] = None
        self._written[row] = self._cached[row] = self._final[row] = 0
        del self._row_of[rid]
        self._members += 1
        self.req_to_token_pool.free_row(row)

    # -- observation -----------------------------------------------------------------------
    def written(self, rid: int) -> int:
        return int(self._written[self._row_of_checked(rid)])

    def available_tokens(self) -> int:
        return self.allocator.available_size() + self.tree.evictable_size()

    def evictable_tokens(self) -> int:
        return self.tree.evictable_size()

    def free_tokens(self) -> int:
        return self.allocator.available_size()

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        # paged breakdowns do not depend on head_reservation; memoise until the next mutation
        if self._breakdown_cache is not None and self._breakdown_cache[0] == self._epoch:
            return self._breakdown_cache[1]
        b = self._breakdown_of(self._tot.as_tuple())
        self._breakdown_cache = (self._epoch, b)
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

    def _count_entries(self) -> int:
        return int(((self._written + self.page_size - 1) // self.page_size).sum())

    def check_invariants(self) -> None:
        ps = self.page_size
        self.allocator.check_invariants()
        self.tree.check_invariants()
        self.req_to_token_pool.check_invariants()
        self.kv_pool.check_invariants()
        owned = [self.allocator.free_pages_view(), self.tree.all_values()[::ps] // ps]
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
            node_depth = 0
            node = self._node[row]
            while node is not None and node is not self.tree.root:
                node_depth += len(node.key)
                node = node.parent
            if not self.tree.disable and node_depth != c:
                raise InvariantError(f"request {rid}: locked node depth {node_depth} != cached {c}")
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
