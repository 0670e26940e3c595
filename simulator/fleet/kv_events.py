"""KV events: a replica's prefix cache, as the events its engine publishes, into a router's
`KVEventIndex`.

Two caches publish, through one callback attribute each (`kv_events`, called when blocks
enter or leave the cache):

* vLLM's block pool (`kvcore.vllm.block_pool`): the hashes of the blocks just cached, or of the
  blocks a pop evicts; these are vLLM's own block hashes at the pool's block size, so the
  router's block size must be the replica's page size, as llm-d requires of its precise
  scorer (`tokenProcessorConfig.blockSize` equal to vLLM's block size) and Dynamo of its
  `--kv-cache-block-size`.
* SGLang's radix tree (`kvcore.sglang.radix_cache`): the leaf whose tokens just entered the tree, or
  which is about to be evicted. A router block (`block` tokens, chained hashes of the path
  from the root) is cached when every one of its tokens is in the tree, so a leaf covering
  path positions [a, b) brings (or takes) the blocks that end within (a, b]. Any block size
  works; the radix tree's own pages need not match it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import simpy

from kvcore.contract.capabilities import PoolKinds, PrefixCache
from kvcore.contract.policy import KVPolicy
from kvcore.sglang.node import TreeNode
from kvcore.sglang.radix_cache import RadixCache
from kvcore.vllm.block_hash import NONE_HASH, ChainHasher
from kvcore.vllm.block_pool import BlockPool
from simulator.fleet.kv_index import KVEventIndex

__all__ = ["attach_kv_events", "event_block", "publishes_kv_events"]


def _cache_of(policy: KVPolicy) -> RadixCache | BlockPool | None:
    if not isinstance(policy, PrefixCache) or isinstance(policy, PoolKinds):
        return None
    for name in ("tree", "pool"):  # SGLangPolicy's radix tree, VLLMManager's block pool
        cache = getattr(policy, name, None)
        if isinstance(cache, (RadixCache, BlockPool)):
            return cache
    return None


def publishes_kv_events(policy: KVPolicy) -> bool:
    return _cache_of(policy) is not None


def event_block(policy: KVPolicy) -> int:
    """The block (tokens) of `policy`'s KV events: vLLM's block; a radix tree's page, or at
    page size 1 blocks of 16 tokens (vLLM's default block) rather than an event per token."""
    cache = _cache_of(policy)
    if isinstance(cache, BlockPool) or policy.page_size > 1:
        return policy.page_size
    return 16


def attach_kv_events(policy: KVPolicy, replica: int, index: KVEventIndex,
                     env: simpy.Environment, block: int, max_len: int) -> None:
    """Make `policy`'s cache publish to `index`, stamped with the simulated time; `block`:
    the router's block size in tokens."""
    cache = _cache_of(policy)
    if cache is None:
        raise ValueError(f"--policy {policy.name} publishes no KV events (a router reading "
                         "the replicas' caches needs a prefix cache of paged or vllm)")
    if isinstance(cache, BlockPool):
        if block != cache.page_size:
            raise ValueError(f"router block size {block} differs from --page-size "
                             f"{cache.page_size}: vllm's KV events carry its own block "
                             "hashes, so the router must use the replica's block size")

        def on_blocks(stored: bool, hashes: np.ndarray) -> None:
            index.emit(env.now, replica, stored, hashes)

        cache.kv_events = on_blocks
        return
    cache.kv_events = _radix_events(index, replica, env, ChainHasher(block, max_len), block)


class _NodeBlocks(NamedTuple):
    """The router blocks of one radix node: those ending within it when it was hashed."""

    first: int  # the first of them (the node's start // block then)
    hashes: np.ndarray  # their chained hashes (uint64), blocks first .. end // block - 1
    end_hash: int  # the hash of the last block ending at or before the node's end
    end: int  # the node's end: tokens on its path from the root


class _RadixBlocks:
    """The router-block hashes of a radix tree's nodes, each node hashed once.

    A node's end (its path length) and the blocks ending at or before it never change while
    it is in the tree: a split puts a new node above it, so only its start moves, forward.
    So a node's hashes are kept until it is evicted, and a node is hashed from its parent's
    last block hash (the chain from the root's NONE_HASH, block by block, is the same
    function) over its own tokens, plus the tail of a block it starts inside; a node evicted
    after a split sends the suffix of what it was hashed as, the blocks ending within it
    now."""

    def __init__(self, hasher: ChainHasher, block: int) -> None:
        self.hasher = hasher
        self.block = block
        self.known: dict[TreeNode, _NodeBlocks] = {}
        self.root = _NodeBlocks(0, np.zeros(0, dtype=np.uint64), NONE_HASH, 0)

    def blocks(self, node: TreeNode) -> np.ndarray:
        """Hashes of the blocks ending within `node` (a non-root node in the tree)."""
        got = self._of(node)
        start = got.end - len(node.key)
        return got.hashes[start // self.block - got.first:]

    def forget(self, node: TreeNode) -> None:
        """`node` leaves the tree."""
        self.known.pop(node, None)

    def _of(self, node: TreeNode) -> _NodeBlocks:
        known = self.known
        todo: list[TreeNode] = []  # nodes not hashed yet, from `node` up
        n: TreeNode | None = node
        while n is not None and n.parent is not None and n not in known:
            todo.append(n)
            n = n.parent
        got = self.root if n is None or n.parent is None else known[n]
        for n in reversed(todo):
            got = known[n] = self._hash(n, got)
        return got

    def _hash(self, node: TreeNode, parent: _NodeBlocks) -> _NodeBlocks:
        block = self.block
        start = parent.end
        end = start + len(node.key)
        first, last = start // block, end // block
        if last == first:
            return _NodeBlocks(first, self.root.hashes, parent.end_hash, end)
        tokens = node.key[: last * block - start]
        lead = start - first * block  # tokens of the first block above the node
        if lead:
            parts = [tokens]
            above = node.parent
            while lead:
                assert above is not None
                part = above.key[-lead:] if len(above.key) >= lead else above.key
                parts.append(part)
                lead -= len(part)
                above = above.parent
            tokens = np.concatenate(parts[::-1])
        hashes = self.hasher.chain(parent.end_hash, tokens)
        return _NodeBlocks(first, hashes, int(hashes[-1]), end)


def _radix_events(index: KVEventIndex, replica: int, env: simpy.Environment,
                  hasher: ChainHasher, block: int) -> Callable[[bool, TreeNode], None]:
    blocks = _RadixBlocks(hasher, block)

    def on_leaf(stored: bool, leaf: TreeNode) -> None:
        hashes = blocks.blocks(leaf)
        if not stored:
            blocks.forget(leaf)
        if len(hashes):
            index.emit(env.now, replica, stored, hashes)

    return on_leaf
