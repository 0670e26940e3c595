"""`vllm`: vLLM v1's KV cache manager, registered by name.

`VLLMBlockPolicy` (kvcore/policies/vllm_block.py: the block pool with hash-chained prefix
caching), or `TieredVLLMPolicy` (kvcore/policies/vllm_tiers.py) when the configuration asks
for a host tier, or, on a hybrid layout (`PolicyConfig.layout` with sliding-window, chunked,
linear-attention or Mamba layers), `VLLMHybridPolicy` (kvcore/policies/vllm_hybrid.py: the
hybrid KV cache manager's groups over one shared block pool).
"""

from __future__ import annotations

from kvcore.policies.base import KVPolicy, PolicyConfig, register_policy
from kvcore.policies.vllm_block import VLLMBlockPolicy
from kvcore.policies.vllm_hybrid import VLLMHybridPolicy
from kvcore.policies.vllm_tiers import TieredVLLMPolicy


@register_policy(
    "vllm",
    when="compare with vLLM v1: paged blocks, prefix caching of full blocks via chained hashes",
    caches_prefix=True, supports_tiers=True, supports_hybrid=True,
)
def _make_vllm(config: PolicyConfig) -> KVPolicy:
    tier_config = config.tier_config
    if config.layout is not None and config.layout.is_hybrid:
        if tier_config.enabled:
            raise ValueError("--hicache-size: policy vllm has no host tier on a hybrid layout "
                             f"({config.layout.mix})")
        return VLLMHybridPolicy(config)
    if tier_config.enabled:
        return TieredVLLMPolicy(config, tier_config)
    return VLLMBlockPolicy(config)


__all__ = ["TieredVLLMPolicy", "VLLMBlockPolicy", "VLLMHybridPolicy"]
