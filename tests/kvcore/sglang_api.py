"""SGLang's tensor-shaped calls on kvcore's structures, which only tests and the reference
models use: production (the policies) calls the host API (kvcore/req_to_token_pool.py
`alloc_row` / `free_row` / `write_range` / `write_at` / `read_at`). Kept here, over the same
checked host API, so the differential tests keep driving the real structures."""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import torch

from kvcore.req_to_token_pool import ReqToTokenPool
from kvcore.validation import non_negative_int


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
