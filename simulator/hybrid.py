"""Hybrid models in a run: which layout the run simulates, and whether its options apply.

A model whose layers are not all full attention (kvcore.model.hybrid_presets, or a --model-config
with several layer kinds) runs its own layout under `paged` / `paged-nocache` (SGLang's full,
SWA and state pools) and `vllm` (vLLM's KV cache groups), unless `--kv-layout full-attention`
asks for the pre-hybrid baseline: every layer stored as full attention, which is the path
every model took before (same pool, same latency model), so a compare of the two shows what
the hybrid layout saves.

The project's rule is that an option a run would ignore is an error (as
workloads/registry.py check_options_used does for workload options): the SGLang knobs apply
to `paged` / `paged-nocache` on a model with the layers they size, vLLM's Mamba cache mode to
`vllm` on a model with state layers, `--kv-layout full-attention` to a hybrid model. Each
misuse is one line naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcore.model.hybrid_presets import hybrid_layout
from kvcore.model.layers import CHUNKED, SLIDING, HybridLayout
from kvcore.model.presets import ModelPreset
from kvcore.model.state_dtypes import resolve_state_dtypes
from kvcore.model.vllm_rules import DEFAULT_VLLM_VERSION, vllm_rules
from kvcore.policies import POLICIES, PolicyConfig
from simulator.specs import PolicySpec

#: the options only a hybrid run has: a full-attention model's summary leaves them out, so
#: its columns (and config hash) stay what they were before hybrids
HYBRID_OPTIONS: tuple[str, ...] = ("kv_layout", "swa_full_tokens_ratio",
                                   "mamba_full_memory_ratio", "max_mamba_cache_size",
                                   "mamba_cache_mode")
SGLANG_POLICIES = ("paged", "paged-nocache")


def hybrid_policies() -> list[str]:
    """The policies registered with a hybrid form (PolicyKind.supports_hybrid)."""
    return [n for n in POLICIES.names() if POLICIES.get(n).supports_hybrid]


def policy_engine(policy: PolicySpec) -> str:
    """The engine whose layout and state dtypes a hybrid run under `policy` follows."""
    return "vllm" if policy.policy == "vllm" else "sglang"


def run_layout(policy: PolicySpec, model_id: str, vllm_version: str = DEFAULT_VLLM_VERSION,
               mamba_cache_dtype: str | None = None,
               mamba_ssm_cache_dtype: str | None = None) -> HybridLayout | None:
    """The hybrid layout a run of `model_id` simulates, its states in the dtypes of the
    policy's engine: None for a full-attention model and for the pre-hybrid baseline
    (`--kv-layout full-attention`)."""
    if policy.kv_layout != "hybrid":
        return None
    layout = hybrid_layout(model_id)
    if layout is None:
        return None
    return resolve_state_dtypes(layout, policy_engine(policy), vllm_rules(vllm_version),
                                mamba_cache_dtype, mamba_ssm_cache_dtype)


def run_mamba_cache_mode(policy: PolicySpec, layout: HybridLayout,
                         vllm_version: str = DEFAULT_VLLM_VERSION) -> str:
    """The mamba cache mode a `vllm` run of `layout` uses: `--mamba-cache-mode`, else the
    version's pick with prefix caching as `--enable-prefix-caching` says (None: the
    version's default for hybrids)."""
    return vllm_rules(vllm_version).mamba_cache_mode(
        layout.mamba2, policy.enable_prefix_caching, 0, policy.mamba_cache_mode)


def check_hybrid_options(policy: PolicySpec, model_id: str, tiers: bool,
                         vllm_version: str = DEFAULT_VLLM_VERSION) -> None:
    """ValueError (one line, naming the option) for a hybrid option this run would ignore,
    for a policy without a hybrid implementation and for a host tier on a hybrid run."""
    layout = hybrid_layout(model_id)
    if layout is None:
        if policy.kv_layout != "hybrid":
            raise ValueError(f"--kv-layout {policy.kv_layout}: {model_id} is all full "
                             "attention already (the option applies to hybrid models)")
        given = [n for n in HYBRID_OPTIONS[1:] if getattr(policy, n) is not None]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} applies to hybrid models; "
                             f"{model_id} is all full attention")
        return
    swa = any(g.kind in (SLIDING, CHUNKED) for g in layout.groups)
    state = bool(layout.state_groups())
    hybrid = policy.kv_layout == "hybrid"
    rules = (("swa_full_tokens_ratio", swa, SGLANG_POLICIES, "sliding-window or chunked"),
             ("mamba_full_memory_ratio", state, SGLANG_POLICIES, "Mamba / linear-attention"),
             ("max_mamba_cache_size", state, SGLANG_POLICIES, "Mamba / linear-attention"),
             ("mamba_cache_mode", state, ("vllm",), "Mamba / linear-attention"))
    for name, has_layers, policies, layers in rules:
        if getattr(policy, name) is None:
            continue
        opt = "--" + name.replace("_", "-")
        if not has_layers:
            raise ValueError(f"{opt} sizes {layers} layers; {model_id} has none "
                             f"({layout.mix})")
        if policy.policy not in policies:
            raise ValueError(f"{opt} is an option of --policy {' / '.join(policies)}, not "
                             f"of --policy {policy.policy}")
        if not hybrid:
            raise ValueError(f"{opt} sizes the hybrid pools; --kv-layout full-attention "
                             "stores every layer as full attention")
    if hybrid and policy.policy not in hybrid_policies():
        raise ValueError(f"--policy {policy.policy} has no hybrid layout for {model_id}; use "
                         f"--policy {', '.join(hybrid_policies())} or --kv-layout "
                         "full-attention")
    if hybrid and tiers:
        raise ValueError(f"--hicache-size / --hicache-ratio: host tiers of a hybrid model's "
                         f"pools are not modelled ({model_id}); use --kv-layout full-attention")
    if hybrid and policy.policy == "vllm" and layout.state_groups():
        run_mamba_cache_mode(policy, layout, vllm_version)  # the mode exists in the version


@dataclass(frozen=True)
class HybridFields:
    """The PolicyConfig fields of a hybrid run (empty for a full-attention one)."""

    layout: HybridLayout | None
    kv_bytes: int

    vllm_version: str = DEFAULT_VLLM_VERSION

    def policy_kwargs(self, policy: PolicySpec) -> dict[str, object]:
        """Keyword arguments for PolicyConfig: none for a full-attention run (its config is
        the one it always was); the layout, the budget, the vLLM version and the options
        given otherwise (an SGLang option not given keeps PolicyConfig's default, the
        engine's own; vLLM's mamba cache mode is the version's pick when not given)."""
        if self.layout is None:
            return {}
        out: dict[str, object] = {"layout": self.layout, "kv_bytes": self.kv_bytes,
                                  "vllm_version": self.vllm_version}
        for name in HYBRID_OPTIONS[1:]:
            value = getattr(policy, name)
            if value is not None:
                out[name] = value
        if policy.policy == "vllm" and self.layout.state_groups():
            out["mamba_cache_mode"] = run_mamba_cache_mode(policy, self.layout,
                                                           self.vllm_version)
        return out


def hybrid_fields(policy: PolicySpec, model: ModelPreset, kv_tokens: int, kv_bytes: int,
                  kv_dtype: str, tp: int, vllm_version: str = DEFAULT_VLLM_VERSION,
                  mamba_cache_dtype: str | None = None,
                  mamba_ssm_cache_dtype: str | None = None) -> HybridFields:
    """The layout and the per-rank KV budget in bytes (`kv_bytes`, or, when 0, the bytes of
    `kv_tokens` slots stored as full attention: the planner's figure for a direct size)."""
    layout = run_layout(policy, model.id, vllm_version, mamba_cache_dtype,
                        mamba_ssm_cache_dtype)
    if layout is None:
        return HybridFields(None, 0)
    return HybridFields(layout, kv_bytes or kv_tokens * model.kv_bytes_per_token(kv_dtype, tp),
                        vllm_version)


def resolved_hybrid_options(policy: PolicySpec, model_id: str | None = None,
                            vllm_version: str = DEFAULT_VLLM_VERSION) -> dict[str, object]:
    """The hybrid options as a hybrid run's summary shows them: the values in effect (the
    engines' defaults, from PolicyConfig, where none was given; the mamba cache mode of a
    `vllm` run as its version picks it)."""
    defaults = PolicyConfig(kv_tokens=1)
    out: dict[str, object] = {"kv_layout": policy.kv_layout}
    for name in HYBRID_OPTIONS[1:]:
        value = getattr(policy, name)
        out[name] = getattr(defaults, name) if value is None else value
    layout = hybrid_layout(model_id) if model_id is not None else None
    if (policy.policy == "vllm" and policy.mamba_cache_mode is None and layout is not None
            and layout.state_groups()):
        out["mamba_cache_mode"] = run_mamba_cache_mode(policy, layout, vllm_version)
    return out


__all__ = ["HYBRID_OPTIONS", "HybridFields", "check_hybrid_options", "hybrid_fields",
           "hybrid_policies", "policy_engine", "resolved_hybrid_options", "run_layout",
           "run_mamba_cache_mode"]
