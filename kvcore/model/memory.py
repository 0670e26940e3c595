"""`MemorySpec`: the memory one run is given, and the engines' budget rules that size it.

One frozen spec holds everything that decides how much KV memory there is: the model (a preset
or a Hugging Face config), the GPU (a preset, or any memory size), the tensor-parallel degree,
the KV dtype, the model's maximum context, and how the KV pool is sized: a direct size
(`kv_tokens` slots, `num_pages` pages, `kv_mem_gib` of KV for the whole tensor-parallel
group or `kv_cache_memory_bytes` per GPU, vLLM's `--kv-cache-memory-bytes`), or else a budget
rule (`vllm`, `sglang`, `trtllm`, `lmdeploy`) with its fraction, the activation peak and the
non-torch memory. A KV memory given directly may name a budget rule too: the rule then picks
the engine whose layout and rules a hybrid model follows (`engine`), and the number replaces
the rule's computation. For hybrid models it also holds the vLLM version whose rules apply
and the state dtypes (kvcore.model.vllm_rules, kvcore.model.state_dtypes).
`kvcore.model.planner.plan` and `resolve_kv_tokens` take it whole.

The budget rules live here rather than in the planner because the spec validates `--budget`
against them; the planner does the arithmetic. Each field is validated once, when the spec is
built (kvcore.contract.fields.check_fields plus the cross-field rules below).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from kvcore.contract.fields import MAX_I32, MAX_TOKENS, Domain, check_fields, flag, spec_field
from kvcore.model.hybrid_presets import CONFIG_LAYOUTS, LAYOUTS
from kvcore.model.hybrid_weights import preset_from_config
from kvcore.model.model_config import layout_from_hf_config
from kvcore.model.presets import ALIASES, DTYPE_BYTES, GPUS, MODELS, ModelPreset, get_model
from kvcore.model.state_dtypes import STATE_DTYPES
from kvcore.model.vllm_rules import DEFAULT_VLLM_VERSION, check_vllm_version

DEFAULT_ACTIVATION_PEAK_GIB = 2.0
DEFAULT_NON_TORCH_GIB = 0.5
DEFAULT_BUDGET = "sglang"  # the rule used when no pool size and no rule is given
DIRECT_SIZES: tuple[str, ...] = ("kv_tokens", "num_pages", "kv_mem_gib", "kv_cache_memory_bytes")
#: direct sizes in bytes, which a budget rule may accompany (it then names the engine)
MEMORY_SIZES: tuple[str, ...] = ("kv_mem_gib", "kv_cache_memory_bytes")
#: the memory options only a hybrid model reads (a full-attention model refuses them and its
#: summary leaves them out, as simulator/hybrid.py does for the policy's hybrid options)
HYBRID_MEMORY_OPTIONS: tuple[str, ...] = ("vllm_version", "mamba_cache_dtype",
                                          "mamba_ssm_cache_dtype")
ENGINES: tuple[str, ...] = ("vllm", "sglang")


def _sglang_fraction(tp: int) -> float:
    """mem_fraction_static as older SGLang releases picked it by TP size (more ranks, more
    headroom for communication buffers)."""
    if tp >= 16:
        return 0.79
    if tp >= 8:
        return 0.81
    if tp >= 4:
        return 0.85
    if tp >= 2:
        return 0.87
    return 0.88


@dataclass(frozen=True)
class BudgetRule:
    """One engine's way to size the KV pool; `budget` returns bytes per rank (may be < 0)."""

    name: str
    knob: str
    default_fraction: Callable[[int], float]
    formula: str
    budget: Callable[[float, float, float, float, float], float]  # total, w, act, nt, f
    native_page_size: int


BUDGET_RULES: dict[str, BudgetRule] = {r.name: r for r in [
    BudgetRule("vllm", "gpu_memory_utilization", lambda tp: 0.9,
               "f x total - weights - activation_peak - non_torch",
               lambda t, w, a, n, f: f * t - w - a - n, 16),
    BudgetRule("sglang", "mem_fraction_static", _sglang_fraction,
               "(total - weights - non_torch) - total x (1 - f)",
               lambda t, w, a, n, f: (t - w - n) - t * (1 - f), 1),
    BudgetRule("trtllm", "free_gpu_memory_fraction", lambda tp: 0.9,
               "f x (total - weights - activation_peak - non_torch)",
               lambda t, w, a, n, f: f * (t - w - a - n), 32),
    BudgetRule("lmdeploy", "cache_max_entry_count", lambda tp: 0.8,
               "f x (total - weights - non_torch)",
               lambda t, w, a, n, f: f * (t - w - n), 64),
]}


def check_tp(model: ModelPreset, tp: int) -> None:
    """The engines' tensor-parallel rule (vLLM's model-config check, SGLang's the same): the
    attention heads split evenly over the ranks, and the KV heads either split evenly
    (tp <= KV heads) or are replicated a whole number of times (tp > KV heads). MLA keeps one
    latent per rank, so only the attention heads count."""
    if tp == 1:
        return
    if model.num_heads % tp:
        raise ValueError(f"--tp {tp} does not divide {model.id}'s {model.num_heads} attention "
                         "heads (the engines split heads evenly over the ranks)")
    kv = model.num_kv_heads
    if not model.is_mla and (kv % tp if tp <= kv else tp % kv):
        raise ValueError(f"--tp {tp} does not fit {model.id}'s {kv} KV heads (they must split "
                         f"evenly, or be replicated evenly when --tp is above {kv})")


def _config_file(path: str) -> str:
    """--model-config: a config.json, or a model directory holding one (a Hugging Face
    checkout), as the file."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"--model-config {path!r} is a directory without a config.json")
        return str(p / "config.json")
    return path


def _preset_key(name: str) -> str:
    """How a model or GPU name is looked up: case-insensitive, aliases resolved."""
    key = name.lower()
    return ALIASES.get(key, key)


@dataclass(frozen=True)
class MemorySpec:
    """Model, GPUs, KV dtype, maximum context and the KV pool's size (direct or by a rule)."""

    model: str = spec_field("llama-3.1-8b", "model preset (see `kvsim models`)",
                            choices=lambda: sorted(MODELS), normalize=_preset_key)
    model_config: str | None = spec_field(
        None, "Hugging Face config.json to use instead of --model", path=True)
    gpu: str = spec_field("h100", "GPU preset (see `kvsim gpus`)", choices=lambda: sorted(GPUS),
                          normalize=_preset_key)
    gpu_mem_gib: float | None = spec_field(
        None, "GPU memory in GiB (any GPU; overrides the preset's)",
        domain=Domain(0, lo_inclusive=False), hashed=False)
    tp: int = spec_field(1, "tensor-parallel degree", domain=Domain(1, 1 << 16))
    kv_dtype: str = spec_field("bf16", "KV cache dtype", choices=lambda: sorted(DTYPE_BYTES))
    max_context_len: int | None = spec_field(
        None, "max context length (default: the model's maximum position)",
        domain=Domain(1, MAX_TOKENS))
    # the pool size: at most one direct size, or a budget rule
    kv_tokens: int | None = spec_field(None, "KV pool size in slots (tokens)",
                                       domain=Domain(1, MAX_I32), axis=True)
    num_pages: int | None = spec_field(
        None, "KV pool size in pages of --page-size",
        domain=Domain(1, MAX_I32), hashed=False)
    kv_mem_gib: float | None = spec_field(
        None, "KV memory of the TP group in GiB (with --budget vllm|sglang: that engine's "
        "layout and rules, this memory)", domain=Domain(0, lo_inclusive=False), hashed=False)
    kv_cache_memory_bytes: int | None = spec_field(
        None, "KV memory per GPU in bytes (vLLM's option; with --budget as --kv-mem-gib)",
        domain=Domain(1, 1 << 62), hashed=False)
    budget: str | None = spec_field(
        None, f"budget rule sizing the KV pool (default {DEFAULT_BUDGET} when no size is "
        "given); with --kv-mem-gib it names the engine whose layout a hybrid follows",
        choices=lambda: list(BUDGET_RULES), hashed=False)
    mem_fraction: float | None = spec_field(
        None, "the budget rule's fraction (default: the engine's); vLLM's "
        "--gpu-memory-utilization and SGLang's --mem-fraction-static also pick their rule",
        domain=Domain(0, 1, lo_inclusive=False), hashed=False)
    activation_peak_gib: float = spec_field(
        DEFAULT_ACTIVATION_PEAK_GIB, "activation peak (GiB) for the vllm/trtllm rules",
        domain=Domain(0), hashed=False)
    non_torch_gib: float = spec_field(DEFAULT_NON_TORCH_GIB, "non-torch memory (GiB) per GPU",
                                      domain=Domain(0), hashed=False)
    # hybrid models only (see HYBRID_MEMORY_OPTIONS)
    vllm_version: str | None = spec_field(
        None, f"hybrid models: the vLLM release whose rules plan and run follow (report "
        f"formula, mamba cache mode, block alignment; v0.11.0 - v0.31.x, default "
        f"{DEFAULT_VLLM_VERSION})")
    mamba_cache_dtype: str | None = spec_field(
        None, "hybrid models: Mamba / linear-attention conv state dtype (vLLM's "
        "--mamba-cache-dtype; default: the model's dtype under vLLM, bf16 under SGLang)",
        choices=lambda: list(STATE_DTYPES))
    mamba_ssm_cache_dtype: str | None = spec_field(
        None, "hybrid models: recurrent state dtype (vLLM's --mamba-ssm-cache-dtype, SGLang's "
        "--mamba-ssm-dtype; default: the engine's rule for the model's config)",
        choices=lambda: list(STATE_DTYPES))

    def __post_init__(self) -> None:
        # a Hugging Face config replaces the preset: --model is then not looked up
        check_fields(self, skip=("model",) if self.model_config else ())
        if self.model_config:
            object.__setattr__(self, "model_config", _config_file(self.model_config))
        if self.tp > 1:  # loads a --model-config only when the rule has something to check
            check_tp(self.model_preset(), self.tp)
        check_vllm_version(self.vllm_version)
        direct = self.direct_sizes()
        if len(direct) > 1:
            raise ValueError(f"give at most one of --kv-tokens, --num-pages, --kv-mem-gib, "
                             f"--kv-cache-memory-bytes (got "
                             f"{', '.join(flag(n) for n in direct)})")
        if direct and (self.mem_fraction is not None or (
                self.budget is not None and direct[0] not in MEMORY_SIZES)):
            raise ValueError(f"{flag(direct[0])} sets the pool size directly; drop "
                             f"{'--mem-fraction' if self.mem_fraction is not None else '--budget'}"
                             " (allowed: one of --kv-tokens, --num-pages, --kv-mem-gib, "
                             "--kv-cache-memory-bytes; --budget with --mem-fraction; or "
                             "--budget with --kv-mem-gib / --kv-cache-memory-bytes, which "
                             "picks that engine's layout)")
        given = [n for n in HYBRID_MEMORY_OPTIONS if getattr(self, n) is not None]
        if given and not self.is_hybrid():
            raise ValueError(f"{flag(given[0])} applies to hybrid models; "
                             f"{self.model_preset().id} is all full attention")

    def direct_sizes(self) -> list[str]:
        """The direct pool sizes given (at most one in a valid spec)."""
        return [n for n in DIRECT_SIZES if getattr(self, n) is not None]

    @property
    def rule(self) -> str:
        """Where the pool size comes from: a direct size's name or the budget rule's."""
        direct = self.direct_sizes()
        return direct[0] if direct else (self.budget or DEFAULT_BUDGET)

    @property
    def engine(self) -> str:
        """The engine whose layout and rules a hybrid model's plan follows: SGLang under its
        budget rule (given, or the default without a size), vLLM otherwise (a direct size
        alone, or the vllm / trtllm / lmdeploy rules)."""
        rule = self.budget or (DEFAULT_BUDGET if not self.direct_sizes() else "vllm")
        return "sglang" if rule == "sglang" else "vllm"

    def is_hybrid(self) -> bool:
        """Whether the model has layers other than full attention (a preset in
        kvcore.model.hybrid_presets or a --model-config with several layer kinds)."""
        if self.model_config:
            return layout_from_hf_config(self.model_config).is_hybrid
        layout = LAYOUTS.get(get_model(self.model).id)
        return layout is not None and layout.is_hybrid

    def model_preset(self) -> ModelPreset:
        """The model; `model_config` is loaded and registered in the preset table under its id
        (so configurations that name models by id find it), with its layer layout
        (kvcore.model.hybrid_presets.CONFIG_LAYOUTS, which the simulator reads), in every process
        that asks."""
        if self.model_config:
            preset = preset_from_config(self.model_config)
            key = preset.id
            if key in MODELS and MODELS[key] != preset:
                key = f"{key}-config"
                preset = replace(preset, id=key)
            MODELS[key] = preset
            CONFIG_LAYOUTS[key] = layout_from_hf_config(self.model_config)
            return preset
        return get_model(self.model)

    def resolved_max_context_len(self) -> int:
        return self.max_context_len or self.model_preset().max_position


__all__ = [
    "BUDGET_RULES",
    "DEFAULT_ACTIVATION_PEAK_GIB",
    "DEFAULT_BUDGET",
    "DEFAULT_NON_TORCH_GIB",
    "DIRECT_SIZES",
    "ENGINES",
    "HYBRID_MEMORY_OPTIONS",
    "MEMORY_SIZES",
    "BudgetRule",
    "MemorySpec",
    "check_tp",
]
