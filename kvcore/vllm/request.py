"""One admitted request as the `vllm` manager keeps it (vLLM's `Request` as its KV cache
manager reads it): the token ids known so far, the hash chain of their full blocks, the tokens
written, and its block table in every KV cache group."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvcore.vllm.block_table import BlockTable


class Request:
    """`row`: its page-table row; `ids`: the token ids known (the prompt, then what
    `cache_prefix` / `finish` gave); `chain`: the hashes of the first full blocks of `ids`
    (vLLM's `block_hashes`), extended as more are needed; `written`: tokens with KV (vLLM's
    num_computed_tokens); `skip_at`: `written` when the blocks its windows and states no
    longer need were last freed; `tables`: one block table per KV cache group."""

    __slots__ = ("chain", "final_len", "ids", "row", "skip_at", "tables", "written")

    def __init__(self, row: int, ids: np.ndarray, final_len: int,
                 tables: list[BlockTable]) -> None:
        self.row = row
        self.ids = ids
        self.final_len = final_len
        self.chain = np.zeros(0, dtype=np.uint64)
        self.written = 0
        self.skip_at = 0
        self.tables = tables


__all__ = ["Request"]
