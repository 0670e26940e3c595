"""`paged` and `paged-nocache`: SGLang's memory system (PagedAllocator + RadixCache).

Per request the page table row holds, left to right:

    [0, cached)              slots owned by the radix tree, locked via `node` while it runs
    [cached, written)        private slots the request wrote
    [written, ceil_ps(written))  the rest of its last private page: its next decode tokens

`cached` is always page-aligned (the tree only holds whole pages). Per-row state lives in numpy
arrays indexed by row so that batched calls touch the whole batch at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvcore.allocator import PagedAllocator
from kvcore.kv_pool import MHATokenToKVPool
from kvcore.policies.base import (
    PARTS,
    AdmitResult,
    KVPolicy,
    MemoryBreakdown,
    PolicyConfig,
    page_growth_profile,
    register_policy,
    tail_split,
)
from kvcore.radix_cache import RadixCache, TreeNode, as_key
from kvcore.req_to_token_pool import ReqToTokenPool
from kvcore.validation import InvariantError, positive_int

_I64 = torch.int64


def _ceil_to(x: np.ndarray, ps: int) -> np.ndarray:
    return -(-x // ps) * ps


class PagedPolicy(KVPolicy):
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
        self.tree = RadixCache(
            ps, self.allocator, self.req_to_token_pool, config.eviction, disable=not cache_enabled
        )
        rows = config.max_requests + 1
        self._written = np.zeros(rows, dtype=np.int64)
        self._cached = np.zeros(rows, dtype=np.int64)
        self._final = np.zeros(rows, dtype=np.int64)
        self._node: list[TreeNode | None] = [None] * rows
        self._row_of: dict[int, int] = {}
        self._table = self.req_to_token_pool.req_to_token
        self._epoch = 0  # bumped by every mutating call; keys the breakdown memo
        self._breakdown_cache: tuple[int, MemoryBreakdown] | None = None
        self._table_np = self._table.numpy() if self._table.device.type == "cpu" else None

    # -- helpers ---------------------------------------------------------------------------
    def _rows(self, rids: Sequence[int]) -> np.ndarray:
        try:
            return np.fromiter((self._row_of[r] for r in rids), dtype=np.int64, count=len(rids))
        except KeyError as e:
            raise ValueError(f"request {e.args[0]} is not admitted") from None

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

    def _last_loc(self, rows: np.ndarray, written: np.ndarray) -> torch.Tensor:
        if self._table_np is not None:  # CPU: read the page table through a numpy view
            loc = self._table_np[rows, np.maximum(written - 1, 0)].astype(np.int64)
            return torch.from_numpy(np.where(written > 0, loc, -1))
        rows_t = torch.from_numpy(rows)
        w = torch.from_numpy(written)
        loc = self._table[rows_t, (w - 1).clamp(min=0)].to(_I64)
        return torch.where(w > 0, loc, torch.full_like(loc, -1))

    def _write_slots(self, rows: np.ndarray, pos: np.ndarray, slots) -> None:
        """req_to_token[rows, pos] = slots (elementwise), through a numpy view on CPU."""
        if self._table_np is not None:
            if isinstance(slots, torch.Tensor):
                slots = slots.numpy()
            self._table_np[rows, pos] = slots
            return
        slots_t = slots if isinstance(slots, torch.Tensor) else torch.from_numpy(slots)
        self._table[torch.from_numpy(np.ascontiguousarray(rows)),
                    torch.from_numpy(np.ascontiguousarray(pos))] = slots_t.to(
            self._table.device, torch.int32)

    def _free_positions(self, row: int, start: int, end: int) -> None:
        """Free the pages behind positions [start, end) of a row. `start` is page-aligned and
        the pages are the row's own, so each page is freed once, with no sort."""
        if end > start:
            ps = self.page_size
            firsts = self._table[row, start:end:ps].to(_I64)  # first slot of each page
            self.allocator.free_pages(firsts // ps if ps > 1 else firsts, distinct=True)

    # -- admission -------------------------------------------------------------------------
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        return self.tree.peek(token_ids)[0]

    def reservation(self, prompt_len: int, final_len: int, max_new_tokens: int) -> int:
        return 0

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
        rows = self.req_to_token_pool.alloc(1)
        if rows is None:
            return None
        row = rows[0]
        key = as_key(token_ids)[: max(len(token_ids) - 1, 0)]
        token_hit = self.tree.peek(key)[1]
        match = self.tree.match_prefix(key)
        cached = len(match.indices)
        self.tree.inc_lock_ref(match.last_node)
        if cached:
            self._table[row, :cached] = match.indices.to(torch.int32)
        self._row_of[rid] = row
        self._written[row] = cached
        self._cached[row] = cached
        self._final[row] = final_len
        self._node[row] = match.last_node
        return AdmitResult(row, cached, max(token_hit, cached))

    # -- growth ----------------------------------------------------------------------------
    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        self._epoch += 1
        rows = self._rows(rids)
        target = np.asarray(target_lens, dtype=np.int64)
        w = self._written[rows]
        if np.any(target < w):
            raise ValueError(f"extend target_lens {target.tolist()} below written {w.tolist()}")
        if np.any(target > self.req_to_token_pool.max_context_len):
            raise ValueError("extend past max_context_len")
        ps = self.page_size
        need = int((_ceil_to(target, ps) - _ceil_to(w, ps)).sum())
        self._make_room(need)
        last = self._last_loc(rows, w) if ps > 1 else torch.zeros(len(rows), dtype=_I64)
        out = self.allocator.alloc_extend(torch.from_numpy(w), torch.from_numpy(target), last)
        if out is None:
            return False
        self.req_to_token_pool.write_batch(
            torch.from_numpy(rows), torch.from_numpy(w), torch.from_numpy(target - w), out
        )
        self._written[rows] = target
        return True

    def decode(self, rids: Sequence[int]) -> bool:
        self._epoch += 1
        rows = self._rows(rids)
        w = self._written[rows]
        ps = self.page_size
        self._make_room(int(np.count_nonzero(w % ps == 0)) * ps)
        last = self._last_loc(rows, w) if ps > 1 else torch.zeros(len(rows), dtype=_I64)
        out = self.allocator.alloc_decode(torch.from_numpy(w + 1), last)
        if out is None:
            return False
        self._write_slots(rows, w, out)
        self._written[rows] = w + 1
        return True

    def decode_cost(self, rids: Sequence[int], n: int) -> int:
        w = self._written[self._rows(rids)]
        return int((_ceil_to(w + n, self.page_size) - _ceil_to(w, self.page_size)).sum())

    def decode_steps(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """n steps in one batch, popping pages in the order n single steps would (step-major,
        then batch order) so the page table ends up identical to stepping. Cache that stepping
        would evict is evicted up front in the same LRU order; the profile shows it leaving
        at the step where stepping would have evicted it."""
        profile = self.decode_profile(rids, n, head_reservation)
        self._epoch += 1
        rows = self._rows(rids)
        w = self._written[rows]
        ps = self.page_size
        pos = w[None, :] + np.arange(n, dtype=np.int64)[:, None]  # (n, batch) positions written
        starts = pos % ps == 0
        n_new = int(np.count_nonzero(starts))
        free0 = self.allocator.available_size()
        short = n_new * ps - free0
        if short > 0:
            sizes: list[int] = []
            self.tree.evict(short, sizes)
            if self.allocator.available_size() < n_new * ps:
                raise ValueError("decode_steps needs decode_cost <= available_tokens")
            need = np.cumsum(starts.sum(axis=1)) * ps  # slots taken through each step
            cum = np.cumsum(sizes)
            shortfall = need - free0
            idx = np.searchsorted(cum, np.maximum(shortfall, 1), side="left")
            evicted = np.where(shortfall > 0, cum[np.minimum(idx, len(cum) - 1)], 0)
            profile[:, PARTS.index("cached")] -= evicted
            profile[:, PARTS.index("free")] += evicted
        pages = self.allocator.alloc_pages(n_new)
        assert pages is not None
        page_at = np.zeros(pos.shape, dtype=np.int64)
        page_at[starts] = pages.cpu().numpy()  # row-major = step-major: stepping's pop order
        step_idx = np.where(starts, np.arange(n)[:, None], -1)
        ffill = np.maximum.accumulate(step_idx, axis=0)
        last_page = (self._last_loc(rows, w).numpy() // ps)[None, :]
        cols = np.broadcast_to(np.arange(len(rows)), pos.shape)
        page = np.where(ffill >= 0, page_at[np.maximum(ffill, 0), cols], last_page)
        self._write_slots(np.broadcast_to(rows, pos.shape), pos, page * ps + pos % ps)
        self._written[rows] = w + n
        return profile

    def decode_profile(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        rows = self._rows(rids)
        w = self._written[rows]
        profile, _ = page_growth_profile(self.breakdown(head_reservation), w, self._final[rows],
                                         _ceil_to(w, self.page_size), self.page_size, n)
        return profile

    # -- ending ----------------------------------------------------------------------------
    def _insert_written(self, row: int, token_ids: np.ndarray) -> int:
        """Insert the row's whole written pages into the tree; free the request's own copies
        of pages someone else cached meanwhile. Returns the page-aligned inserted length."""
        w = int(self._written[row])
        n = w - w % self.page_size
        cached = int(self._cached[row])
        if len(token_ids) < w:
            raise ValueError(f"need {w} token ids for row {row}, got {len(token_ids)}")
        if n <= cached:
            return cached
        # the int32 row itself: the tree copies (as int64) only the part it did not have
        already = self.tree.insert(as_key(token_ids)[:n], self._table[row, :n])
        self._free_positions(row, cached, already)
        return n

    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        self._epoch += 1
        if self.tree.disable:
            return
        row = int(self._row_of_checked(rid))
        n = self._insert_written(row, token_ids)
        if n <= int(self._cached[row]):
            return
        match = self.tree.match_prefix(as_key(token_ids)[:n])
        self._table[row, :n] = match.indices.to(torch.int32)
        self.tree.inc_lock_ref(match.last_node)
        self.tree.dec_lock_ref(self._node[row])
        self._node[row] = match.last_node
        self._cached[row] = n

    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        self._epoch += 1
        row = int(self._row_of_checked(rid))
        w = int(self._written[row])
        if self.tree.disable:
            self._free_positions(row, 0, w)
        else:
            n = self._insert_written(row, token_ids)
            self._free_positions(row, n, w)
        self._drop(rid, row)

    def release(self, rid: int) -> None:
        self._epoch += 1
        row = int(self._row_of_checked(rid))
        self._free_positions(row, int(self._cached[row]), int(self._written[row]))
        self._drop(rid, row)

    def _drop(self, rid: int, row: int) -> None:
        node = self._node[row]
        if node is not None:
            self.tree.dec_lock_ref(node)
        self._node[row] = None
        self._written[row] = self._cached[row] = self._final[row] = 0
        del self._row_of[rid]
        self.req_to_token_pool.free(row)

    # -- observation -----------------------------------------------------------------------
    def written(self, rid: int) -> int:
        return int(self._written[self._row_of_checked(rid)])

    def available_tokens(self) -> int:
        return self.allocator.available_size() + self.tree.evictable_size()

    def evictable_tokens(self) -> int:
        return self.tree.evictable_size()

    def free_tokens(self) -> int:
        return self.allocator.available_size()

    def live_requests(self) -> int:
        return len(self._row_of)

    def _live_rows(self) -> np.ndarray:
        return np.fromiter(self._row_of.values(), dtype=np.int64, count=len(self._row_of))

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        # paged breakdowns do not depend on head_reservation; memoise until the next mutation
        if self._breakdown_cache is not None and self._breakdown_cache[0] == self._epoch:
            return self._breakdown_cache[1]
        b = self._compute_breakdown()
        self._breakdown_cache = (self._epoch, b)
        return b

    def _compute_breakdown(self) -> MemoryBreakdown:
        rows = self._live_rows()
        w, c, final = self._written[rows], self._cached[rows], self._final[rows]
        reserved, rounding = tail_split(_ceil_to(w, self.page_size), final, w)
        return MemoryBreakdown.for_pages(
            self.capacity,
            token_states=self.tree.protected_size() + int((w - c).sum()),
            cached=self.tree.evictable_size(),
            reserved=int(reserved.sum()),
            rounding=int(rounding.sum()),
            free=self.allocator.available_size(),
        )

    def page_table_entries(self) -> int:
        w = self._written[self._live_rows()]
        return int((-(-w // self.page_size)).sum())

    def check_invariants(self) -> None:
        ps = self.page_size
        self.allocator.check_invariants()
        self.tree.check_invariants()
        self.req_to_token_pool.check_invariants()
        owned = [self.allocator.free_pages_view(), self.tree.all_values()[::ps] // ps]
        for rid, row in self._row_of.items():
            w, c = int(self._written[row]), int(self._cached[row])
            if c % ps or not 0 <= c <= w <= self.req_to_token_pool.max_context_len:
                raise InvariantError(f"request {rid}: cached {c} / written {w} out of order")
            if w > self._final[row]:
                raise InvariantError(f"request {rid}: wrote {w} > final length {self._final[row]}")
            slots = self._table[row, :w].to(_I64)
            pos = torch.arange(w)
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
        self.breakdown(self.page_size).check()


@register_policy("paged", when="SGLang's paged pool + radix prefix cache: the default for "
                 "real traffic, any page size; reuses shared prefixes")
def _make_paged(config: PolicyConfig) -> KVPolicy:
    return PagedPolicy(config, cache_enabled=True)


@register_policy("paged-nocache", when="paging without prefix reuse: isolates what the radix "
                 "cache buys (vLLM paper's vLLM setting; SGLang --disable-radix-cache)")
def _make_paged_nocache(config: PolicyConfig) -> KVPolicy:
    policy = PagedPolicy(config, cache_enabled=False)
    policy.name = "paged-nocache"
    return policy
