"""Presets: KV bytes per token, parameter counts from the architecture, config.json round trip."""

from __future__ import annotations

import json

import pytest

from kvcore.model.presets import (
    GPUS,
    MODELS,
    PUBLISHED_PARAMS_ONLY,
    ModelPreset,
    dtype_bytes,
    get_gpu,
    get_model,
)

KV_BYTES_BF16 = {
    "opt-13b": 819_200,  # 800 KiB, the vLLM paper's "800 KB"
    "opt-66b": 2_359_296,  # 2.25 MiB
    "opt-175b": 4_718_592,  # 4.5 MiB
    "llama-3.1-8b": 131_072,
    "llama-3.1-70b": 327_680,
    "qwen2.5-7b": 57_344,
    "qwen2.5-72b": 327_680,
    "mistral-7b": 131_072,
    "mixtral-8x7b": 131_072,
    "deepseek-v3": 70_272,  # (512 + 64) x 61 x 2, no factor 2 for K/V
    # hybrids: every layer as full attention (2 x KV heads x head_dim x 2 B x layers), the
    # pre-hybrid baseline; kvcore.model.layers gives what each layer kind really holds
    "gpt-oss-20b": 49_152,  # 2 x 8 x 64 x 2 x 24
    "gpt-oss-120b": 73_728,  # 2 x 8 x 64 x 2 x 36
    "gemma-3-27b": 507_904,  # 2 x 16 x 128 x 2 x 62
    "llama-4-scout": 196_608,  # 2 x 8 x 128 x 2 x 48
    "qwen3-next-80b-a3b": 98_304,  # 2 x 2 x 256 x 2 x 48
    "qwen3.5-4b": 131_072,  # 2 x 4 x 256 x 2 x 32
    "qwen3.5-27b": 262_144,  # 2 x 4 x 256 x 2 x 64
    "qwen3.6-27b": 262_144,  # as Qwen3.5-27B
    "qwen3.5-0.8b": 49_152,  # 2 x 2 x 256 x 2 x 24
    "qwen3.5-35b-a3b": 81_920,  # 2 x 2 x 256 x 2 x 40
    "nemotron-nano-9b-v2": 229_376,  # 2 x 8 x 128 x 2 x 56 (MLP-only layers counted too)
    "qwen3-8b": 147_456,
    "qwen3-32b": 262_144,
    "llama-3.3-70b": 327_680,
    "gemma-2-9b": 344_064,  # 2 x 8 x 256 x 2 x 42
    "ministral-8b": 147_456,
}


def test_every_preset_has_its_kv_bytes():
    assert set(KV_BYTES_BF16) == set(MODELS)
    for mid, expected in KV_BYTES_BF16.items():
        assert MODELS[mid].kv_bytes_per_token("bf16") == expected, mid


def test_kv_dtype_and_tp_split():
    llama = get_model("llama-3.1-8b")
    assert llama.kv_bytes_per_token("fp8") == 65_536
    assert llama.kv_bytes_per_token("bf16", tp=2) == 65_536
    assert llama.kv_bytes_per_token("bf16", tp=8) == 16_384  # one KV head per rank
    assert llama.kv_bytes_per_token("bf16", tp=16) == 16_384  # replicated, at least one
    assert llama.kv_bytes_per_token_total("bf16", tp=16) == 16 * 16_384
    ds = get_model("deepseek-v3")
    assert ds.kv_bytes_per_token("bf16", tp=8) == 70_272  # MLA latent replicated per rank
    with pytest.raises(ValueError, match="tp"):
        llama.kv_bytes_per_token("bf16", tp=0)
    with pytest.raises(ValueError, match="dtype"):
        dtype_bytes("int3")


def test_ids_case_insensitive_and_aliases():
    assert get_model("OPT-13B") is MODELS["opt-13b"]
    assert get_gpu("H100-SXM") is GPUS["h100"]
    assert get_gpu(" h200 ").mem_gb == 141
    for gid in ("a100-40gb", "a100-80gb", "h100", "h200", "b200", "l40s", "rtx-4090"):
        assert gid in GPUS and GPUS[gid].id == gid.lower()
    with pytest.raises(ValueError, match="unknown gpu"):
        get_gpu("v100")


COUNTED = sorted(set(MODELS) - PUBLISHED_PARAMS_ONLY)


@pytest.mark.parametrize("mid", COUNTED)
def test_param_count_from_architecture_matches_published(mid):
    m = MODELS[mid]
    total, active = m.count_params()
    assert total == pytest.approx(m.num_params, rel=0.01)
    assert active == pytest.approx(m.params_per_token, rel=0.02)


def test_moe_and_window_recorded():
    mix = get_model("mixtral-8x7b")
    assert mix.num_params > 3 * mix.active_params  # all experts resident
    assert mix.weight_bytes() == pytest.approx(46.7e9 * 2)
    assert get_model("mistral-7b").sliding_window == 4096
    ds = get_model("deepseek-v3")
    assert (ds.num_layers, ds.kv_lora_rank, ds.qk_rope_head_dim) == (61, 512, 64)


@pytest.mark.parametrize("mid", COUNTED)
def test_hf_config_round_trip(mid, tmp_path):
    m = MODELS[mid]
    cfg = m.to_hf_config()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    a = ModelPreset.from_hf_config(path, id=mid)
    b = ModelPreset.from_hf_config(a.to_hf_config(), id=mid)
    assert a == b
    for f in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size",
              "intermediate_size", "vocab_size", "max_position", "weight_dtype", "kv_lora_rank",
              "qk_rope_head_dim", "sliding_window", "num_experts", "experts_per_token"):
        assert getattr(a, f) == getattr(m, f), f
    assert a.kv_bytes_per_token() == m.kv_bytes_per_token()
    assert a.num_params == pytest.approx(m.num_params, rel=0.01)


def test_hf_config_defaults_and_spellings():
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256,
           "vocab_size": 1000, "intermediate_size": 512, "dtype": "float16"}
    m = ModelPreset.from_hf_config(cfg, id="Tiny")
    assert (m.id, m.num_kv_heads, m.head_dim, m.weight_dtype) == ("tiny", 4, 64, "fp16")
    # tied embeddings (the Hugging Face default) + 2 layers x (4 x 256^2 attention +
    # 3 x 256 x 512 gated MLP + 2 norms) + final norm
    layers = 2 * (4 * 256**2 + 3 * 256 * 512 + 512)
    assert m.num_params == 1000 * 256 + layers + 256
    untied = ModelPreset.from_hf_config({**cfg, "tie_word_embeddings": False})
    assert untied.num_params == 2 * 1000 * 256 + layers + 256
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ModelPreset.from_hf_config({"num_attention_heads": 4})
    with pytest.raises(ValueError, match="cannot be read"):
        ModelPreset.from_hf_config("/nonexistent/config.json")


def test_gpu_memory_is_what_the_device_reports_in_gib():
    """The budget rules start from the total the device reports to CUDA, in GiB: an "80 GB"
    H100 reports 79.11 GiB (not 80e9 bytes = 74.51 GiB); each preset says where its figure
    comes from."""
    from kvcore.model.presets import GPUS, GiB

    h100 = get_gpu("h100")
    assert h100.mem_bytes == pytest.approx(79.11 * GiB) and h100.mem_gib == pytest.approx(79.11)
    for g in GPUS.values():
        assert g.mem_source and 0.9 * g.mem_gb * 1e9 / GiB < g.mem_gib <= g.mem_gb
