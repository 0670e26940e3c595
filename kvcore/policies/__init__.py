"""KV allocation policies behind one interface, registered by name."""

from kvcore.policies.base import (
    AdmitResult,
    InvariantError,
    KVPolicy,
    MemoryBreakdown,
    PolicyConfig,
    make_policy,
    policy_help,
    policy_names,
    register_policy,
)
from kvcore.policies import paged  # noqa: F401  (registers paged, paged-nocache)

__all__ = [
    "AdmitResult",
    "InvariantError",
    "KVPolicy",
    "MemoryBreakdown",
    "PolicyConfig",
    "make_policy",
    "policy_help",
    "policy_names",
    "register_policy",
]
