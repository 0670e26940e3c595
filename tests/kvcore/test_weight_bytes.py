"""Quantized weight bytes against published figures (issue 39 item 7): the block scales of
MXFP4 and NVFP4 and which parameters a checkpoint quantizes, each checked against a size or
ratio the publisher states, so a scale forgotten or a scope widened fails here."""

from __future__ import annotations

import pytest

from kvcore.model.presets import GiB, ModelPreset, get_model, weight_dtype_bytes

# gpt-oss-120b & gpt-oss-20b model card (OpenAI, 2025-08-05, arXiv 2508.10925), Table 1:
# "Checkpoint Size" of the released MXFP4 checkpoints (MoE experts in MXFP4, the rest bf16).
GPT_OSS_CHECKPOINT_GIB = {"gpt-oss-120b": 60.8, "gpt-oss-20b": 12.8}


@pytest.mark.parametrize("model", sorted(GPT_OSS_CHECKPOINT_GIB))
def test_gpt_oss_weights_match_the_model_cards_checkpoint_size(model):
    """The experts at 4.25 bits (E2M1 + one E8M0 scale per 32), attention, router,
    embeddings and head at bf16: 60.71 and 12.79 GiB against the card's 60.8 and 12.8 (the
    card rounds to 0.1 GiB, so 1 % is room enough). Without the scales (4 bits) they would
    read 57.4 / 12.2 GiB; with everything in MXFP4, 57.8 / 10.3 GiB."""
    m = get_model(model)
    assert m.weight_dtype == "mxfp4" and m.quantizes_experts_only
    assert m.weight_bytes() / GiB == pytest.approx(GPT_OSS_CHECKPOINT_GIB[model], rel=0.01)
    # split over ranks evenly, and the parts the roofline reads add up to the resident bytes
    assert m.weight_bytes(4) == pytest.approx(m.weight_bytes() / 4)
    rest = (m.num_params - m.routed_expert_params) * m.nonexpert_weight_bytes_per_param
    assert rest + m.routed_expert_params * weight_dtype_bytes("mxfp4") == pytest.approx(
        m.weight_bytes())


def test_a_dense_model_in_mxfp4_counts_every_parameter_in_it():
    dense = ModelPreset("d", "d", num_layers=2, num_heads=4, num_kv_heads=4, head_dim=8,
                        hidden_size=32, intermediate_size=64, vocab_size=100,
                        max_position=64, num_params=1e6, weight_dtype="mxfp4")
    assert not dense.quantizes_experts_only
    assert dense.weight_bytes() == pytest.approx(1e6 * 4.25 / 8)


def test_nvfp4_bytes_match_nvidias_stated_footprint():
    """NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference"
    (developer.nvidia.com technical blog, 2025-06-24): NVFP4 (E2M1 plus one FP8 E4M3 scale per
    16 values) cuts the memory footprint about 3.5x from FP16 and 1.8x from FP8. 4.5 bits give
    3.56x and 1.78x; a scale per 32 values (4.25 bits: 3.76x, 1.88x), no scale (4x, 2x) or a
    16-bit scale (3.2x, 1.6x) do not."""
    nvfp4 = weight_dtype_bytes("nvfp4")
    assert round(weight_dtype_bytes("fp8") / nvfp4, 1) == 1.8
    assert weight_dtype_bytes("fp16") / nvfp4 == pytest.approx(3.5, abs=0.1)


def test_mxfp4_is_the_model_cards_4_25_bits():
    """The gpt-oss model card: MoE weights in MXFP4 at 4.25 bits per parameter."""
    assert weight_dtype_bytes("mxfp4") * 8 == 4.25


def test_an_nvfp4_checkpoint_read_from_its_config_is_3_5x_smaller():
    """nvidia/Llama-3.1-405B-Instruct-FP4's model card (Hugging Face, ModelOpt v0.23.0): the
    FP4 checkpoint cuts disk size and GPU memory about 3.5x from the bf16 model. The
    Llama-3.1-405B config.json fields with ModelOpt's NVFP4 quantization_config: 405.85B
    parameters, 811.7 GB in bf16, 228.3 GB in NVFP4 (3.56x; with its embeddings and head
    kept in bf16, as ModelOpt stores them, 3.46x: both about 3.5)."""
    config = {"model_type": "llama", "hidden_size": 16384, "intermediate_size": 53248,
              "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8,
              "vocab_size": 128256, "max_position_embeddings": 131072,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    bf16 = ModelPreset.from_hf_config(config, id="llama-3.1-405b")
    fp4 = ModelPreset.from_hf_config({**config, "quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4"}}, id="llama-3.1-405b-fp4")
    assert bf16.num_params == pytest.approx(405.85e9, rel=1e-3)
    assert fp4.weight_dtype == "nvfp4"
    assert bf16.weight_bytes() / fp4.weight_bytes() == pytest.approx(3.5, abs=0.1)
