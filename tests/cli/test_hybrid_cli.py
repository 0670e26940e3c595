"""`kvsim models` shows hybrids' layer mix; `kvsim plan` on a hybrid prints the engine's
start-up figures and carries them in --json. About 2 s."""

from __future__ import annotations

import json


def test_models_show_the_layer_mix(invoke):
    r = invoke("models")
    assert r.exit_code == 0
    lines = {ln.split()[0]: ln for ln in r.output.splitlines()}
    assert "[24 linear-attention (GDN) + 8 full]" in lines["qwen3.5-4b"]
    assert "[27 Mamba-2 + 4 full]" in lines["nemotron-nano-9b-v2"]
    assert "[" not in lines["llama-3.1-8b"]  # full attention: no mix
    # a hybrid's KV per token is its attention layers' (8 x 4,096 B; Nemotron 4 x 4,096 B,
    # none for its 27 Mamba and 25 MLP-only layers), its states a separate per-request
    # figure: 24 x 2,146,304 B = 49.1 MiB; 27 x (73,728 + 5,242,880) B = 136.9 MiB (fp32)
    assert "32,768 B/token KV" in lines["qwen3.5-4b"]
    assert "+ 49.1 MiB state/request" in lines["qwen3.5-4b"]
    assert "16,384 B/token KV" in lines["nemotron-nano-9b-v2"]
    assert "+ 136.9 MiB state/request" in lines["nemotron-nano-9b-v2"]
    assert "131,072 B/token KV" in lines["llama-3.1-8b"]  # every layer, as before
    # the state figure names the engine and version whose dtypes it uses
    assert "state per request as vLLM v0.31.0 stores it" in r.output.splitlines()[-1]


def test_plan_prints_and_writes_the_hybrid_layout(invoke):
    r = invoke("plan", "--model", "qwen3.5-4b", "--gpu", "h100", "--budget", "vllm")
    assert r.exit_code == 0, r.output
    assert "Setting attention block size to 528 tokens" in r.output.replace("\n", " ")
    j = invoke("plan", "--model", "nemotron-nano-9b-v2", "--gpu", "h100", "--budget", "vllm",
               "--json")
    d = json.loads(j.output)
    # vLLM v0.31: fp32 recurrent state, prefix caching on, mode "all": a multiple of the
    # SSD chunk of 128 holding 5,316,608 B of state in 4,096 B tokens: 1,408
    assert d["block_size"] == 1408 and d["pools"][0]["kind"] == "mamba"
    assert d["mamba_cache_mode"] == "all"
    j = invoke("plan", "--model", "nemotron-nano-9b-v2", "--gpu", "h100", "--budget", "vllm",
               "--vllm-version", "0.11.0", "--json")
    d = json.loads(j.output)  # v0.11 (vllm #24280's era): bf16 state, no prefix caching
    assert d["block_size"] == 672 and d["mamba_cache_mode"] == "none"
