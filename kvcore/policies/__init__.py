"""KV allocation policies behind one interface, registered by name."""

from kvcore.policies import (  # noqa: F401  (registration)
    contiguous,
    paged,
    paged_tiers,
    vllm_block,
    vllm_tiers,
)
from kvcore.policies.base import (
    AdmitResult,
    KVPolicy,
    PolicyConfig,
    make_policy,
    policy_help,
    policy_names,
    register_policy,
)

__all__ = [
    "AdmitResult",
    "KVPolicy",
    "PolicyConfig",
    "make_policy",
    "policy_help",
    "policy_names",
    "register_policy",
]
