"""Which dtypes each engine stores a model's Mamba / linear-attention states in.

The KV dtype (`--kv-dtype`, vLLM's `--kv-cache-dtype`) applies to attention KV only. The
states have their own options and defaults, resolved here into the layout's groups
(`LayerGroup.conv_dtype` / `state_dtype`) before anything is sized, so a plan, a run and the
validation rows store the same bytes:

* vLLM (vllm/config/cache.py `mamba_cache_dtype` / `mamba_ssm_cache_dtype`, both "auto" by
  default; vllm/model_executor/layers/mamba/mamba_utils.py `_mamba_state_dtype`): the conv
  state in `--mamba-cache-dtype` (auto: the model's dtype, config `torch_dtype`), the
  recurrent state in `--mamba-ssm-cache-dtype` (auto: the conv state's), except where a model
  config class overrides auto: Qwen3.5 takes the config's `mamba_ssm_dtype`
  (`Qwen3_5ForConditionalGenerationConfig`, v0.17+), Nemotron-H the config's
  `mamba_ssm_cache_dtype` or float32 (`NemotronHForCausalLMConfig`, from v0.13; see
  kvcore.model.vllm_rules).
* SGLang (python/sglang/srt/configs/mamba_utils.py `mamba2_state_dtype`, sgl-project/sglang
  main read at commit 02e208d): the conv state in bfloat16 (the `SGLANG_MAMBA_CONV_DTYPE`
  environment variable changes it; kvsim's `--mamba-cache-dtype` stands for it), the
  recurrent state in `--mamba-ssm-dtype` (kvsim's `--mamba-ssm-cache-dtype`), else the
  config's `mamba_ssm_dtype`, else float32, for every model.
"""

from __future__ import annotations

from dataclasses import replace

from kvcore.model.layers import HybridLayout
from kvcore.model.vllm_rules import VllmRules

#: the dtypes the state options take (vLLM's MambaDType besides "auto", in kvsim's spelling)
STATE_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16")
#: architectures (config `model_type`) whose vLLM config class overrides the ssm dtype
QWEN35_ARCHS = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
NEMOTRON_H_ARCHS = ("nemotron_h",)
SGLANG_CONV_DTYPE = "bf16"
SGLANG_SSM_DTYPE = "fp32"


def vllm_state_dtypes(layout: HybridLayout, rules: VllmRules, cache_dtype: str | None = None,
                      ssm_dtype: str | None = None) -> tuple[str, str]:
    """(conv, recurrent) state dtypes under vLLM (module notes); None options are "auto"."""
    conv = cache_dtype or layout.model_dtype
    if ssm_dtype is not None:
        return conv, ssm_dtype
    if layout.arch in QWEN35_ARCHS and layout.config_ssm_dtype:
        return conv, layout.config_ssm_dtype
    if layout.arch in NEMOTRON_H_ARCHS and rules.nemotron_fp32_ssm:
        return conv, layout.config_ssm_dtype or "fp32"
    return conv, conv


def sglang_state_dtypes(layout: HybridLayout, cache_dtype: str | None = None,
                        ssm_dtype: str | None = None) -> tuple[str, str]:
    """(conv, recurrent) state dtypes under SGLang (module notes)."""
    return (cache_dtype or SGLANG_CONV_DTYPE,
            ssm_dtype or layout.config_ssm_dtype or SGLANG_SSM_DTYPE)


def with_state_dtypes(layout: HybridLayout, conv: str, ssm: str,
                      spec_tokens: int = 0) -> HybridLayout:
    """The layout with every state group's dtypes set (and its speculative tokens, which
    widen a gated delta net's conv state); attention groups unchanged."""
    groups = tuple(replace(g, conv_dtype=conv, state_dtype=ssm, spec_tokens=spec_tokens)
                   if g.is_state else g for g in layout.groups)
    return replace(layout, groups=groups)


def resolve_state_dtypes(layout: HybridLayout, engine: str, rules: VllmRules,
                         cache_dtype: str | None = None, ssm_dtype: str | None = None,
                         spec_tokens: int = 0) -> HybridLayout:
    """The layout as `engine` ("vllm" or "sglang") stores its states."""
    if engine == "sglang":
        conv, ssm = sglang_state_dtypes(layout, cache_dtype, ssm_dtype)
    elif engine == "vllm":
        conv, ssm = vllm_state_dtypes(layout, rules, cache_dtype, ssm_dtype)
    else:
        raise ValueError(f"engine must be vllm or sglang, got {engine!r}")
    return with_state_dtypes(layout, conv, ssm, spec_tokens)


__all__ = ["STATE_DTYPES", "resolve_state_dtypes", "sglang_state_dtypes", "vllm_state_dtypes",
           "with_state_dtypes"]
