"""The policy contract DEVELOPERS.md states is the one the classes define: its list of calls
per interface (between the `contract` markers) equals the public methods of `KVPolicy` and of
each capability in kvcore/contract/capabilities.py, and every registered policy is a
`KVPolicy` whose capabilities agree with its registry entry. Cost: < 0.1 s."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np

from kvcore.contract.capabilities import (
    CAPABILITIES,
    DecodeStretch,
    LowerTiers,
    PrefixCache,
    Reserving,
)
from kvcore.policies import POLICIES, KVPolicy, PolicyConfig, make_policy

ROOT = Path(__file__).resolve().parents[2]


def _documented() -> dict[str, set[str]]:
    text = (ROOT / "DEVELOPERS.md").read_text()
    block = text.split("<!-- contract -->", 1)[1].split("<!-- /contract -->", 1)[0]
    out: dict[str, set[str]] = {}
    for item in re.split(r"\n\s*- ", "\n" + block.strip())[1:]:
        head, _, calls = item.partition(":")
        name = re.search(r"`(\w+)`", head)
        assert name is not None, item
        out[name.group(1)] = set(re.findall(r"`(\w+)`", calls.split("; attributes")[0]))
    return out


def _own_methods(cls: type) -> set[str]:
    """Public methods `cls` defines itself (a capability: beyond KVPolicy)."""
    base = set(dir(KVPolicy)) if cls is not KVPolicy else set(dir(object))
    return {n for n, v in inspect.getmembers(cls, callable)
            if not n.startswith("_") and n not in base
            and not isinstance(inspect.getattr_static(cls, n), staticmethod)}


def test_developers_md_lists_exactly_the_interfaces_calls() -> None:
    doc = _documented()
    assert set(doc) == {"KVPolicy", *(c.__name__ for c in CAPABILITIES)}
    for cls in (KVPolicy, *CAPABILITIES):
        assert doc[cls.__name__] == _own_methods(cls), cls.__name__
    # the lifecycle and what the issue names as its core are all abstract but the defaults
    assert KVPolicy.__abstractmethods__ == doc["KVPolicy"] - {"free_tokens", "close"}


def test_registered_policies_declare_what_their_entries_say() -> None:
    cfg = PolicyConfig(kv_tokens=256, page_size=4, max_context_len=64, max_requests=4)
    tiered = PolicyConfig(kv_tokens=256, page_size=4, max_context_len=64, max_requests=4,
                          host_tokens=64)
    for name in POLICIES.names():
        kind = POLICIES.get(name)
        pol = make_policy(name, cfg)
        assert isinstance(pol, KVPolicy) and isinstance(pol, DecodeStretch)
        # a cache-holding entry builds a PrefixCache; a reserving one is never one
        assert not kind.caches_prefix or isinstance(pol, PrefixCache), name
        assert not (isinstance(pol, Reserving) and isinstance(pol, PrefixCache)), name
        assert not isinstance(pol, LowerTiers), name
        if kind.supports_tiers:
            assert isinstance(make_policy(name, tiered), LowerTiers), name


def test_reserving_is_declared_not_probed() -> None:
    cfg = PolicyConfig(kv_tokens=256, page_size=4, max_context_len=64, max_requests=4)
    reserving = [n for n in POLICIES.names() if isinstance(make_policy(n, cfg), Reserving)]
    assert reserving == ["contiguous-max", "contiguous-pow2", "contiguous-oracle"]
    pol = make_policy("contiguous-oracle", cfg)
    assert isinstance(pol, Reserving) and pol.reservation(4, 9, 6) == 12  # 9 -> 3 pages
    assert pol.admit(1, np.arange(4), 9, 6) is not None
