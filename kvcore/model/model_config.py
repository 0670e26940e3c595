"""A model's layer layout from its Hugging Face config.json (nested `text_config` included).

Which layers are full attention, sliding window, chunked local, linear attention (gated delta
net) or Mamba-2 is read, in this order, from:

* `layer_types` (gpt-oss, Gemma 3, Qwen3-Next, Qwen3.5): see `LAYER_TYPES`;
* `hybrid_override_pattern` (Nemotron-H): `M` Mamba-2, `*` attention, `-` MLP and `E` MoE
  (no KV);
* `full_attention_interval` with the `linear_*` fields (Qwen3-Next): layer i is full when
  (i + 1) % interval == 0, as transformers' Qwen3NextConfig fills `layer_types`;
* `attention_chunk_size` (Llama 4): `no_rope_layers[i]` 1 means RoPE and chunked local
  attention, 0 a NoPE full-attention layer (transformers' Llama4TextConfig default: every 4th);
* `sliding_window` with `sliding_window_pattern` p (Gemma 3: layer i is full when
  (i + 1) % p == 0), Gemma-2's alternation (even layers sliding), or a list of windows per
  layer (Ministral's interleaved window, vllm #9464); a single `sliding_window` on every layer
  otherwise (Mistral).

Everything else is full attention. Besides the layers, the layout records what the engines
read to pick the state dtypes (kvcore.model.state_dtypes): the model's dtype (`torch_dtype` /
`dtype`), its family (`model_type`), and the recurrent-state dtype the config names
(`mamba_ssm_dtype`; Nemotron-H's `mamba_ssm_cache_dtype`); `mamba_conv_dtype`, where a config
has it, fixes the conv state's. Mamba-2 layers carry the SSD chunk (`mamba_chunk_size`, else
`chunk_size`; vLLM aligns blocks to it in mamba cache mode "all").
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from typing import Any

from kvcore.model.layers import CHUNKED, FULL, LINEAR, MAMBA, SLIDING, HybridLayout, LayerGroup
from kvcore.model.presets import _HF_DTYPES

LAYER_TYPES: dict[str, str] = {
    "full_attention": FULL, "attention": FULL, "global_attention": FULL,
    "sliding_attention": SLIDING, "sliding_window_attention": SLIDING, "local_attention": SLIDING,
    "chunked_attention": CHUNKED, "linear_attention": LINEAR, "mamba": MAMBA, "mamba2": MAMBA,
}
PATTERN_CHARS: dict[str, str | None] = {"M": MAMBA, "*": FULL, "-": None, "E": None}


def load_config(config: Mapping[str, Any] | str | os.PathLike[str]) -> tuple[dict, str]:
    """(the language model's config with `text_config` merged over the top level, a name for
    error messages)."""
    where = "model config"
    if not isinstance(config, Mapping):
        where = os.fspath(config)
        try:
            with open(where, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError, RecursionError) as e:
            raise ValueError(f"model config {where!r} cannot be read: {e}") from e
        if not isinstance(config, Mapping):
            raise ValueError(f"model config {where!r} is not a JSON object")
    c = dict(config)
    text = c.get("text_config")
    if isinstance(text, Mapping):
        c = {**{k: v for k, v in c.items() if k != "text_config"}, **text}
    return c, where


def _dtype(c: Mapping[str, Any], key: str) -> str | None:
    v = c.get(key)
    if v is None:
        return None
    name = str(v).lower().replace("torch.", "")
    if name not in _HF_DTYPES:
        raise ValueError(f"{key} {v!r} is not a dtype kvsim knows")
    return _HF_DTYPES[name]


def _kinds(c: Mapping[str, Any], where: str) -> list[tuple[str, int]]:
    """(kind, window or chunk) per KV-bearing layer."""
    n = int(c.get("num_hidden_layers") or 0)
    window = c.get("sliding_window")
    if isinstance(window, list):  # a window per layer, repeated over the layers
        ws = [int(w) if w else 0 for w in window]
        big = int(c.get("max_position_embeddings") or 0)
        return [(SLIDING, ws[i % len(ws)]) if ws[i % len(ws)] and ws[i % len(ws)] < big
                else (FULL, 0) for i in range(n)]
    w = int(window or 0)
    if c.get("use_sliding_window") is False:
        w = 0
    if c.get("layer_types") is not None:
        out = []
        for t in c["layer_types"]:
            kind = LAYER_TYPES.get(str(t))
            if kind is None:
                raise ValueError(f"{where}: unknown layer type {t!r} in layer_types (known: "
                                 f"{', '.join(LAYER_TYPES)})")
            out.append((kind, w if kind == SLIDING else int(c.get("attention_chunk_size") or 0)
                        if kind == CHUNKED else 0))
        return out
    if c.get("hybrid_override_pattern"):
        out = []
        for ch in str(c["hybrid_override_pattern"]):
            if ch not in PATTERN_CHARS:
                raise ValueError(f"{where}: unknown layer {ch!r} in hybrid_override_pattern "
                                 "(known: M, *, -, E)")
            kind = PATTERN_CHARS[ch]
            if kind is not None:
                out.append((kind, 0))
        return out
    if c.get("full_attention_interval") and c.get("linear_num_value_heads"):
        k = int(c["full_attention_interval"])
        return [(FULL if (i + 1) % k == 0 else LINEAR, 0) for i in range(n)]
    if c.get("attention_chunk_size"):
        chunk = int(c["attention_chunk_size"])
        nope = c.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(n)]
        return [(CHUNKED, chunk) if nope[i] else (FULL, 0) for i in range(n)]
    if w and c.get("sliding_window_pattern"):
        p = int(c["sliding_window_pattern"])
        return [(FULL, 0) if (i + 1) % p == 0 else (SLIDING, w) for i in range(n)]
    if w and str(c.get("model_type", "")).startswith("gemma2"):
        return [(SLIDING, w) if i % 2 == 0 else (FULL, 0) for i in range(n)]
    return [(SLIDING, w) if w else (FULL, 0) for _ in range(n)]


def layout_from_hf_config(config: Mapping[str, Any] | str | os.PathLike[str]) -> HybridLayout:
    """The model's layers grouped by kind (see the module notes for the fields read)."""
    c, where = load_config(config)
    kinds = _kinds(c, where)
    if not kinds:
        raise ValueError(f"{where}: no attention, linear-attention or Mamba layer found")
    heads = int(c.get("num_attention_heads") or 0)
    kv_heads = int(c.get("num_key_value_heads") or heads)
    hidden = int(c.get("hidden_size") or 0)
    head_dim = int(c.get("head_dim") or (hidden // heads if heads else 0))
    ssm_dtype = _dtype(c, "mamba_ssm_dtype") or _dtype(c, "mamba_ssm_cache_dtype")
    conv_dtype = _dtype(c, "mamba_conv_dtype")
    model_dtype = model_dtype_of(c)
    chunk = int(c.get("mamba_chunk_size") or c.get("chunk_size") or 0)
    groups = []
    for (kind, extra), n in Counter(kinds).items():
        if kind in (FULL, SLIDING, CHUNKED):
            groups.append(LayerGroup(kind, n, kv_heads=kv_heads, head_dim=head_dim,
                                     window=extra if kind == SLIDING else 0,
                                     chunk=extra if kind == CHUNKED else 0))
        elif kind == LINEAR:
            need = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                    "linear_value_head_dim", "linear_conv_kernel_dim")
            missing = [k for k in need if not c.get(k)]
            if missing:
                raise ValueError(f"{where}: linear_attention layers need {', '.join(missing)}")
            groups.append(LayerGroup(
                LINEAR, n, num_k_heads=int(c[need[0]]), num_v_heads=int(c[need[1]]),
                k_head_dim=int(c[need[2]]), v_head_dim=int(c[need[3]]),
                conv_kernel=int(c[need[4]]), conv_dtype=conv_dtype, state_dtype=ssm_dtype))
        else:
            mneed = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "conv_kernel")
            missing = [k for k in mneed if not c.get(k)]
            if missing:
                raise ValueError(f"{where}: Mamba layers need {', '.join(missing)}")
            groups.append(LayerGroup(
                MAMBA, n, num_v_heads=int(c["mamba_num_heads"]),
                v_head_dim=int(c["mamba_head_dim"]), k_head_dim=int(c["ssm_state_size"]),
                n_groups=int(c.get("n_groups") or 1), conv_kernel=int(c["conv_kernel"]),
                conv_dtype=conv_dtype, state_dtype=ssm_dtype, mamba_chunk_size=chunk))
    for g in groups:
        if not g.is_state and not (g.kv_heads and g.head_dim):
            raise ValueError(f"{where}: attention layers need num_attention_heads / head_dim")
    return HybridLayout(tuple(groups), model_dtype=model_dtype,
                        arch=str(c.get("model_type") or ""), config_ssm_dtype=ssm_dtype)


def model_dtype_of(c: Mapping[str, Any]) -> str:
    """The model's dtype: `torch_dtype` (or `dtype`), bf16 when the config names none (an
    unknown name is an error naming it)."""
    for key in ("torch_dtype", "dtype"):
        if c.get(key) is not None:
            got = _dtype(c, key)
            assert got is not None
            return "bf16" if got == "fp8" else got
    return "bf16"


__all__ = ["LAYER_TYPES", "PATTERN_CHARS", "layout_from_hf_config", "load_config",
           "model_dtype_of"]
