"""`paged` and `paged-nocache`: SGLang's manager (kvcore/sglang/policy.py) registered by name.

`paged` is the manager with its radix cache, with the capabilities of the configuration's
layout and tiers (the classes at the end of kvcore/sglang/policy.py); `paged-nocache` is the
same pool with the radix cache disabled (SGLang's --disable-radix-cache, its chunk cache).

The factories import the manager when first called: kvcore/policies/__init__.py imports this
module while the policy base it builds on is still loading, and the policies are listed in the
order their modules register them.
"""

from __future__ import annotations

from kvcore.policies.base import KVPolicy, PolicyConfig, register_policy

__all__: list[str] = []


@register_policy("paged", when="SGLang's paged pool + radix prefix cache: the default for "
                 "real traffic, any page size; reuses shared prefixes",
                 caches_prefix=True, supports_tiers=True, supports_hybrid=True,
                 reads=("eviction",))
def _make_paged(config: PolicyConfig) -> KVPolicy:
    return _build(config, cache_enabled=True)


@register_policy("paged-nocache", when="paging without prefix reuse: isolates what the radix "
                 "cache buys (vLLM paper's vLLM setting; SGLang --disable-radix-cache)",
                 supports_hybrid=True)
def _make_paged_nocache(config: PolicyConfig) -> KVPolicy:
    return _build(config, cache_enabled=False)


def _build(config: PolicyConfig, cache_enabled: bool) -> KVPolicy:
    """The manager with the capabilities `config` gives it. SGLang's hybrid caches have their
    own HiCache variants, not modelled here: a hybrid layout takes no host tier."""
    from kvcore.sglang.policy import FullAttentionPolicy, PoolKindsPolicy, TieredPolicy

    tiered = cache_enabled and config.tier_config.enabled
    if config.is_hybrid:
        if config.tier_config.enabled:
            raise ValueError("a host tier (--hicache-size / --hicache-ratio) is not supported "
                             "on a hybrid layout")
        return PoolKindsPolicy(config, cache_enabled)
    if tiered:
        return TieredPolicy(config, cache_enabled)
    return FullAttentionPolicy(config, cache_enabled)
