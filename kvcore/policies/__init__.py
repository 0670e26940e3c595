"""KV allocation policies behind one interface, registered by name."""

# registration, in the order `kvsim policies` lists them
from kvcore.policies import contiguous  # noqa: I001, F401
from kvcore.sglang import registered  # noqa: F401
import kvcore.vllm  # noqa: F401
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
