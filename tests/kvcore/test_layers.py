"""Layer kinds (kvcore.model.layers) and layouts read from config.json (kvcore.model.model_config):
worked examples a reader can redo by hand, and properties of the per-kind memory. About 1 s."""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.layers import CHUNKED, FULL, LINEAR, MAMBA, SLIDING, HybridLayout, LayerGroup
from kvcore.model.model_config import layout_from_hf_config
from kvcore.model.presets import ModelPreset, get_model

QWEN35_GDN = LayerGroup(LINEAR, 24, num_k_heads=16, num_v_heads=32, k_head_dim=128,
                        v_head_dim=128, conv_kernel=4, state_dtype="fp32")
NEMOTRON_M2 = LayerGroup(MAMBA, 27, num_v_heads=128, v_head_dim=80, k_head_dim=128, n_groups=8,
                         conv_kernel=4)


# -- per-kind memory, by hand ------------------------------------------------------------------
def test_full_and_window_and_chunk_tokens():
    full = LayerGroup(FULL, 2, kv_heads=8, head_dim=128)
    assert full.kv_bytes_per_token_layer() == 2 * 8 * 128 * 2 == 4096
    assert full.bytes_for_length(1000) == 1000 * 2 * 4096
    swa = LayerGroup(SLIDING, 2, kv_heads=8, head_dim=128, window=4096)
    assert swa.tokens_held(10_000) == 4096
    assert swa.tokens_held(10_000, step_tokens=512) == 4608  # the window + this step's chunk
    assert swa.tokens_held(100) == 100
    chunk = LayerGroup(CHUNKED, 3, kv_heads=8, head_dim=128, chunk=8192)
    assert [chunk.tokens_held(n) for n in (0, 1, 8192, 8193, 20_000)] == [0, 1, 8192, 1, 3616]


def test_gated_delta_net_state_qwen35_4b():
    # conv (kernel - 1, 2 x 16 x 128 + 32 x 128) in bf16 + recurrent (32, 128, 128) in fp32
    (conv, ssm) = QWEN35_GDN.state_shapes()
    assert conv == (3, 8192) and ssm == (32, 128, 128)
    assert QWEN35_GDN.state_bytes_layer() == 3 * 8192 * 2 + 32 * 128 * 128 * 4 == 2_146_304
    # tp = 2 halves the heads: (3, 4096) bf16 + (16, 128, 128) fp32
    assert QWEN35_GDN.state_bytes_layer(tp=2) == 3 * 4096 * 2 + 16 * 128 * 128 * 4
    assert QWEN35_GDN.state_bytes_per_request() == 24 * 2_146_304


def test_mamba2_state_nemotron_nano():
    # conv (3, 128 x 80 + 2 x 8 x 128) + ssm (128, 80, 128), both bf16
    assert NEMOTRON_M2.state_shapes() == ((3, 12_288), (128, 80, 128))
    assert NEMOTRON_M2.state_bytes_layer() == 3 * 12_288 * 2 + 128 * 80 * 128 * 2 == 2_695_168
    assert NEMOTRON_M2.state_shapes(tp=4) == ((3, 3072), (32, 80, 128))
    # one group over tp = 2 is replicated to 2 groups (vLLM extra_groups_for_head_shards)
    one = LayerGroup(MAMBA, 1, num_v_heads=8, v_head_dim=64, k_head_dim=16, n_groups=1,
                     conv_kernel=4)
    assert one.state_shapes(tp=2)[0] == (3, 8 * 64 // 2 + 2 * 16)


@given(st.integers(0, 300_000), st.integers(0, 300_000), st.integers(1, 70_000),
       st.sampled_from(list(LAYOUTS)))
def test_memory_by_length_never_exceeds_full(a, b, window, model):
    """Any layout: full and sliding layers never hold less as a request grows (chunked local
    layers drop back to one token at each chunk boundary, so they only stay within 1..chunk),
    no attention layer holds more than full attention would, and a state kind's bytes do not
    depend on the length."""
    lo, hi = sorted((a, b))
    for g in LAYOUTS[model].groups:
        if g.is_state:
            assert g.bytes_for_length(max(lo, 1)) == g.bytes_for_length(max(hi, 1)) > 0
            continue
        assert g.bytes_for_length(hi) <= hi * g.kv_bytes_per_token()
        if g.kind == CHUNKED:
            assert (hi == 0) or 1 <= g.tokens_held(hi) <= min(hi, g.chunk)
        else:
            assert g.bytes_for_length(lo) <= g.bytes_for_length(hi)
    swa = LayerGroup(SLIDING, 1, kv_heads=1, head_dim=8, window=window)
    assert swa.tokens_held(hi) == min(hi, window)


def test_bad_groups_are_refused():
    with pytest.raises(ValueError, match="unknown layer kind 'conv'"):
        LayerGroup("conv", 1)
    with pytest.raises(ValueError, match="window"):
        LayerGroup(SLIDING, 1, kv_heads=1, head_dim=8)
    with pytest.raises(ValueError, match="does not divide by tp = 3"):
        QWEN35_GDN.state_bytes_layer(tp=3)
    with pytest.raises(ValueError, match="at least one"):
        HybridLayout(())


# -- config.json ------------------------------------------------------------------------------
QWEN35_4B_CONFIG = {  # the shape of Qwen/Qwen3.5-4B's config.json (a multimodal wrapper)
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text", "num_hidden_layers": 8, "hidden_size": 2560,
        "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
        "intermediate_size": 9216, "vocab_size": 248320, "dtype": "bfloat16",
        "layer_types": ["linear_attention"] * 3 + ["full_attention"]
        + ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
    },
}


def test_nested_text_config_and_layer_types():
    layout = layout_from_hf_config(QWEN35_4B_CONFIG)
    assert layout.mix == "6 linear-attention (GDN) + 2 full"
    gdn = layout.state_groups()[0]
    assert gdn.state_bytes_layer() == 2_146_304  # fp32 state from mamba_ssm_dtype
    m = ModelPreset.from_hf_config(QWEN35_4B_CONFIG, id="q")  # no "lacks num_hidden_layers"
    assert (m.num_layers, m.num_kv_heads, m.head_dim) == (8, 4, 256)


def test_unknown_layer_type_names_it_and_the_file(tmp_path):
    cfg = {**QWEN35_4B_CONFIG["text_config"], "layer_types": ["full_attention", "hyena"]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json.*unknown layer type 'hyena'"):
        layout_from_hf_config(path)
    cfg = {**QWEN35_4B_CONFIG["text_config"]}
    del cfg["linear_conv_kernel_dim"]
    with pytest.raises(ValueError, match="need linear_conv_kernel_dim"):
        layout_from_hf_config(cfg)


BASE = {"num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 2,
        "hidden_size": 1024, "vocab_size": 1000}


@pytest.mark.parametrize(("extra", "mix"), [
    ({"hybrid_override_pattern": "M-M*-ME*", "mamba_num_heads": 8, "mamba_head_dim": 64,
      "ssm_state_size": 16, "n_groups": 1, "conv_kernel": 4}, "3 Mamba-2 + 2 full"),
    ({"full_attention_interval": 4, "linear_num_key_heads": 4, "linear_num_value_heads": 8,
      "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4},
     "9 linear-attention (GDN) + 3 full"),
    ({"attention_chunk_size": 8192}, "9 chunked-local chunk=8192 + 3 full"),
    ({"attention_chunk_size": 64, "no_rope_layers": [1, 0] * 6},
     "6 chunked-local chunk=64 + 6 full"),
    ({"sliding_window": 1024, "sliding_window_pattern": 6}, "10 SWA w=1024 + 2 full"),
    ({"sliding_window": 4096, "model_type": "gemma2"}, "6 SWA w=4096 + 6 full"),
    ({"sliding_window": [32768, 32768, 32768, 131072], "max_position_embeddings": 131072},
     "9 SWA w=32768 + 3 full"),
    ({"sliding_window": 4096}, "12 SWA w=4096"),
    ({"sliding_window": 4096, "use_sliding_window": False}, "12 full"),
    ({}, "12 full"),
])
def test_every_layout_field(extra, mix):
    assert layout_from_hf_config({**BASE, **extra}).mix == mix


def test_pattern_and_state_errors():
    with pytest.raises(ValueError, match="unknown layer 'X' in hybrid_override_pattern"):
        layout_from_hf_config({**BASE, "hybrid_override_pattern": "M*X"})
    with pytest.raises(ValueError, match="Mamba layers need mamba_num_heads"):
        layout_from_hf_config({**BASE, "hybrid_override_pattern": "M*"})
    with pytest.raises(ValueError, match="mamba_ssm_dtype 'float7'"):
        layout_from_hf_config({**QWEN35_4B_CONFIG, "mamba_ssm_dtype": "float7",
                               "text_config": {**QWEN35_4B_CONFIG["text_config"],
                                               "mamba_ssm_dtype": "float7"}})


@pytest.mark.parametrize(("quant", "dtype", "per_param"), [
    ({"quant_method": "fp8"}, "fp8", 1.0),
    ({"quant_method": "mxfp4"}, "mxfp4", 4.25 / 8),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4", 4.5 / 8),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8", 1.0),
    ({"quant_method": "awq", "bits": 4}, "int4", (4 + 20 / 128) / 8),
    ({"quant_method": "gptq", "bits": 4}, "int4", (4 + 20 / 128) / 8),
])
def test_weight_quantization(quant, dtype, per_param):
    m = ModelPreset.from_hf_config({**BASE, "quantization_config": quant}, id="q")
    assert m.weight_dtype == dtype
    assert m.weight_bytes() == pytest.approx(m.num_params * per_param)
    again = ModelPreset.from_hf_config(m.to_hf_config(), id="q")
    assert again.weight_dtype == dtype


def test_unknown_quantization_warns_and_keeps_the_torch_dtype():
    with pytest.warns(UserWarning, match="quantization method 'bitnet' is unknown"):
        m = ModelPreset.from_hf_config({**BASE, "quantization_config": {
            "quant_method": "bitnet"}}, id="q")
    assert m.weight_dtype == "bf16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ModelPreset.from_hf_config(BASE, id="q")  # no quantization: no warning


def test_presets_layouts_match_their_models():
    """Every layout's attention shape is its preset's, and its layer count at most the
    preset's num_hidden_layers (Nemotron's MLP-only layers hold no KV)."""
    for mid, layout in LAYOUTS.items():
        m = get_model(mid)
        for g in layout.attention_groups():
            assert (g.kv_heads, g.head_dim) == (m.num_kv_heads, m.head_dim), mid
        assert layout.num_layers <= m.num_layers, mid
        assert layout.is_hybrid, mid
