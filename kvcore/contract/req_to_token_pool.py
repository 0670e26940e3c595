"""ReqToTokenPool: the page table that maps (request row, logical position) -> physical slot.

It is token-granular even when pages are larger (as in SGLang and mini-sglang): entry
`[row, i]` is the slot of logical token i, and the page of that token is `slot // page_size`.
Row 0 is the dummy/padding row that batched kernels write garbage into; it is never handed out.

Why the API looks as it does:
* It is the only writer of the table: every policy writes through `write_range` /
  `write_at` / `write_run`, so the bounds checks below run on the production path, not only
  in tests.
* Lengths and positions are host data, so the policies' form takes and returns numpy arrays.
  On CPU the table is also reached through a numpy view of the same memory (`host`): numpy's
  per-call cost is a fraction of torch's for these small scatters. On a device (or with `host`
  set to None, which tests use to run the device path on CPU) the same calls index the tensor.
* The checks are one scalar comparison per range write and one reduction per scatter, so the
  policies' per-step cost barely moves. Reads are not checked: a policy may gather position
  -1 of a row that wrote nothing and ignore the value (a batch needs no branch for it).
* SGLang's tensor-shaped calls (`alloc(n)`, `free(rows)`, `write`, `write_batch`, `read`) live
  in the tests (tests/kvcore/sglang_api.py), which alone call them.

Invariants (`check_invariants`): free rows + rows in use == size; no row is free twice; row 0
is never free nor in use; every written position p of a live row satisfies 0 <= p <
max_context_len (enforced at write time).
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from kvcore.contract.validation import InvariantError, positive_int

_UMAX = np.maximum.reduce

#: numpy-style indices: a row or rows, a position, positions or a slice of them
Index = int | slice | np.ndarray


_STEPS: dict[int, np.ndarray] = {}


def step_column(n: int) -> np.ndarray:
    """The column 0..n-1 of a stretch's steps, read-only and kept per length: a stretch is
    a few steps, and the same few lengths recur thousands of times in a run."""
    col = _STEPS.get(n)
    if col is None:
        col = np.arange(n, dtype=np.int64)[:, None]
        col.flags.writeable = False
        if len(_STEPS) < 4096:
            _STEPS[n] = col
    return col


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
        #: the table as a numpy view on CPU; None on a device (writes index the tensor)
        self.host: np.ndarray | None = (
            self.req_to_token.numpy() if self.device.type == "cpu" else None
        )
        # A stack of free rows: alloc pops from the end, free appends, both O(rows).
        self._free_rows: list[int] = list(range(self.size, 0, -1))
        self._in_use = bytearray(self.size + 1)

    # -- rows ------------------------------------------------------------------------------
    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int | None:
        """One free row, or None (one per admitted request)."""
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self._in_use[row] = 1
        return row

    def free_row(self, row: int) -> None:
        """Return one row (a request ended); a row not in use is a ValueError."""
        if not 1 <= row <= self.size or not self._in_use[row]:
            raise ValueError(f"row {row} is not in use (double free or never allocated)")
        self._in_use[row] = 0
        self._free_rows.append(row)

    def in_use(self, row: int) -> bool:
        return 1 <= row <= self.size and bool(self._in_use[row])

    # -- host API: what the policies call ----------------------------------------------------
    def write_range(self, row: int, start: int, slots: np.ndarray | torch.Tensor) -> None:
        """req_to_token[row, start:start+len(slots)] = slots. `row` must be in use and the
        positions inside the table (else ValueError, nothing written)."""
        end = start + len(slots)
        if not (start >= 0 and end <= self.max_context_len and 1 <= row <= self.size
                and self._in_use[row]):
            self._bad_range(row, start, end)
        host = self.host
        if host is not None:
            host[row, start:end] = slots.numpy() if isinstance(slots, torch.Tensor) else slots
        else:
            self.req_to_token[row, start:end] = self._as_table_tensor(slots)

    def write_at(self, rows: int | np.ndarray, cols: int | np.ndarray, slots: np.ndarray) -> None:
        """req_to_token[rows, cols] = slots with numpy's indexing rules (rows and positions
        broadcast): a decode step's one entry per request, or a stretch's (steps x batch).
        Positions outside the table are a ValueError, nothing written."""
        if isinstance(cols, np.ndarray):
            # a negative position wraps to a huge one; the ufunc's own reduce skips the
            # Python wrappers of ndarray.max, which every decode step would pay
            if cols.size and _UMAX(cols.astype(np.int64, copy=False).view(np.uint64),
                                   axis=None) >= self.max_context_len:
                bad = cols[(cols < 0) | (cols >= self.max_context_len)].flat[0]
                raise ValueError(f"position {bad} outside the page table (max_context_len "
                                 f"{self.max_context_len})")
        elif not 0 <= cols < self.max_context_len:
            self._bad_range(rows, cols, cols + 1)
        self._scatter(rows, cols, slots)

    def write_run(self, rows: np.ndarray, starts: np.ndarray, n: int, slots: np.ndarray,
                  top: int | None = None) -> None:
        """req_to_token[rows[i], starts[i] + s] = slots[s, i] for s < n: each row's next n
        positions (a decode stretch; n == 1 takes `slots` as one entry per row, a decode
        step). The bounds follow from the int64 `starts` (written lengths) alone: one
        reduction over the batch instead of one over the n x batch grid `write_at` checks,
        or none when the caller passes `top`, the largest start as a plain int it already
        has (a policy's decode checks hold it). Positions outside the table are a
        ValueError, nothing written."""
        # a negative start wraps to a huge one (so no sum: it could wrap back)
        big = _UMAX(starts.view(np.uint64)) if top is None and len(starts) else top
        if big is not None and big > self.max_context_len - n:
            bad = starts[(starts < 0) | (starts > self.max_context_len - n)][0]
            raise ValueError(f"positions {bad}..{bad + n} outside the page table "
                             f"(max_context_len {self.max_context_len})")
        cols = starts if n == 1 and slots.ndim == 1 else starts + step_column(n)
        self._scatter(rows, cols, slots)

    def _scatter(self, rows: int | np.ndarray, cols: int | np.ndarray,
                 slots: np.ndarray) -> None:
        """req_to_token[rows, cols] = slots, checked by the caller: through the numpy view
        on the host, else as one indexed torch write on the table's device."""
        host = self.host
        if host is not None:
            host[rows, cols] = slots
        else:
            self.req_to_token[self._device_index(rows, cols)] = self._as_table_tensor(slots)

    def read_at(self, rows: Index, cols: Index) -> np.ndarray:
        """req_to_token[rows, cols] on the host (int32, numpy indexing rules; on CPU a view
        for a slice). Arithmetic with int64 lengths promotes it. Not checked: see above."""
        host = self.host
        if host is not None:
            return host[rows, cols]
        return self.req_to_token[self._device_index(rows, cols)].cpu().numpy()

    def row_prefix(self, row: int, end: int) -> np.ndarray | torch.Tensor:
        """Entries [0, end) of a row without a copy (a numpy view on CPU, a tensor slice on a
        device): what a cache copies the slots it keeps from."""
        host = self.host
        return host[row, :end] if host is not None else self.req_to_token[row, :end]

    def _bad_range(self, row: object, start: int, end: int) -> None:
        if not (isinstance(row, numbers.Integral) and self.in_use(int(row))):
            raise ValueError(f"row {row} is not in use")
        raise ValueError(
            f"positions {start}..{end} outside the page table (max_context_len "
            f"{self.max_context_len})"
        )

    def _device_index(self, rows: Index, cols: Index) -> tuple:
        return tuple(torch.from_numpy(i).to(self.device) if isinstance(i, np.ndarray) else i
                     for i in (rows, cols))

    def _as_table_tensor(self, slots: np.ndarray | torch.Tensor) -> torch.Tensor:
        t = slots if isinstance(slots, torch.Tensor) else torch.from_numpy(
            np.ascontiguousarray(slots))
        return t.to(self.device, torch.int32)

    # -- size and checks -------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return self.req_to_token.numel() * self.req_to_token.element_size()

    def check_invariants(self) -> None:
        free = self._free_rows
        if len(set(free)) != len(free):
            raise InvariantError("a page-table row is on the free list twice")
        if 0 in free or any(self._in_use[r] for r in free) or self._in_use[0]:
            raise InvariantError("a row is both free and in use, or the dummy row 0 is handed out")
        if len(free) + sum(self._in_use) != self.size:
            raise InvariantError("free rows + rows in use != size")
        if self.host is not None and self.host.ctypes.data != self.req_to_token.data_ptr():
            raise InvariantError("the page table's host view no longer shares its memory")
