"""`Registry[T]` (kvcore/contract/registry.py), the one way every named part is chosen, and the
kinds registered through it: same errors, capabilities on the entries, each name once.
Cost: < 0.1 s."""

from __future__ import annotations

import pytest

from kvcore.contiguous.placement import PLACEMENTS
from kvcore.contract.registry import Registry
from kvcore.contract.tiers import WRITES
from kvcore.policies import POLICIES, PolicyConfig, make_policy, policy_kind
from kvcore.sglang.node import EVICTION_PRIORITIES
from kvcore.sglang.policy import FullAttentionPolicy


def test_register_get_names_in_order() -> None:
    reg: Registry[int] = Registry("widget")
    assert reg.register("b", when="pick b")(2) == 2
    reg.add("a", 1)
    assert reg.names() == ["b", "a"] and list(reg) == ["b", "a"] and len(reg) == 2
    assert reg.get("a") == 1 and "b" in reg and "c" not in reg
    assert reg.help() == {"b": "pick b", "a": ""}
    reg.add("a", 1)  # the same entry again is harmless (a module imported twice)


def test_unknown_name_is_one_line_naming_the_known_ones() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("x", 1)
    reg.add("y", 2)
    with pytest.raises(ValueError, match=r"^unknown widget 'z'; known: x, y$"):
        reg.get("z")
    with pytest.raises(ValueError, match="unknown widget"):
        reg.get(["x"])  # type: ignore[arg-type]  # unhashable: the same error


def test_a_name_twice_or_blank_is_an_error() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("x", 1)
    with pytest.raises(ValueError, match="widget 'x' is registered twice"):
        reg.add("x", 2)
    with pytest.raises(ValueError, match="non-empty"):
        reg.add(" y", 3)


@pytest.mark.parametrize(("registry", "label"), [
    (POLICIES, "policy"), (PLACEMENTS, "placement"), (EVICTION_PRIORITIES, "eviction policy"),
    (WRITES, "write policy"),
])
def test_every_kvcore_kind_answers_alike(registry: Registry, label: str) -> None:
    with pytest.raises(ValueError, match=rf"unknown {label} 'nope'; known: "
                       + ", ".join(registry.names())):
        registry.get("nope")


def test_policy_capabilities_are_declared_on_the_entries() -> None:
    caching = [n for n in POLICIES.names() if policy_kind(n).caches_prefix]
    tiered = [n for n in POLICIES.names() if policy_kind(n).supports_tiers]
    assert caching == ["paged", "vllm"] and tiered == ["paged", "vllm"]
    assert POLICIES.names() == ["contiguous-max", "contiguous-pow2", "contiguous-oracle",
                                "paged", "paged-nocache", "vllm"]


def test_paged_nocache_is_a_configuration_of_paged_with_its_own_name() -> None:
    cfg = PolicyConfig(kv_tokens=64, page_size=4)
    nocache, paged = make_policy("paged-nocache", cfg), make_policy("paged", cfg)
    assert type(nocache) is type(paged) is FullAttentionPolicy
    assert nocache.name == "paged-nocache" and paged.name == "paged"
    assert nocache.tree.disable and not paged.tree.disable
