"""KV allocation policies behind one interface, registered by name."""

from kvcore.policies import (  # noqa: F401  (registration)
    contiguous,
    paged,
)

# isort: split
import kvcore.vllm  # noqa: F401  (registration, after the others: the order they are listed)
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
