"""SGLang's tensor-shaped calls on kvcore's structures, which only tests, the reference
models and the kernel benchmark use: production (the policies) calls the host APIs
(kvcore/contract/req_to_token_pool.py `alloc_row` / `free_row` / `write_range` / `write_at` /
`read_at`; kvcore/sglang/allocator.py `alloc_extend_host` / `alloc_extend_one` / `alloc_decode_host`
/ `pop_host` / `push_host` / `free_page` / `free_pages` / `free_segments`). Kept here, over the
same checked host APIs, so the differential tests keep driving the real structures."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from kvcore.contract.req_to_token_pool import ReqToTokenPool
from kvcore.contract.validation import int_array, non_negative_int
from kvcore.sglang.allocator import IntsLike, PagedAllocator


@dataclass(frozen=True)
class AllocatorState:
    """An opaque snapshot for restore_state: the stack top and the undo-log length."""

    top: int
    undo_len: int


class SGLangPagedAllocator(PagedAllocator):
    """`PagedAllocator` with SGLang's tensor calls: slots as tensors on the allocator's device,
    `free` by slots, free groups (a batch's frees released in one push) and backup/restore
    (`backup_state` snapshots the top and starts an undo log of the stack entries later frees
    overwrite, so `restore_state` is exact without copying the stack up front). The host
    fast paths route through `free_pages` while a group or an undo log is open."""

    def __init__(self, num_pages: int, page_size: int, device: str | torch.device = "cpu"):
        super().__init__(num_pages, page_size, device)
        self._group: list[torch.Tensor] | None = None
        self._undo: list[tuple[int, torch.Tensor]] | None = None

    # -- allocating -------------------------------------------------------------------------
    def alloc_pages(self, n: int) -> torch.Tensor | None:
        """`n` whole pages (their ids), or None with nothing changed."""
        return self._pop(non_negative_int("n", n))

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """`need_size` slots as whole pages; need_size must be a multiple of page_size."""
        need_size = non_negative_int("need_size", need_size)
        if need_size % self.page_size:
            raise ValueError(
                f"need_size {need_size} is not a multiple of page_size {self.page_size}"
            )
        pages = self._pop(need_size // self.page_size)
        return None if pages is None else self.pages_to_slots(pages)

    def alloc_extend(
        self, prefix_lens: IntsLike, seq_lens: IntsLike, last_loc: IntsLike
    ) -> torch.Tensor | None:
        """`alloc_extend_host` on lists or tensors, returning the slots as a tensor on the
        allocator's device."""
        pre = int_array("prefix_lens", prefix_lens)
        seq = int_array("seq_lens", seq_lens)
        last = int_array("last_loc", last_loc)
        if not len(pre) == len(seq) == len(last):
            raise ValueError("prefix_lens, seq_lens and last_loc must have the same length")
        out = self.alloc_extend_host(pre, seq, last)
        return None if out is None else self._to_device(out)

    def alloc_decode(self, seq_lens: IntsLike, last_loc: IntsLike) -> torch.Tensor | None:
        """`alloc_decode_host` on lists or tensors, returning a tensor on the device."""
        seq, last = int_array("seq_lens", seq_lens), int_array("last_loc", last_loc)
        if len(seq) != len(last):
            raise ValueError("seq_lens and last_loc must have the same length")
        if len(seq) and bool((seq < 1).any()):
            raise ValueError(f"seq_lens must be >= 1, got {seq.tolist()}")
        out = self.alloc_decode_host(seq, last)
        return None if out is None else self._to_device(out)

    def pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        """Expand page ids to their slots: pages [1, 3] at page_size 4 (page starts 4 and 12)
        -> slots 4..7, 12..15."""
        ps = self.page_size
        if ps == 1:
            return pages
        if pages.device.type == "cpu":
            return torch.from_numpy(self._slots_of_pages(pages.numpy()))
        offsets = torch.arange(ps, dtype=torch.int64, device=pages.device)
        return (pages[:, None] * ps + offsets).reshape(-1)

    # -- freeing ----------------------------------------------------------------------------
    def free(self, slots: IntsLike) -> None:
        """Free the pages holding `slots` (page-granular: any slot frees its whole page).

        A slot on page 0, out of range, or on a page that is already free is a ValueError and
        nothing is freed. Inside a free group the pages are only collected."""
        t = self._ints("slots", slots)
        if len(t) == 0:
            return
        lo, hi = self.page_size, (self.num_pages + 1) * self.page_size
        if int(t.min()) < lo or int(t.max()) >= hi:
            bad = t[(t < lo) | (t >= hi)].tolist()[:8]
            raise ValueError(f"slots must be in [{lo}, {hi}) (page 0 is reserved), got {bad}")
        pages = t if self.page_size == 1 else t // self.page_size
        self.free_pages(pages)

    def free_pages(self, pages: IntsLike, distinct: bool = False) -> None:
        """`PagedAllocator.free_pages`; inside a free group the pages are only collected."""
        p = self._checked_pages(pages, distinct)
        if len(p) == 0:
            return
        if self._group is not None:
            pending = torch.cat(self._group) if self._group else p[:0]
            if bool(torch.isin(p, pending).any()):
                bad = p[torch.isin(p, pending)].tolist()[:8]
                raise ValueError(f"double free inside a free group: pages {bad}")
            self._group.append(p)
            return
        self._push(p)

    def push_host(self, pages: np.ndarray) -> None:
        if self._group is not None or self._undo is not None:
            if len(pages):
                self.free_pages(self._to_device(pages), distinct=True)
            return
        super().push_host(pages)

    def free_page(self, page: int) -> None:
        if self._group is not None or self._undo is not None:
            self.free_pages([page], distinct=True)
            return
        super().free_page(page)

    def _push(self, pages: torch.Tensor) -> None:
        if self._undo is not None:
            top = self._top
            self._undo.append((top, self._stack[top : top + len(pages)].clone()))
        super()._push(pages)

    def free_group_begin(self) -> None:
        """Defer frees until free_group_end (a batch's finished requests, as SGLang does),
        then release them with one push. Groups do not nest."""
        if self._group is not None:
            raise ValueError("free groups cannot nest")
        self._group = []

    def free_group_end(self) -> None:
        if self._group is None:
            raise ValueError("free_group_end without free_group_begin")
        group, self._group = self._group, None
        if group:
            pages = torch.cat(group)
            if len(torch.unique(pages)) != len(pages):
                raise ValueError("double free inside a free group")
            self._push(pages)

    # -- backup / restore -------------------------------------------------------------------
    def backup_state(self) -> AllocatorState:
        """Snapshot for restore_state; costs O(1) now and O(freed) per later free."""
        if self._undo is None:
            self._undo = []
        return AllocatorState(self._top, len(self._undo))

    def restore_state(self, state: AllocatorState) -> None:
        """Undo every alloc and free made since `state` was taken (states may nest)."""
        if self._undo is None or state.undo_len > len(self._undo):
            raise ValueError("restore_state with a state this allocator did not back up")
        while len(self._undo) > state.undo_len:
            start, old = self._undo.pop()
            self._stack[start : start + len(old)] = old
        self._top = state.top
        self._is_free.fill_(False)
        self._is_free[self._stack[: self._top]] = True
        # keep logging: an outer backup taken earlier must stay restorable (discard_backup ends it)

    def discard_backup(self) -> None:
        """Stop logging for restore_state (the speculative work was kept)."""
        self._undo = None


class SGLangReqToTokenPool(ReqToTokenPool):
    """`ReqToTokenPool` with SGLang's batch calls: rows by the list, tensor writes and reads."""

    def alloc(self, n: int = 1) -> list[int] | None:
        """`n` free rows, or None (and nothing taken) when fewer are free."""
        n = non_negative_int("n", n)
        if n > len(self._free_rows):
            return None
        rows = [self._free_rows.pop() for _ in range(n)]
        for r in rows:
            self._in_use[r] = 1
        return rows

    def free(self, rows: int | Iterable[int]) -> None:
        """Return rows to the pool; a row that is not in use is a ValueError (nothing freed)."""
        if isinstance(rows, (int, numbers.Integral)):
            self.free_row(int(rows))
            return
        rows = [int(r) for r in rows]
        seen: set[int] = set()
        for r in rows:
            if not 1 <= r <= self.size or not self._in_use[r] or r in seen:
                raise ValueError(f"row {r} is not in use (double free or never allocated)")
            seen.add(r)
        for r in rows:
            self._in_use[r] = 0
            self._free_rows.append(r)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """req_to_token[row, start:start+len(slots)] = slots (a tensor), checked."""
        self.write_range(row, start, slots)

    def write_batch(
        self, rows: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """Scatter a batch: request i's `lens[i]` slots go to positions starts[i].. of rows[i].

        `slots` is the concatenation in batch order (what alloc_extend returns). One scatter,
        no Python loop over requests or tokens."""
        if len(slots) == 0:
            return
        if int((starts + lens).max()) > self.max_context_len:
            raise ValueError(f"a write goes past max_context_len {self.max_context_len}")
        row_of = torch.repeat_interleave(rows, lens)
        offsets = torch.arange(len(slots), device=slots.device) - torch.repeat_interleave(
            torch.cumsum(lens, 0) - lens, lens
        )
        pos = torch.repeat_interleave(starts, lens) + offsets
        self.write_at(row_of.cpu().numpy(), pos.cpu().numpy(), slots.cpu().numpy())

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.req_to_token[row, start:end]
