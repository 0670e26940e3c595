"""KV allocation policies behind one interface, registered by name."""

from kvcore.policies import (  # noqa: F401  (registration)
    contiguous,
    paged,
    vllm,
)
from kvcore.policies.base import (
    POLICIES,
    AdmitResult,
    KVPolicy,
    PolicyConfig,
    PolicyKind,
    make_policy,
    policy_help,
    policy_kind,
    policy_names,
    register_policy,
)

__all__ = [
    "POLICIES",
    "AdmitResult",
    "KVPolicy",
    "PolicyConfig",
    "PolicyKind",
    "make_policy",
    "policy_help",
    "policy_kind",
    "policy_names",
    "register_policy",
]
