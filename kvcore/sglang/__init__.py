"""SGLang's memory system: one manager for every layout (kvcore/sglang/policy.py), its radix
cache, allocators, side pools and HiCache tiers; DEVELOPERS.md maps the modules.

The factories below build the `paged` and `paged-nocache` policies (registered in the catalog,
kvcore/policies/__init__.py): `paged` is the manager with its radix cache, with the
capabilities of the configuration's layout and tiers (the classes at the end of
kvcore/sglang/policy.py); `paged-nocache` is the same pool with the radix cache disabled
(SGLang's --disable-radix-cache, its chunk cache).
"""

from __future__ import annotations

from kvcore.contract.policy import KVPolicy, PolicyConfig
from kvcore.sglang.policy import FullAttentionPolicy, PoolKindsPolicy, TieredPolicy

__all__ = ["make_paged", "make_paged_nocache"]


def make_paged(config: PolicyConfig) -> KVPolicy:
    """The `paged` policy of `config`."""
    return _build(config, cache_enabled=True)


def make_paged_nocache(config: PolicyConfig) -> KVPolicy:
    """The `paged-nocache` policy of `config`."""
    return _build(config, cache_enabled=False)


def _build(config: PolicyConfig, cache_enabled: bool) -> KVPolicy:
    """The manager with the capabilities `config` gives it. SGLang's hybrid caches have their
    own HiCache variants, not modelled here: a hybrid layout takes no host tier."""
    tiered = cache_enabled and config.tier_config.enabled
    if config.is_hybrid:
        if config.tier_config.enabled:
            raise ValueError("a host tier (--hicache-size / --hicache-ratio) is not supported "
                             "on a hybrid layout")
        return PoolKindsPolicy(config, cache_enabled)
    if tiered:
        return TieredPolicy(config, cache_enabled)
    return FullAttentionPolicy(config, cache_enabled)
