"""`build_policy` (simulator/run.py) names every PolicyConfig field from the spec that owns
it: a non-default value of each reaches the policy, and a spec without a field is an error,
never PolicyConfig's silent default. Cost: < 0.5 s."""

from __future__ import annotations

from dataclasses import fields, replace
from types import SimpleNamespace

import pytest

from kvcore.policies import PolicyConfig
from simulator.config import SimConfig
from simulator.hybrid import HYBRID_OPTIONS
from simulator.run import build_policy, policy_config


def _cfg() -> SimConfig:
    # every option a PolicyConfig reads set away from PolicyConfig's own default
    return SimConfig.of(policy="paged", page_size=8, kv_tokens=4096, max_context_len=1000,
                        max_running_requests=7, eviction="lfu", placement="best-fit",
                        kv_dtype="fp8", hicache_ratio=2.0,
                        storage_size=1.0, hicache_write_policy="write_back",
                        model="llama-3.1-8b")


def test_every_field_comes_from_a_spec() -> None:
    pc = policy_config(_cfg(), max_context_len=1000)
    default = PolicyConfig(kv_tokens=1)
    same = {f.name for f in fields(PolicyConfig)
            if getattr(pc, f.name) == getattr(default, f.name)}
    # only what a simulation fixes on purpose keeps the default: the CPU page table, no buffer;
    # and, on a full-attention model, the hybrid fields (test_hybrid_options.py sets them)
    assert same == {"device", "store_kv", "layout", "kv_bytes", "vllm_version",
                    *HYBRID_OPTIONS[1:]}
    assert (pc.page_size, pc.max_context_len, pc.max_requests) == (8, 1000, 7)
    assert (pc.eviction, pc.placement, pc.kv_dtype) == ("lfu", "best-fit", "fp8")
    assert pc.host_tokens == 2 * 4096 and pc.storage_tokens > 0
    assert pc.hicache_write_policy == "write_back"
    pol = build_policy(_cfg(), 1000)
    assert pol.page_size == 8 and pol.capacity == 4096


def test_a_renamed_spec_field_is_an_error_not_a_default() -> None:
    cfg = _cfg()
    # the policy spec as it would be with `page_size` renamed
    renamed = SimpleNamespace(**{("block_size" if k == "page_size" else k): v
                                 for k, v in vars(cfg.policy).items()})
    with pytest.raises(AttributeError, match="page_size"):
        policy_config(replace(cfg, policy=renamed), 1000)  # type: ignore[arg-type]


def test_a_tier_on_a_policy_without_one_names_those_with_one() -> None:
    cfg = SimConfig.of(policy="contiguous-max", kv_tokens=4096, hicache_ratio=1.0)
    with pytest.raises(ValueError, match="built for --policy paged or vllm, not "
                       "'contiguous-max'"):
        build_policy(cfg, 1000)


def test_every_policy_config_field_has_one_declared_source() -> None:
    """A PolicyConfig field is either copied from one spec field (POLICY_FROM_SPECS) or
    derived (DERIVED_POLICY_FIELDS), never both and never neither; each declared source is
    a field of the part it names."""
    from simulator.run import DERIVED_POLICY_FIELDS, POLICY_FROM_SPECS

    declared = [*POLICY_FROM_SPECS, *DERIVED_POLICY_FIELDS]
    assert sorted(declared) == sorted(f.name for f in fields(PolicyConfig))
    for part, name in POLICY_FROM_SPECS.values():
        assert name in {f.name for f in fields(getattr(SimConfig(), part))}, (part, name)
