"""The `vllm` policy's per-request state: its block table (a numpy array grown by doubling,
its last block kept as an int for decode), its token ids and hash chain, and its page-table
row. Kept apart from kvcore/policies/vllm_block.py (the manager) so each stays one job."""

from __future__ import annotations

import numpy as np

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

    def add_block(self, b: int) -> None:
        """`add_blocks` of one block (decode's case, kept free of array slicing)."""
        n = self.nblocks
        if n == len(self._blocks):
            self._blocks = np.concatenate([self._blocks, np.zeros(n, dtype=np.int64)])
        self._blocks[n] = b
        self.nblocks = n + 1
        self.last = b
