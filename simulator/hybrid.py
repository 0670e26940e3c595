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
#: the PolicyConfig fields a hybrid run sets (`RunLayout.policy_kwargs`): its layout, KV
#: budget in bytes and vLLM version, and the hybrid options (named alike in PolicySpec)
HYBRID_POLICY_FIELDS: tuple[str, ...] = ("layout", "kv_bytes", "vllm_version",
                                         *HYBRID_OPTIONS[1:])


def hybrid_policies() -> list[str]:
    """The policies registered with a hybrid form (PolicyKind.supports_hybrid)."""
    return [n for n in POLICIES.names() if POLICIES.get(n).supports_hybrid]


def policy_engine(policy: PolicySpec) -> str:
    """The engine whose layout and state dtypes a hybrid run under `policy` follows."""
    return "vllm" if policy.policy == "vllm" else "sglang"


@dataclass(frozen=True)
class RunLayout:
    """What a run's model and options resolve to about its layer kinds, once per run and
    passed on (SimConfig.layout; RunOptions.run_layout in experiments/options/run_options.py), never
    resolved again by the parts that read it (the policy's config, the latency model, the
    summary's columns).

    `model`: the model's hybrid layout, its states in the dtypes of the policy's engine
    (kvcore.model.state_dtypes), whatever --kv-layout says (a summary shows those dtypes); None for
    a full-attention model. `hybrid`: --kv-layout hybrid. `mamba_cache_mode`: the mode a
    `vllm` run of a model with state layers uses (--mamba-cache-mode, else the version's
    pick); None otherwise. `key`: the options it was resolved from, so that a config copied
    with other options resolves its own (`resolve_layout`)."""

    model: HybridLayout | None
    hybrid: bool
    mamba_cache_mode: str | None
    key: tuple[object, ...]

    @property
    def layout(self) -> HybridLayout | None:
        """The layout the run simulates: None for a full-attention model and for the
        pre-hybrid baseline (`--kv-layout full-attention`)."""
        return self.model if self.hybrid else None

    def policy_kwargs(self, policy: PolicySpec, kv_bytes: int,
                      vllm_version: str) -> dict[str, object]:
        """Keyword arguments for PolicyConfig (HYBRID_POLICY_FIELDS): none for a
        full-attention run (its config is the one it always was); the layout, the budget in
        bytes, the vLLM version and the options given otherwise (an SGLang option not given
        keeps PolicyConfig's default, the engine's own; vLLM's mamba cache mode is the
        version's pick when not given)."""
        layout = self.layout
        if layout is None:
            return {}
        out: dict[str, object] = {"layout": layout, "kv_bytes": kv_bytes,
                                  "vllm_version": vllm_version}
        for name in HYBRID_OPTIONS[1:]:
            value = getattr(policy, name)
            if value is not None:
                out[name] = value
        if self.mamba_cache_mode is not None:
            out["mamba_cache_mode"] = self.mamba_cache_mode
        return out


#: a SimConfig's layout before it is resolved (its key matches no options)
UNRESOLVED = RunLayout(None, False, None, ())


def layout_key(policy: PolicySpec, model_id: str, vllm_version: str,
               mamba_cache_dtype: str | None,
               mamba_ssm_cache_dtype: str | None) -> tuple[object, ...]:
    """The options a RunLayout depends on."""
    return (policy.policy, policy.kv_layout, policy.enable_prefix_caching,
            policy.mamba_cache_mode, model_id, vllm_version, mamba_cache_dtype,
            mamba_ssm_cache_dtype)


def resolve_layout(policy: PolicySpec, model_id: str, vllm_version: str = DEFAULT_VLLM_VERSION,
                   mamba_cache_dtype: str | None = None,
                   mamba_ssm_cache_dtype: str | None = None,
                   known: RunLayout | None = None) -> RunLayout:
    """The RunLayout of these options: `known` when it was resolved from the same ones."""
    key = layout_key(policy, model_id, vllm_version, mamba_cache_dtype, mamba_ssm_cache_dtype)
    if known is not None and known.key == key:
        return known
    raw = hybrid_layout(model_id)
    if raw is None:
        return RunLayout(None, policy.kv_layout == "hybrid", None, key)
    model = resolve_state_dtypes(raw, policy_engine(policy), vllm_rules(vllm_version),
                                 mamba_cache_dtype, mamba_ssm_cache_dtype)
    hybrid = policy.kv_layout == "hybrid"
    # a mode given to the full-attention baseline is refused by check_hybrid_options, with
    # its own message: it is not checked against the version here
    mode = (run_mamba_cache_mode(policy, raw, vllm_version)
            if policy.policy == "vllm" and raw.state_groups()
            and (hybrid or policy.mamba_cache_mode is None) else None)
    return RunLayout(model, hybrid, mode, key)


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


def resolved_hybrid_options(policy: PolicySpec, run: RunLayout) -> dict[str, object]:
    """The hybrid options as a hybrid run's summary shows them: the values in effect (the
    engines' defaults, from PolicyConfig, where none was given; the mamba cache mode of a
    `vllm` run as its version picks it)."""
    defaults = PolicyConfig(kv_tokens=1)
    out: dict[str, object] = {"kv_layout": policy.kv_layout}
    for name in HYBRID_OPTIONS[1:]:
        value = getattr(policy, name)
        out[name] = getattr(defaults, name) if value is None else value
    if policy.mamba_cache_mode is None and run.mamba_cache_mode is not None:
        out["mamba_cache_mode"] = run.mamba_cache_mode
    return out


__all__ = ["HYBRID_OPTIONS", "HYBRID_POLICY_FIELDS", "UNRESOLVED", "RunLayout",
           "check_hybrid_options", "hybrid_policies", "layout_key", "policy_engine",
           "resolve_layout", "resolved_hybrid_options", "run_mamba_cache_mode"]
