"""Hybrid-model rows: vLLM's hybrid block sizes and the KV memory wasted when sliding-window
layers are stored as full attention, computed from kvsim's presets.

Block sizes: `kvsim plan --budget vllm` on the preset, by the rule of vLLM v0.11.0
(vllm/model_executor/models/config.py `HybridAttentionMambaModelConfig`, see
kvcore/hybrid_plan.py); the published figures are vLLM's start-up log lines, quoted in
vllm #24280 (NVIDIA-Nemotron-Nano-9B-v2: 672 tokens) and, for Qwen3.5-4B (528 tokens,
"Padding mamba page size by 0.76%"), as kvsim issue 27 quotes them. A wrong state shape or dtype in
a preset moves these numbers.

Waste: vLLM RFC #11382 (Dec 2024) gives 25 % for Gemma-2 and 56.25 % for Ministral; kvsim
computes 1 - (KV the layout holds) / (KV with every layer full) at the model's longest
context (Gemma-2: 8,192; Ministral: 131,072, its advertised 128k context). The RFC's mllama
figure (79.6 %) depends on the split of image (cross-attention) and text tokens, which the
RFC does not state, so there is no row for it.
"""

from __future__ import annotations

from experiments.validation.rows import make_row
from kvcore.hybrid_plan import kv_waste_as_full
from kvcore.hybrid_presets import LAYOUTS
from kvcore.memory import MemorySpec
from kvcore.planner import plan

SECTION = "Hybrid models"
VLLM_VERSION = "vLLM v0.11.0 HybridAttentionMambaModelConfig"
BLOCK_SIZES = (  # model, published block size, published Mamba padding % (None: not logged)
    ("qwen3.5-4b", 528, 0.76),
    ("nemotron-nano-9b-v2", 672, None),
)
RFC_WASTE = (  # model, context length, RFC #11382 waste %
    ("gemma-2-9b", 8_192, 25.0),
    ("ministral-8b", 131_072, 56.25),
)


def hybrid_rows() -> list[dict]:
    """Block-size rows (exact) and RFC waste rows (to 0.01 percentage point); milliseconds."""
    rows = []
    for model, block, pad in BLOCK_SIZES:
        r = plan(MemorySpec(model=model, gpu="h100", budget="vllm"), page_size=16)
        assert r.hybrid is not None
        rows.append(make_row(SECTION, f"{model} vLLM attention block size", block,
                             r.hybrid.block_size, "exact", r.hybrid.block_size == block,
                             note=f"{VLLM_VERSION}; {LAYOUTS[model].mix}"))
        if pad is not None:
            ours = round(_padding_pct(r.hybrid.log), 2)
            rows.append(make_row(SECTION, f"{model} vLLM Mamba page padding (%)", pad, ours,
                                 "0.01 pp (the log prints 2 decimals)", ours == pad,
                                 note=VLLM_VERSION))
    for model, ctx, pct in RFC_WASTE:
        ours = round(100 * kv_waste_as_full(LAYOUTS[model], ctx), 2)
        rows.append(make_row(SECTION, f"{model} KV wasted storing SWA as full (%)", pct, ours,
                             "0.01 pp", abs(ours - pct) < 0.01 + 1e-9,
                             note=f"vLLM RFC #11382; context {ctx:,}; {LAYOUTS[model].mix}"))
    return rows


def _padding_pct(log: list[str]) -> float:
    """The padding the planner logged as vLLM does ('Padding mamba page size by X% ...')."""
    for line in log:
        if line.startswith("Padding mamba page size by "):
            return float(line.split("by ")[1].split("%")[0])
    return 0.0


__all__ = ["BLOCK_SIZES", "RFC_WASTE", "hybrid_rows"]
