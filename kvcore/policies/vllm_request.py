"""The `vllm` policy's per-request state: its block table (a numpy array grown by doubling,
its last block kept as an int for decode), its token ids and hash chain, and its page-table
row. Kept apart from kvcore/policies/vllm_block.py (the manager) so each stays one job.

At page size 1 a block is one token's slot, so the block table and the page-table row hold
the same numbers: `_RowReq` keeps its block table *in* the row (a numpy view of the host
table), and adding blocks is the page-table write itself, instead of one write to each (with
chunk 64 about 200 k additions of a few dozen blocks, and one per request per decode step)."""

from __future__ import annotations

import numpy as np

from kvcore.req_to_token_pool import ReqToTokenPool
from kvcore.validation import cdiv


def _ids(token_ids: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(token_ids, dtype=np.int64)


class _Req:
    __slots__ = ("_blocks", "chain", "final_len", "ids", "last", "nblocks", "nhashed", "row",
                 "written")

    def __init__(self, row: int, ids: np.ndarray, final_len: int, page_size: int) -> None:
        self.row = row
        self.ids = ids  # token ids known so far (the prompt, then whatever finish/cache gave)
        self.final_len = final_len
        self._blocks = np.zeros(max(cdiv(final_len, page_size), 1), dtype=np.int64)
        self.nblocks = 0  # the block table is _blocks[:nblocks]
        self.last = 0  # its last block, as an int (decode writes there)
        self.chain = np.zeros(0, dtype=np.uint64)  # hashes of ids' first full blocks
        self.nhashed = 0  # blocks[:nhashed] are registered under chain[:nhashed]
        self.written = 0

    @property
    def blocks(self) -> np.ndarray:
        return self._blocks[: self.nblocks]

    def add_blocks(self, new: np.ndarray) -> None:
        n, k = self.nblocks, len(new)
        if not k:
            return
        if n + k > len(self._blocks):
            grown = np.zeros(max(2 * len(self._blocks), n + k), dtype=np.int64)
            grown[:n] = self._blocks[:n]
            self._blocks = grown
        self._blocks[n : n + k] = new
        self.nblocks = n + k
        self.last = new.item(-1)

    def block_slice(self, start: int, end: int) -> np.ndarray:
        """Blocks start..end-1 of the table (int64; a view)."""
        return self._blocks[start:end]

    def block_at(self, i: int) -> int:
        return self._blocks.item(i)

    def put_tokens(self, got: np.ndarray, table: ReqToTokenPool) -> None:
        """At page size 1: the next len(got) positions are written into the blocks `got`
        (one block each, and each block is the slot), in the block table and the page
        table (`table`, through its checked write)."""
        self.add_blocks(got)
        table.write_range(self.row, self.written, got)
        self.written += len(got)

    def add_block(self, b: int) -> None:
        """`add_blocks` of one block (decode's case, kept free of array slicing)."""
        n = self.nblocks
        if n == len(self._blocks):
            self._blocks = np.concatenate([self._blocks, np.zeros(n, dtype=np.int64)])
        self._blocks[n] = b
        self.nblocks = n + 1
        self.last = b


class _RowReq(_Req):
    """A request at page size 1 whose block table is its page-table row: block i is
    `host[row, i]` of the page table's host view (int32), written there by `add_blocks`
    through the pool's checked `write_range` (the table's one writer, so the policy writes
    no page-table entry of its own). Reads hand out int64 copies: block ids index the
    pool's arrays, and numpy converts an int32 index array on every use. The row is shared
    with nothing while the request lives, and nothing reads it through this object after
    `release` frees the row."""

    __slots__ = ("_pool", "_row")

    def __init__(self, row: int, ids: np.ndarray, final_len: int,
                 pool: ReqToTokenPool) -> None:
        super().__init__(row, ids, 0, 1)  # no table of its own (a one-entry stand-in)
        assert pool.host is not None, "a row-kept block table needs the host view"
        self.final_len = final_len
        self._pool = pool  # the table's one writer: additions go through its checks
        self._row = pool.host[row]

    @property
    def blocks(self) -> np.ndarray:
        return self._row[: self.nblocks].astype(np.int64)

    def block_slice(self, start: int, end: int) -> np.ndarray:
        return self._row[start:end].astype(np.int64)

    def block_at(self, i: int) -> int:
        return self._row.item(i)

    def add_blocks(self, new: np.ndarray) -> None:
        n, k = self.nblocks, len(new)
        if not k:
            return
        self._pool.write_range(self.row, n, new)
        self.nblocks = n + k
        self.last = new.item(-1)

    def add_block(self, b: int) -> None:
        self.add_blocks(np.array([b], dtype=np.int64))

    def put_tokens(self, got: np.ndarray, table: ReqToTokenPool) -> None:
        """`_Req.put_tokens` as one slice write into the row, which is the block table (a
        prefill chunk at page size 1, about 89 k of them at chunk 64: the checked
        `write_range` cost twice the write). The caller checked the bounds
        (`check_extend_args`: positions below max_context_len); the row is this request's
        own while it lives, and a slice past the row's end is a shape error, not a silent
        write."""
        w = self.written
        t = w + len(got)
        self._row[w:t] = got
        self.nblocks = self.written = t
        self.last = got.item(-1)

    def grew(self, k: int, last: int) -> None:
        """`k` blocks were written into the row by the caller (a decode step's or stretch's
        page-table write), the last of them `last`."""
        self.nblocks += k
        self.written += k
        self.last = last
