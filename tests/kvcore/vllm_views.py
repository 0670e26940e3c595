"""Reads of the `vllm` manager's state the tests compare (kvcore/vllm/): none of them is
something the engine asks, so they live here rather than in the manager."""

from __future__ import annotations

import numpy as np

from kvcore.vllm.block_pool import BlockPool, HashedBlocks
from kvcore.vllm.manager import VLLMManager


def cached_free(pool: HashedBlocks) -> list[int]:
    """Free-queue blocks that still carry a hash, head (next evicted) first."""
    q = pool.peek_free(pool.get_num_free_blocks())
    return q[pool.is_hashed[q]].tolist()


def heads(pool: BlockPool, group: int = 0) -> dict[int, int]:
    """vLLM's `cached_block_hash_to_block` of one group: each hash's oldest holder."""
    gen = pool.indexes[group].gen
    hashes = np.unique(pool.block_hash[gen > 0]).tolist()
    return {h: pool.get_cached_blocks(h, group)[0] for h in hashes}


def tables(pol: VLLMManager, rid: int) -> list[list[int]]:
    """Per KV cache group, the request's block table (0: the null block)."""
    return [t.blocks.tolist() for t in pol.requests[rid].tables]


def blocks(pol: VLLMManager, rid: int) -> list[int]:
    """The block table of a full-attention model's request (its one group)."""
    (table,) = tables(pol, rid)
    return table
