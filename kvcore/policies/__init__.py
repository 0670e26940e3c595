"""The catalog of KV allocation policies: every policy registered by name, with the one-line
"pick it when" users see and what it can do.

The families build their policies (kvcore/contiguous/, kvcore/sglang/, kvcore/vllm/) behind the
one interface of kvcore/contract/policy.py and know nothing of this catalog; it imports them
and registers each factory here, so the order the policies are listed in is the order of the
registrations at the end of this module, whatever a program imports first. Read the registry
(`make_policy`, `policy_names`, `policy_kind`, `POLICIES`) from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvcore.contiguous.policy import ContiguousMax, ContiguousOracle, ContiguousPow2
from kvcore.contract.policy import AdmitResult, KVPolicy, PolicyConfig
from kvcore.contract.registry import Registry
from kvcore.sglang import make_paged, make_paged_nocache
from kvcore.vllm import make_vllm

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

PolicyFactory = Callable[[PolicyConfig], KVPolicy]


@dataclass(frozen=True)
class PolicyKind:
    """A registered policy: how to build it from its `PolicyConfig`, the one-line "pick it
    when" users see, and what it can do, declared once so that option checks and the run
    builder ask the entry instead of keeping lists of names."""

    build: PolicyFactory
    when: str
    caches_prefix: bool = False  # keeps a prefix cache (--enable-prefix-caching applies)
    supports_tiers: bool = False  # can put a host (and storage) tier behind the device pool
    supports_hybrid: bool = False  # builds a hybrid policy when PolicyConfig.layout is hybrid
    # the choices only some kinds read (PolicyConfig `placement`, `eviction`): an option a
    # kind does not read is refused for it (experiments/options/option_rules.py)
    reads: tuple[str, ...] = ()


#: every policy, registered below in the order `kvsim policies` lists them
POLICIES: Registry[PolicyKind] = Registry("policy")


def register_policy(name: str, when: str, *, caches_prefix: bool = False,
                    supports_tiers: bool = False, supports_hybrid: bool = False,
                    reads: tuple[str, ...] = ()) -> Callable[[PolicyFactory], PolicyFactory]:
    """Register a factory under `name` with its capabilities; `when` is the one-line 'pick it
    when' shown to users."""

    def deco(factory: PolicyFactory) -> PolicyFactory:
        POLICIES.add(name, PolicyKind(factory, when, caches_prefix, supports_tiers,
                                      supports_hybrid, reads), when)
        return factory

    return deco


def policy_names() -> list[str]:
    return POLICIES.names()


def policy_help() -> dict[str, str]:
    return POLICIES.help()


def policy_kind(name: str) -> PolicyKind:
    """The registered entry of `name`; an unknown name lists the known ones."""
    return POLICIES.get(name)


def make_policy(name: str, config: PolicyConfig) -> KVPolicy:
    """Build a registered policy by name; an unknown name lists the known ones. A hybrid
    layout is refused, in one line, by a policy that has no hybrid form."""
    kind = POLICIES.get(name)
    if config.is_hybrid and not kind.supports_hybrid:
        able = [n for n in POLICIES.names() if POLICIES.get(n).supports_hybrid]
        raise ValueError(f"policy {name!r} does not support hybrid layouts; use "
                         f"{' or '.join(able)}")
    return kind.build(config)


# -- the policies, in the order `kvsim policies` lists them -----------------------------------

register_policy(
    "contiguous-max",
    when="baseline Orca (Max): every request reserves the maximum context length up front",
    reads=("placement",),
)(ContiguousMax)
register_policy(
    "contiguous-pow2",
    when="baseline Orca (Pow2): reserve the prompt plus the output rounded up to a power of two",
    reads=("placement",),
)(ContiguousPow2)
register_policy(
    "contiguous-oracle",
    when="upper bound Orca (Oracle): reserve exactly the final length, as if it were known",
    reads=("placement",),
)(ContiguousOracle)
register_policy(
    "paged", when="SGLang's paged pool + radix prefix cache: the default for real traffic, any "
    "page size; reuses shared prefixes",
    caches_prefix=True, supports_tiers=True, supports_hybrid=True, reads=("eviction",),
)(make_paged)
register_policy(
    "paged-nocache", when="paging without prefix reuse: isolates what the radix cache buys "
    "(vLLM paper's vLLM setting; SGLang --disable-radix-cache)",
    supports_hybrid=True,
)(make_paged_nocache)
register_policy(
    "vllm",
    when="compare with vLLM v1: paged blocks, prefix caching of full blocks via chained hashes",
    caches_prefix=True, supports_tiers=True, supports_hybrid=True,
)(make_vllm)
