"""`paged` and `paged-nocache`: SGLang's memory system, registered by name.

`paged` is `PagedPolicy` (kvcore/policies/paged_radix.py: PagedAllocator + RadixCache), or
`TieredPagedPolicy` (kvcore/policies/paged_tiers.py) when the configuration asks for a host
tier, or `HybridPagedPolicy` (kvcore/policies/paged_hybrid.py: SGLang's full / SWA / Mamba
pools) when the layout is hybrid. `paged-nocache` is the same pool with the radix cache
disabled (SGLang's --disable-radix-cache): a configuration of `paged` under its own name.
"""

from __future__ import annotations

from kvcore.policies.base import KVPolicy, PolicyConfig, register_policy
from kvcore.policies.paged_hybrid import HybridPagedPolicy
from kvcore.policies.paged_radix import PagedPolicy
from kvcore.policies.paged_tiers import TieredPagedPolicy


class PagedNoCachePolicy(PagedPolicy):
    """`paged` without its prefix cache: every request pages privately, nothing is kept."""

    name = "paged-nocache"

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config, cache_enabled=False)


@register_policy("paged", when="SGLang's paged pool + radix prefix cache: the default for "
                 "real traffic, any page size; reuses shared prefixes",
                 caches_prefix=True, supports_tiers=True, supports_hybrid=True,
                 reads=("eviction",))
def _make_paged(config: PolicyConfig) -> KVPolicy:
    if config.is_hybrid:
        return _hybrid(config, cache_enabled=True)
    tier_config = config.tier_config
    if tier_config.enabled:
        return TieredPagedPolicy(config, tier_config)
    return PagedPolicy(config, cache_enabled=True)


@register_policy("paged-nocache", when="paging without prefix reuse: isolates what the radix "
                 "cache buys (vLLM paper's vLLM setting; SGLang --disable-radix-cache)",
                 supports_hybrid=True)
def _make_paged_nocache(config: PolicyConfig) -> KVPolicy:
    if config.is_hybrid:
        return _hybrid(config, cache_enabled=False)
    return PagedNoCachePolicy(config)


def _hybrid(config: PolicyConfig, cache_enabled: bool) -> KVPolicy:
    """SGLang's hybrid pools; no host tier behind them (its hybrid caches have their own
    HiCache variants, not modelled here)."""
    if config.tier_config.enabled:
        raise ValueError("a host tier (--hicache-size / --hicache-ratio) is not supported "
                         "on a hybrid layout")
    return HybridPagedPolicy(config, cache_enabled=cache_enabled)


__all__ = ["HybridPagedPolicy", "PagedNoCachePolicy", "PagedPolicy", "TieredPagedPolicy"]
