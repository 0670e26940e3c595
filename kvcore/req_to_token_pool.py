"""ReqToTokenPool: the page table that maps (request row, logical position) -> physical slot.

It is token-granular even when pages are larger (as in SGLang and mini-sglang): entry
`[row, i]` is the slot of logical token i, and the page of that token is `slot // page_size`.
Row 0 is the dummy/padding row that batched kernels write garbage into; it is never handed out.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import numpy as np
import torch

from kvcore.validation import InvariantError, non_negative_int, positive_int


class ReqToTokenPool:
    """`size` usable rows of `max_context_len` int32 slots each, plus the dummy row 0."""

    def __init__(self, size: int, max_context_len: int, device: str | torch.device = "cpu"):
        self.size = positive_int("size", size)
        self.max_context_len = positive_int("max_context_len", max_context_len)
        self.device = torch.device(device)
        # Entries past a row's length are never read, so the table is not zero-filled: a
        # 128 k-context table stays untouched (and out of RSS) until requests write it.
        try:
            self.req_to_token = torch.empty(
                (self.size + 1, self.max_context_len), dtype=torch.int32, device=self.device
            )
        except (RuntimeError, MemoryError):  # a user's sizes, not a bug: say which ones
            gib = (self.size + 1) * self.max_context_len * 4 / 2**30
            raise ValueError(
                f"page table of {self.size + 1:,} rows x {self.max_context_len:,} int32 "
                f"({gib:,.1f} GiB) cannot be allocated on {self.device}: lower "
                "max_running_requests or max_context_len"
            ) from None
        self.req_to_token[0].zero_()
        # A stack of free rows: alloc pops from the end, free appends, both O(rows).
        self._free_rows: list[int] = list(range(self.size, 0, -1))
        self._in_use = bytearray(self.size + 1)

    # -- rows ------------------------------------------------------------------------------
    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc(self, n: int = 1) -> list[int] | None:
        """`n` free rows, or None (and nothing taken) when fewer are free."""
        n = non_negative_int("n", n)
        if n > len(self._free_rows):
            return None
        rows = [self._free_rows.pop() for _ in range(n)]
        for r in rows:
            self._in_use[r] = 1
        return rows

    def alloc_row(self) -> int | None:
        """One free row, or None: `alloc(1)` without the list (one per admitted request)."""
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self._in_use[row] = 1
        return row

    def free(self, rows: int | Iterable[int]) -> None:
        """Return rows to the pool; a row that is not in use is a ValueError (nothing freed)."""
        if isinstance(rows, numbers.Integral):
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

    def free_row(self, row: int) -> None:
        """Return one row (the common case: a request ended), validated like `free`."""
        if not 1 <= row <= self.size or not self._in_use[row]:
            raise ValueError(f"row {row} is not in use (double free or never allocated)")
        self._in_use[row] = 0
        self._free_rows.append(row)

    def in_use(self, row: int) -> bool:
        return 1 <= row <= self.size and bool(self._in_use[row])

    # -- slots -----------------------------------------------------------------------------
    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """req_to_token[row, start:start+len(slots)] = slots."""
        end = start + len(slots)
        if not self.in_use(row):
            raise ValueError(f"row {row} is not in use")
        if start < 0 or end > self.max_context_len:
            raise ValueError(
                f"positions {start}..{end} outside the page table (max_context_len "
                f"{self.max_context_len})"
            )
        self.req_to_token[row, start:end] = slots.to(torch.int32)

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
        if self.device.type == "cpu":  # index arithmetic on the host, one scatter
            r, st, ln = rows.numpy(), starts.numpy(), lens.numpy()
            if len(r) == 1:  # one request: a plain slice
                self.req_to_token.numpy()[r[0], st[0] : st[0] + ln[0]] = slots.numpy()
                return
            pos = np.repeat(st, ln) + np.arange(int(ln.sum())) - np.repeat(np.cumsum(ln) - ln, ln)
            self.req_to_token.numpy()[np.repeat(r, ln), pos] = slots.numpy()
            return
        row_of = torch.repeat_interleave(rows, lens)
        offsets = torch.arange(len(slots), device=slots.device) - torch.repeat_interleave(
            torch.cumsum(lens, 0) - lens, lens
        )
        pos = torch.repeat_interleave(starts, lens) + offsets
        self.req_to_token[row_of, pos] = slots.to(torch.int32)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.req_to_token[row, start:end]

    @property
    def nbytes(self) -> int:
        return self.req_to_token.numel() * self.req_to_token.element_size()

    def check_invariants(self) -> None:
        free = self._free_rows
        if len(set(free)) != len(free):
            raise InvariantError("a page-table row is on the free list twice")
        if 0 in free or any(self._in_use[r] for r in free):
            raise InvariantError("a row is both free and in use, or the dummy row 0 is free")
        if len(free) + sum(self._in_use) != self.size:
            raise InvariantError("free rows + rows in use != size")
