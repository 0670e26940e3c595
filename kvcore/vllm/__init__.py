"""The vLLM family: vLLM v1's KV cache manager over one block pool, registered as `vllm`.

One manager for every model (kvcore/vllm/manager.py `VLLMManager`): a model whose layers are
all full attention is one KV cache group; a hybrid model (sliding-window, chunked, linear
attention or Mamba layers) has one group per kind, all drawing blocks from the same pool
(vLLM's hybrid KV cache manager). The factory (registered in the catalog,
kvcore/policies/__init__.py) picks what the engine sees: the manager itself,
the manager reporting its pools per layer kind on a hybrid layout
(kvcore/vllm/pool_kinds.py `PooledVLLMManager`), or the manager with a host (and storage)
tier behind a full-attention model (kvcore/vllm/tiered.py `TieredVLLMManager`).
"""

from __future__ import annotations

from kvcore.contract.policy import KVPolicy, PolicyConfig
from kvcore.vllm.manager import VLLMManager
from kvcore.vllm.pool_kinds import PooledVLLMManager
from kvcore.vllm.tiered import TieredVLLMManager


def make_vllm(config: PolicyConfig) -> KVPolicy:
    """The `vllm` policy of `config`: its model's layout decides the groups."""
    tier_config = config.tier_config
    if config.layout is not None and config.layout.is_hybrid:
        if tier_config.enabled:
            raise ValueError("--hicache-size: policy vllm has no host tier on a hybrid layout "
                             f"({config.layout.mix})")
        return PooledVLLMManager(config)
    if tier_config.enabled:
        return TieredVLLMManager(config, tier_config)
    return VLLMManager(config)


__all__ = ["PooledVLLMManager", "TieredVLLMManager", "VLLMManager", "make_vllm"]
