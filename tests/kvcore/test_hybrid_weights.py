"""A hybrid's weights from its config.json, counted per layer kind
(kvcore.model.hybrid_weights), and a config with only the KV fields (kvsim issue 38 item 3).
About 1 s."""

from __future__ import annotations

import json

import pytest

from kvcore.model.hybrid_weights import hybrid_param_count, preset_from_config
from kvcore.model.memory import MemorySpec
from kvcore.model.model_config import load_config
from kvcore.model.planner import plan
from kvcore.model.presets import get_model
from tests.kvcore.test_preset_configs import PUBLISHED

# model -> (published total parameters, relative tolerance, what the tolerance covers)
CHECKPOINTS: dict[str, tuple[float, float, str]] = {
    "nemotron-nano-9b-v2": (8.89e9, 0.001, "model card: 8.89B"),
    "qwen3-next-80b-a3b": (80e9, 0.005, "model card: 80B in total"),
    "qwen3.5-35b-a3b": (35e9, 0.01, "35B by name; vision tower not in the transcription"),
    "qwen3.5-0.8b": (0.873e9, 0.001, "the preset's count: text, vision tower and MTP layer"),
    # the published 4.66B / 27.8B hold a vision tower and an MTP layer the transcribed
    # fields do not describe; the text model alone is 4.21B / 26.90B
    "qwen3.5-4b": (4.21e9, 0.002, "text only: 4.66B less vision 0.33B and MTP 0.12B"),
    "qwen3.5-27b": (26.90e9, 0.002, "text only: 27.8B less vision 0.46B and MTP 0.43B"),
    "gpt-oss-20b": (20.9e9, 0.002, "model card: 20.9B"),
    "gpt-oss-120b": (116.8e9, 0.002, "model card: 116.8B"),
    "gemma-3-27b": (27.4e9, 0.02, "27.4B with a SigLIP vision tower the fields do not describe"),
}


@pytest.mark.parametrize("model", sorted(CHECKPOINTS))
def test_config_counts_match_the_published_checkpoints(model: str) -> None:
    published, tol, _why = CHECKPOINTS[model]
    counted = preset_from_config(PUBLISHED[model][1], id=model).num_params
    assert counted == pytest.approx(published, rel=tol), model


def test_nemotron_nano_counted_per_layer_kind() -> None:
    """27 Mamba-2 mixers (in_proj 4,480 x 22,656, conv1d 12,288 x 4 + bias, 3 x 128 head
    vectors, a 10,240 norm, out_proj 10,240 x 4,480, a block norm), 4 attention blocks, 25
    relu2 MLP-only blocks (up and down, 4,480 x 15,680 each) and untied 131,072 x 4,480
    embeddings: 8,888,227,328, the published 8.89B; every layer counted as attention + MLP
    (the old count) is more than half again as large."""
    c, _ = load_config(PUBLISHED["nemotron-nano-9b-v2"][1])
    n = hybrid_param_count(c)
    mamba = 4480 * 22656 + 12288 * 4 + 12288 + 3 * 128 + 10240 + 10240 * 4480 + 4480
    assert n.parts["mamba"] == 27 * mamba
    assert n.parts["mlp"] == 25 * (2 * 4480 * 15680 + 4480)
    assert n.parts["embeddings"] == 2 * 131072 * 4480 + 4480
    assert n.total == 8_888_227_328 == n.active
    from kvcore.model.presets import ModelPreset
    assert ModelPreset.from_hf_config(PUBLISHED["nemotron-nano-9b-v2"][1]).num_params > 1.5 * (
        n.total)


def test_a_hybrid_config_plans_like_its_preset(tmp_path) -> None:
    """Nemotron-Nano-9B-v2's config.json on an H200 gives the preset's weights and so its
    KV memory (issue 38.3: 28.82 GiB of weights and 710,976 tokens before, 16.56 GiB and
    811,776 for the preset)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(PUBLISHED["nemotron-nano-9b-v2"][1]))
    ours = plan(MemorySpec(model_config=str(path), gpu="h200", budget="vllm"))
    preset = plan(MemorySpec(model="nemotron-nano-9b-v2", gpu="h200", budget="vllm"))
    assert ours.weight_bytes == pytest.approx(preset.weight_bytes, rel=1e-3)
    assert ours.kv_budget_bytes == pytest.approx(preset.kv_budget_bytes, rel=1e-3)
    assert ours.hybrid is not None and preset.hybrid is not None
    assert ours.hybrid.kv_cache_tokens == pytest.approx(preset.hybrid.kv_cache_tokens,
                                                        rel=1e-3)


KV_ONLY = {"model_type": "nemotron_h", "num_hidden_layers": 56, "num_attention_heads": 40,
           "num_key_value_heads": 8, "head_dim": 128,
           "hybrid_override_pattern": PUBLISHED["nemotron-nano-9b-v2"][1][
               "hybrid_override_pattern"],
           "mamba_num_heads": 128, "mamba_head_dim": 80, "ssm_state_size": 128, "n_groups": 8,
           "conv_kernel": 4, "chunk_size": 128, "max_position_embeddings": 131072}


def test_a_kv_only_config_plans_with_a_direct_size(tmp_path) -> None:
    """Only the attention and state fields: enough for KV sizing with --kv-mem-gib (the
    same engine figures as the full config), a one-line error under a budget rule, which
    needs the weights."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(KV_ONLY))
    r = plan(MemorySpec(model_config=str(path), budget="vllm", kv_mem_gib=10))
    full = tmp_path / "full.json"
    full.write_text(json.dumps(PUBLISHED["nemotron-nano-9b-v2"][1]))
    ref = plan(MemorySpec(model_config=str(full), budget="vllm", kv_mem_gib=10))
    assert r.weights_unknown and "vocab_size" in r.weights_unknown
    assert r.hybrid is not None and ref.hybrid is not None
    assert (r.hybrid.kv_cache_tokens, r.hybrid.block_size) == (ref.hybrid.kv_cache_tokens,
                                                               ref.hybrid.block_size)
    assert "weights_unknown" in r.to_dict() and "weights_unknown" not in ref.to_dict()
    with pytest.raises(ValueError, match="lacks vocab_size, hidden_size, which the weights "
                       "need") as e:
        plan(MemorySpec(model_config=str(path), budget="vllm"))
    assert "\n" not in str(e.value)


def test_every_hybrid_preset_reads_its_state_fields() -> None:
    for mid in ("qwen3.5-4b", "nemotron-nano-9b-v2", "qwen3-next-80b-a3b"):
        assert get_model(mid).weights_unknown == ""
