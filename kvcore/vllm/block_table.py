"""Block tables: a request's blocks in one KV cache group, and the page table they form.

vLLM keeps, per KV cache group, each request's list of blocks (a single-type manager's
`req_to_blocks`) and hands the worker one block table per group (vllm/v1/worker/
block_table.py `MultiGroupBlockTable`, v0.11). The manager (kvcore/vllm/manager.py) sees one
interface, `BlockTable`; where the entries live is the page table's form:

* `GroupBlockTables`: vLLM's own per-group block tables are the page table (a hybrid model);
  each request's table is an array of its own and nothing else is written.
* `TokenSlotTable`: a full-attention model's token-to-slot page table (`ReqToTokenPool`, the
  table kvsim's contract counts): each written position's slot, `block * page_size +
  offset`, is mirrored from the block table into the request's page-table row.
* `RowBlockTables`: at page size 1 a block is one slot, so the block table and the
  page-table row hold the same numbers: the row *is* the block table (`RowBlockTable`, a
  view of the host table), and adding blocks is the page-table write itself.

Block 0 is vLLM's null block: a position whose block the request no longer needs (it left a
sliding window, or a state was superseded) or never needed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from kvcore.contract.breakdown import pages_at_steps
from kvcore.contract.req_to_token_pool import ReqToTokenPool
from kvcore.contract.validation import InvariantError, cdiv

_EMPTY = np.zeros(0, dtype=np.int64)

#: what the page table's checks read of a live request: (request id, row, written tokens,
#: its block table in the group the page table mirrors)
Live = tuple[int, int, int, "BlockTable"]


class Holder(Protocol):
    """What the page table reads of a request (kvcore/vllm/request.py `Request`): its row and
    its block table per group (the first is the one a token-slot table mirrors)."""

    row: int
    tables: list[BlockTable]


class BlockTable:
    """One request's blocks in one KV cache group, by position: `n` positions, `last` the
    block at the last one (an int: decode writes there), `hashed` the leading positions
    offered to the prefix cache (vLLM's num_cached_block), `states` a state group's
    positions whose block received the state at its end boundary. An array grown by
    doubling."""

    __slots__ = ("_blocks", "hashed", "last", "n", "states")

    def __init__(self, capacity: int) -> None:
        self._blocks = np.zeros(max(capacity, 1), dtype=np.int64)
        self.n = 0
        self.last = 0
        self.hashed = 0
        self.states: set[int] = set()

    @property
    def blocks(self) -> np.ndarray:
        """The blocks of positions 0..n-1 (int64)."""
        return self._blocks[: self.n]

    def block_slice(self, start: int, end: int) -> np.ndarray:
        """Blocks of positions start..end-1 (int64; a view)."""
        return self._blocks[start:end]

    def block_at(self, i: int) -> int:
        return self._blocks.item(i)

    def _room(self, n: int) -> None:
        if n > len(self._blocks):
            grown = np.zeros(max(2 * len(self._blocks), n), dtype=np.int64)
            grown[: self.n] = self._blocks[: self.n]
            self._blocks = grown

    def append(self, new: np.ndarray) -> None:
        """Blocks for the next len(new) positions."""
        n, k = self.n, len(new)
        if k:
            self._room(n + k)
            self._blocks[n : n + k] = new
            self.n = n + k
            self.last = new.item(-1)

    def append_one(self, b: int) -> None:
        """`append` of one block (a decode step's)."""
        n = self.n
        self._room(n + 1)
        self._blocks[n] = b
        self.n = n + 1
        self.last = b

    def pad(self, n: int) -> None:
        """Null blocks up to position n - 1 (positions the request does not need)."""
        if n > self.n:
            self._room(n)
            self._blocks[self.n : n] = 0
            self.n = n
            self.last = 0

    def put(self, i: int, b: int) -> None:
        """Position i (< n) holds block b (0: freed, the null block)."""
        self._blocks[i] = b
        if i == self.n - 1:
            self.last = b


class RowBlockTable(BlockTable):
    """At page size 1, a block table kept in the request's page-table row: block i is
    `host[row, i]` of the page table's host view (int32). Reads hand out int64 copies: block
    ids index the pool's arrays, and numpy converts an int32 index array on every use. The
    row is this request's own while it lives (the page table's rows are one per request),
    the caller checked every position against the context length (`check_extend_args`), and
    a slice past the row's end is a shape error, not a silent write. Only a full-attention
    group has this form: its positions are never null."""

    __slots__ = ("_row",)

    def __init__(self, row: np.ndarray) -> None:  # (no array of its own: the row is it)
        self._row = row
        self.n = 0
        self.last = 0
        self.hashed = 0
        self.states = set()

    @property
    def blocks(self) -> np.ndarray:
        return self._row[: self.n].astype(np.int64)

    def block_slice(self, start: int, end: int) -> np.ndarray:
        return self._row[start:end].astype(np.int64)

    def block_at(self, i: int) -> int:
        return self._row.item(i)

    def append(self, new: np.ndarray) -> None:
        n, k = self.n, len(new)
        if k:
            self._row[n : n + k] = new
            self.n = n + k
            self.last = new.item(-1)

    def append_one(self, b: int) -> None:
        self._row[self.n] = b
        self.n += 1
        self.last = b

    def keeps_row(self, host: np.ndarray, row: int) -> bool:
        """Whether this table is `host`'s row `row` (the invariant checks)."""
        return self._row.ctypes.data == host[row].ctypes.data and len(self._row) == \
            host.shape[1]


class PageTable(ABC):
    """Where a manager's block tables live: one row per admitted request, the table of each
    KV cache group, the page-table entries written after growth, the bytes they take."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Device bytes of the page (block) table."""

    @abstractmethod
    def alloc_row(self) -> int | None:
        """A free row, or None (one per admitted request)."""

    @abstractmethod
    def free_row(self, row: int) -> None:
        """Give a row back (its request left)."""

    @abstractmethod
    def table(self, row: int, capacity: int) -> BlockTable:
        """A new request's (empty) table in a group, `capacity` positions at first."""

    def write_grow(self, row: int, table: BlockTable, start: int,  # noqa: B027
                   end: int) -> None:
        """Positions start..end-1 of the request in `row` were written (their blocks
        appended to `table`)."""

    def write_grown(self, reqs: Sequence[Holder], ws: Sequence[int],
                    ts: Sequence[int]) -> None:
        """`write_grow` of each request of an `extend`, from ws[i] to ts[i] tokens."""
        for r, w, t in zip(reqs, ws, ts, strict=True):
            if t > w:
                self.write_grow(r.row, r.tables[0], w, t)

    def write_step(self, reqs: Sequence[Holder], written: list[int]) -> None:  # noqa: B027
        """One position each was written, at `written` (a decode step)."""

    def write_grid(self, reqs: Sequence[Holder], pos: np.ndarray,  # noqa: B027
                   new: np.ndarray, last: np.ndarray) -> None:
        """A decode stretch's positions `pos` (steps x batch) were written: a block started
        at each position that is a multiple of the block size, taking `new` in row-major
        order; before its first new block a request wrote into its `last` block."""

    def check_invariants(self, live: Sequence[Live]) -> None:  # noqa: B027
        """Every row in use belongs to one live request and holds its entries."""


def _rows(reqs: Sequence[Holder]) -> np.ndarray:
    return np.fromiter((r.row for r in reqs), dtype=np.int64, count=len(reqs))


class GroupBlockTables(PageTable):
    """vLLM's block tables, one per KV cache group: int32, max_num_reqs x cdiv(max_model_len,
    block_size) each (`MultiGroupBlockTable`, v0.11+; a group with one block per request,
    Mamba in mode none, has one column). Rows come from a stack of their own."""

    def __init__(self, max_requests: int, columns: Sequence[int]) -> None:
        self.max_requests = max_requests
        self.columns = list(columns)
        self._rows = list(range(max_requests - 1, -1, -1))

    @property
    def nbytes(self) -> int:
        return self.max_requests * sum(self.columns) * 4

    def alloc_row(self) -> int | None:
        return self._rows.pop() if self._rows else None

    def free_row(self, row: int) -> None:
        self._rows.append(row)

    def table(self, row: int, capacity: int) -> BlockTable:
        return BlockTable(capacity)

    def write_grown(self, reqs: Sequence[Holder], ws: Sequence[int],
                    ts: Sequence[int]) -> None:
        pass

    def check_invariants(self, live: Sequence[Live]) -> None:
        rows = sorted([*self._rows, *(row for _, row, _, _ in live)])
        if rows != list(range(self.max_requests)):
            raise InvariantError("vllm: block-table rows lost or handed out twice")


class TokenSlotTable(PageTable):
    """The token-to-slot page table (`ReqToTokenPool`) of a full-attention model: each
    written position's slot mirrored from the request's (only) block table."""

    def __init__(self, pool: ReqToTokenPool, page_size: int) -> None:
        self.pool = pool
        self.page_size = page_size
        self._offsets = np.arange(page_size, dtype=np.int64)  # slots within a block

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes

    def alloc_row(self) -> int | None:
        return self.pool.alloc_row()

    def free_row(self, row: int) -> None:
        self.pool.free_row(row)

    def table(self, row: int, capacity: int) -> BlockTable:
        return BlockTable(capacity)

    def write_grow(self, row: int, table: BlockTable, start: int, end: int) -> None:
        ps = self.page_size
        first = start // ps
        bt = table.block_slice(first, cdiv(end, ps))
        slots = (bt[:, None] * ps + self._offsets).ravel()  # every slot of those blocks
        self.pool.write_range(row, start, slots[start - first * ps : end - first * ps])

    def write_step(self, reqs: Sequence[Holder], written: list[int]) -> None:
        if not reqs:
            return
        ps = self.page_size
        slots = [r.tables[0].last * ps + w % ps for r, w in zip(reqs, written, strict=True)]
        self.pool.write_run(_rows(reqs), np.array(written, dtype=np.int64), 1,
                            np.array(slots, dtype=np.int64), top=max(written))

    def write_grid(self, reqs: Sequence[Holder], pos: np.ndarray, new: np.ndarray,
                   last: np.ndarray) -> None:
        ps = self.page_size
        blocks = pages_at_steps(pos, new, last, ps)
        self.pool.write_at(_rows(reqs)[None, :], pos, blocks * ps + pos % ps)

    def check_invariants(self, live: Sequence[Live]) -> None:
        self.pool.check_invariants()
        ps = self.page_size
        table = self.pool.req_to_token
        for rid, row, written, t in live:
            pos = torch.arange(written)
            tb = torch.from_numpy(t.blocks.copy())
            want = (tb[pos // ps] * ps + pos % ps).to(torch.int32) if written else pos.int()
            if not torch.equal(table[row, :written].cpu(), want):
                raise InvariantError(f"vllm: page-table row of request {rid} is wrong")


class RowBlockTables(TokenSlotTable):
    """At page size 1 with the page table on the host: each request's block table is its
    page-table row (`RowBlockTable`), so the table's own writes are the page table's."""

    def __init__(self, pool: ReqToTokenPool) -> None:
        super().__init__(pool, 1)
        assert pool.host is not None, "a block table kept in a row needs the host view"
        self.host = pool.host

    def table(self, row: int, capacity: int) -> BlockTable:
        return RowBlockTable(self.host[row])

    def write_grow(self, row: int, table: BlockTable, start: int, end: int) -> None:
        pass

    def write_grown(self, reqs: Sequence[Holder], ws: Sequence[int],
                    ts: Sequence[int]) -> None:
        pass

    def write_step(self, reqs: Sequence[Holder], written: list[int]) -> None:
        pass

    def write_grid(self, reqs: Sequence[Holder], pos: np.ndarray, new: np.ndarray,
                   last: np.ndarray) -> None:
        pass

    def check_invariants(self, live: Sequence[Live]) -> None:
        for rid, row, _, t in live:
            if not isinstance(t, RowBlockTable) or not t.keeps_row(self.host, row):
                raise InvariantError(f"vllm: request {rid} keeps its blocks outside its row")
        super().check_invariants(live)


__all__ = ["BlockTable", "GroupBlockTables", "PageTable", "RowBlockTable", "RowBlockTables",
           "TokenSlotTable"]
