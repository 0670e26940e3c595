"""Layer layouts of the preset models that are not all full attention, one line each.

Keys are ids of kvcore.model.presets.MODELS; values are the groups `kvcore.model.model_config` reads from
the same config.json (sources on the ModelPreset line). A model absent here is all full
attention (`layout_of` builds that layout), so every earlier result is unchanged.

Each layout also records what decides its state dtypes per engine (kvcore.model.state_dtypes): the
model dtype (bf16 for all), the family (`model_type`) and the recurrent-state dtype the config
names. Qwen3.5's config.json says `mamba_ssm_dtype: float32` (the groups carry it: vLLM takes
it from there, `Qwen3_5ForConditionalGenerationConfig`); Qwen3-Next's has no such field, so
vLLM keeps the conv state's dtype; Nemotron-H's has none either, and vLLM from v0.13 stores
its recurrent state in float32 (`NemotronHForCausalLMConfig`). The groups' dtypes are vLLM's
current defaults; a plan or run resolves them for its engine and version.
"""

from __future__ import annotations

from kvcore.model.layers import CHUNKED, FULL, LINEAR, MAMBA, SLIDING, HybridLayout, LayerGroup
from kvcore.model.presets import ModelPreset


def _attn(kind: str, n: int, kvh: int, hd: int, window: int = 0, chunk: int = 0) -> LayerGroup:
    return LayerGroup(kind, n, kv_heads=kvh, head_dim=hd, window=window, chunk=chunk)


def _gdn(n: int, kh: int, vh: int, kd: int, vd: int, kernel: int, state: str | None
         ) -> LayerGroup:
    return LayerGroup(LINEAR, n, num_k_heads=kh, num_v_heads=vh, k_head_dim=kd, v_head_dim=vd,
                      conv_kernel=kernel, state_dtype=state)


def _mamba2(n: int, heads: int, hd: int, state: int, groups: int, kernel: int, chunk: int
            ) -> LayerGroup:
    return LayerGroup(MAMBA, n, num_v_heads=heads, v_head_dim=hd, k_head_dim=state,
                      n_groups=groups, conv_kernel=kernel, state_dtype="fp32",
                      mamba_chunk_size=chunk)


def _qwen35(*groups: LayerGroup) -> HybridLayout:
    return HybridLayout(groups, arch="qwen3_5_text", config_ssm_dtype="fp32")


# fmt: off
LAYOUTS: dict[str, HybridLayout] = {
    "gpt-oss-20b": HybridLayout((_attn(SLIDING, 12, 8, 64, window=128), _attn(FULL, 12, 8, 64))),
    "gpt-oss-120b": HybridLayout((_attn(SLIDING, 18, 8, 64, window=128), _attn(FULL, 18, 8, 64))),
    "gemma-3-27b": HybridLayout((_attn(SLIDING, 52, 16, 128, window=1024), _attn(FULL, 10, 16, 128))),
    "llama-4-scout": HybridLayout((_attn(CHUNKED, 36, 8, 128, chunk=8192), _attn(FULL, 12, 8, 128))),
    "qwen3-next-80b-a3b": HybridLayout((_gdn(36, 16, 32, 128, 128, 4, None), _attn(FULL, 12, 2, 256)), arch="qwen3_next"),
    "qwen3.5-0.8b": _qwen35(_gdn(18, 16, 16, 128, 128, 4, "fp32"), _attn(FULL, 6, 2, 256)),
    "qwen3.5-4b": _qwen35(_gdn(24, 16, 32, 128, 128, 4, "fp32"), _attn(FULL, 8, 4, 256)),
    "qwen3.5-27b": _qwen35(_gdn(48, 16, 48, 128, 128, 4, "fp32"), _attn(FULL, 16, 4, 256)),
    "qwen3.6-27b": _qwen35(_gdn(48, 16, 48, 128, 128, 4, "fp32"), _attn(FULL, 16, 4, 256)),
    "qwen3.5-35b-a3b": HybridLayout((_gdn(30, 16, 32, 128, 128, 4, "fp32"), _attn(FULL, 10, 2, 256)), arch="qwen3_5_moe_text", config_ssm_dtype="fp32"),
    "nemotron-nano-9b-v2": HybridLayout((_mamba2(27, 128, 80, 128, 8, 4, 128), _attn(FULL, 4, 8, 128)), arch="nemotron_h"),
    "gemma-2-9b": HybridLayout((_attn(SLIDING, 21, 8, 256, window=4096), _attn(FULL, 21, 8, 256))),
    "ministral-8b": HybridLayout((_attn(SLIDING, 27, 8, 128, window=32768), _attn(FULL, 9, 8, 128))),
}
# fmt: on


#: layouts read from --model-config files, under the id their preset is registered with in
#: kvcore.model.presets.MODELS (kvcore.model.memory.MemorySpec.model_preset fills both, in every process)
CONFIG_LAYOUTS: dict[str, HybridLayout] = {}


def hybrid_layout(model_id: str) -> HybridLayout | None:
    """The layout a simulation of `model_id` uses when it is hybrid (a --model-config's first,
    then the presets'), else None: the model runs the full-attention path."""
    layout = CONFIG_LAYOUTS.get(model_id) or LAYOUTS.get(model_id)
    return layout if layout is not None and layout.is_hybrid else None


def layout_of(model: ModelPreset) -> HybridLayout:
    """The preset's layout: its LAYOUTS entry, else every layer full attention (MLA models too:
    one latent per token and layer, see ModelPreset.kv_bytes_per_token_layer)."""
    if model.id in LAYOUTS:
        return LAYOUTS[model.id]
    return HybridLayout((_attn(FULL, model.num_layers, model.num_kv_heads, model.head_dim),))


__all__ = ["CONFIG_LAYOUTS", "LAYOUTS", "hybrid_layout", "layout_of"]
