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

import numpy as np
import simpy

from kvcore.contract.capabilities import PoolKinds, PrefixCache
from kvcore.contract.policy import KVPolicy
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


def _radix_events(index: KVEventIndex, replica: int, env: simpy.Environment,
                  hasher: ChainHasher, block: int) -> Callable[[bool, object], None]:
    def on_leaf(stored: bool, leaf) -> None:
        keys = []
        node = leaf
        while node.parent is not None:
            keys.append(node.key)
            node = node.parent
        path = keys[0] if len(keys) == 1 else np.concatenate(keys[::-1])
        end = len(path)
        first, last = (end - len(leaf.key)) // block, end // block
        if last > first:
            hashes = hasher.chain(NONE_HASH, path[: last * block])[first:]
            index.emit(env.now, replica, stored, hashes)

    return on_leaf
