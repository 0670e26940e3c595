"""A hybrid model's parameters counted per layer kind from its config.json.

`ModelPreset.count_params` counts a transformer whose every layer is attention plus an MLP.
A Mamba or linear-attention hybrid is not that: Nemotron-H's `hybrid_override_pattern` makes
each layer one block (`M` a Mamba-2 mixer, `*` attention, `-` an MLP, `E` an MoE), and
Qwen3-Next / Qwen3.5 put a gated delta net or a gated attention in front of each layer's MLP.
Counting them as attention + MLP layers gets Nemotron-Nano-9B-v2 (8.89B) wrong by more than
half again, and with it every weight-based budget. The shapes below are those of the
Hugging Face modules (transformers `NemotronHForCausalLM`, `Qwen3NextForCausalLM`,
`Qwen3_5ForConditionalGeneration`), parameter for parameter:

* embeddings: vocab x hidden, and an lm_head of the same unless `tie_word_embeddings`; the
  final norm (hidden);
* full attention: q (Qwen3-Next / Qwen3.5: twice the heads, the output gate), k, v, o,
  q_norm and k_norm (head_dim each) on the Qwen families; biases when `attention_bias`;
* gated delta net: in_proj_qkvz (hidden x (2 Hk dk + 2 Hv dv)), in_proj_ba (hidden x 2 Hv),
  conv1d (conv_dim x kernel, no bias), dt_bias and A_log (Hv), the gated norm (dv), out_proj
  (Hv dv x hidden);
* Mamba-2: in_proj (hidden x (2 inner + 2 groups x state + heads)), conv1d (conv_dim x kernel,
  plus a bias with `use_conv_bias`, default true), dt_bias, A_log and D (heads), the gated
  norm (inner), out_proj (inner x hidden);
* MLP: gated (gate, up, down) except Nemotron-H's relu2 MLP (up, down); MoE: a router
  (hidden x experts), the experts, and the shared expert (with its sigmoid gate on the Qwen
  families);
* each block's norms (one per Nemotron-H block, two per Qwen layer);
* the multi-token-prediction layers a config declares (`mtp_num_hidden_layers`: a decoder
  layer with full attention, its fc of 2 hidden x hidden and three norms), and a Qwen3-VL
  style vision tower when the config has a `vision_config` with `depth` (blocks, patch and
  position embeddings, the merger): engines load both with the model.

Nemotron 3's latent MoE projections are not counted (a warning-free undercount of that one
family, which no preset uses). Parameters only a Mamba-1 model has are out of scope.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kvcore.model.layers import FULL, LINEAR, MAMBA
from kvcore.model.model_config import LAYER_TYPES, load_config
from kvcore.model.presets import ModelPreset

#: Hugging Face model types whose attention has the output gate and q / k norms
QWEN_HYBRID_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
                     "qwen3_5_moe_text")


@dataclass(frozen=True)
class ParamCount:
    """Total and per-token (MoE: active experts only) parameters, and the total per part."""

    total: int
    active: int
    parts: dict[str, int] = field(default_factory=dict)


def is_counted_hybrid(c: Mapping[str, Any]) -> bool:
    """A config whose layers this module counts: Mamba-2 or gated-delta-net layers, or
    Nemotron-H's MLP-only blocks."""
    if c.get("hybrid_override_pattern"):
        return True
    types = c.get("layer_types") or []
    if any(LAYER_TYPES.get(str(t)) in (LINEAR, MAMBA) for t in types):
        return True
    return bool(c.get("full_attention_interval") and c.get("linear_num_value_heads"))


def _i(c: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for k in keys:
        if c.get(k) is not None:
            return int(c[k])
    return default


def _attention(c: Mapping[str, Any], h: int, qwen: bool) -> int:
    heads = _i(c, "num_attention_heads")
    kvh = _i(c, "num_key_value_heads", default=heads)
    hd = _i(c, "head_dim", default=h // heads if heads else 0)
    gate = 2 if qwen and c.get("attn_output_gate", True) else 1
    n = h * heads * hd * gate + 2 * h * kvh * hd + heads * hd * h
    if c.get("attention_bias"):
        n += heads * hd * gate + 2 * kvh * hd + h
    return n + (2 * hd if qwen else 0)


def _gated_delta_net(c: Mapping[str, Any], h: int) -> int:
    hk, hv = _i(c, "linear_num_key_heads"), _i(c, "linear_num_value_heads")
    dk, dv = _i(c, "linear_key_head_dim"), _i(c, "linear_value_head_dim")
    kernel = _i(c, "linear_conv_kernel_dim", default=4)
    conv_dim = 2 * hk * dk + hv * dv
    return (h * (2 * hk * dk + 2 * hv * dv) + h * 2 * hv + conv_dim * kernel + 2 * hv + dv
            + hv * dv * h)


def _mamba2(c: Mapping[str, Any], h: int) -> int:
    heads, hd = _i(c, "mamba_num_heads"), _i(c, "mamba_head_dim")
    groups, state = _i(c, "n_groups", default=1), _i(c, "ssm_state_size")
    kernel = _i(c, "conv_kernel", default=4)
    inner = heads * hd
    conv_dim = inner + 2 * groups * state
    conv_bias = conv_dim if c.get("use_conv_bias", True) else 0
    proj_bias = c.get("mamba_proj_bias", False)
    in_out = 2 * inner + 2 * groups * state + heads
    return (h * in_out + (in_out if proj_bias else 0) + conv_dim * kernel + conv_bias
            + 3 * heads + inner + inner * h + (h if proj_bias else 0))


def _mlp(h: int, inter: int, gated: bool) -> int:
    return (3 if gated else 2) * h * inter


def _moe(c: Mapping[str, Any], h: int, gated: bool) -> tuple[int, int]:
    """(all experts, active experts) of one MoE block, router and shared expert included."""
    experts = _i(c, "num_experts", "n_routed_experts", "num_local_experts")
    top = _i(c, "num_experts_per_tok", default=1)
    inter = _i(c, "moe_intermediate_size", default=_i(c, "intermediate_size"))
    shared_inter = _i(c, "shared_expert_intermediate_size",
                      "moe_shared_expert_intermediate_size")
    if not shared_inter and _i(c, "n_shared_experts"):
        shared_inter = _i(c, "n_shared_experts") * inter
    one = _mlp(h, inter, gated)
    common = h * experts + (_mlp(h, shared_inter, gated) + h if shared_inter else 0)
    return common + experts * one, common + top * one


def _vision(v: Mapping[str, Any]) -> int:
    """A Qwen3-VL style vision tower (blocks with LayerNorm and biases, patch and position
    embeddings, the patch merger and its deepstack copies)."""
    depth, d, inter = _i(v, "depth"), _i(v, "hidden_size"), _i(v, "intermediate_size")
    out = _i(v, "out_hidden_size", default=d)
    merge = _i(v, "spatial_merge_size", default=2) ** 2
    block = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * inter + inter) + (inter * d + d)
    patch = (_i(v, "in_channels", default=3) * _i(v, "temporal_patch_size", default=2)
             * _i(v, "patch_size", default=16) ** 2 * d + d)
    pos = _i(v, "num_position_embeddings") * d
    m = d * merge
    merger = 2 * d + (m * m + m) + (m * out + out)
    deep = len(v.get("deepstack_visual_indexes") or []) * (2 * m + (m * m + m) + (m * out + out))
    return depth * block + patch + pos + merger + deep


def hybrid_param_count(c: Mapping[str, Any]) -> ParamCount:
    """Parameters of a Mamba / linear-attention hybrid config (the language model's fields,
    `text_config` merged over the top level; `vision_config` read from the top level)."""
    h = _i(c, "hidden_size")
    vocab = _i(c, "vocab_size")
    inter = _i(c, "intermediate_size")
    tied = bool(c.get("tie_word_embeddings", False))
    model_type = str(c.get("model_type", ""))
    qwen = model_type in QWEN_HYBRID_TYPES
    parts: dict[str, int] = {"embeddings": vocab * h * (1 if tied else 2) + h}
    active_moe = 0

    def add(name: str, n: int) -> None:
        parts[name] = parts.get(name, 0) + n

    pattern = c.get("hybrid_override_pattern")
    if pattern:  # Nemotron-H: one block per character, one norm each
        gated = str(c.get("mlp_hidden_act", "relu2")) != "relu2"
        for ch in str(pattern):
            if ch == "M":
                add("mamba", h + _mamba2(c, h))
            elif ch == "*":
                add("attention", h + _attention(c, h, qwen=False))
            elif ch == "-":
                add("mlp", h + _mlp(h, inter, gated))
            elif ch == "E":
                total, active = _moe(c, h, gated)
                add("moe", h + total)
                active_moe += h + active
            else:
                raise ValueError(f"unknown layer {ch!r} in hybrid_override_pattern")
    else:  # Qwen3-Next / Qwen3.5: a mixer and an MLP per layer, two norms
        n = _i(c, "num_hidden_layers")
        types = list(c.get("layer_types") or [])
        interval = _i(c, "full_attention_interval", default=4)
        if not types:
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(n)]
        moe = _i(c, "num_experts", "n_routed_experts", "num_local_experts") > 0
        dense_layers = set(c.get("mlp_only_layers") or [])
        step = _i(c, "decoder_sparse_step", default=1)
        for i, t in enumerate(types):
            kind = LAYER_TYPES.get(str(t), FULL)
            add("norms", 2 * h)
            if kind == LINEAR:
                add("linear_attention", _gated_delta_net(c, h))
            else:
                add("attention", _attention(c, h, qwen))
            if moe and i not in dense_layers and (i + 1) % step == 0:
                total, active = _moe(c, h, gated=True)
                add("moe", total)
                active_moe += active
            else:
                add("mlp", _mlp(h, inter, gated=True))
        mtp = _i(c, "mtp_num_hidden_layers")
        if mtp:
            layer = 2 * h + _attention(c, h, qwen)
            layer += _moe(c, h, gated=True)[0] if moe else _mlp(h, inter, gated=True)
            add("mtp", mtp * (layer + 2 * h * h + 3 * h))
    vision = c.get("vision_config")
    if isinstance(vision, Mapping) and vision.get("depth"):
        add("vision", _vision(vision))
    total = sum(parts.values())
    return ParamCount(total, total - parts.get("moe", 0) + active_moe, parts)


def preset_from_config(config: Mapping[str, Any] | str | os.PathLike[str],
                       id: str | None = None) -> ModelPreset:
    """`ModelPreset.from_hf_config`, with a Mamba / linear-attention hybrid's parameters
    counted per layer kind (`hybrid_param_count`) instead of as attention + MLP layers. A
    config with only the KV fields gives a preset whose weights are unknown (what a direct
    KV size needs, nothing more)."""
    preset = ModelPreset.from_hf_config(config, id)
    c, _ = load_config(config)
    if preset.weights_unknown or not is_counted_hybrid(c):
        return preset
    n = hybrid_param_count(c)
    return replace(preset, num_params=float(n.total),
                   active_params=float(n.active) if preset.is_moe else 0.0)


__all__ = ["ParamCount", "hybrid_param_count", "is_counted_hybrid", "preset_from_config"]
