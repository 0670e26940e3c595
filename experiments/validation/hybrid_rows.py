"""Hybrid-model rows: vLLM's start-up lines for hybrid models reproduced from kvsim's presets
under the rules of the vLLM version that printed them (kvcore.model.vllm_rules), and the KV memory
wasted when sliding-window layers are stored as full attention.

Block sizes: `kvsim plan --budget vllm` on the preset. The published figures are vLLM's
start-up log lines: vllm #24280 (NVIDIA-Nemotron-Nano-9B-v2, 672 tokens; September 2025, the
v0.10 / v0.11 line, whose Mamba state was in bf16) and, for Qwen3.5-4B (528 tokens, "Padding
mamba page size by 0.76%"), as kvsim issue 27 quotes them. A wrong state shape or dtype in a
preset moves these numbers.

Start-up logs (`LOG_ROWS`): each is one engine log's "GPU KV cache size: N tokens" and
"Maximum concurrency for L tokens per request: X" lines, with the version, model, KV memory,
max_model_len, KV dtype and prefix caching the log or its command shows; both printed
figures must come out exactly (the token count to the token, the concurrency to its two
printed decimals). The KV memory is "Available KV cache memory" as printed (two decimals of
a GiB); where a log prints none, the block count is the only one both printed figures admit,
and the row says so. A log run with speculative decoding (MTP) carries its speculative
tokens, which add state pages per request in mode align and widen the gated delta net's conv
state (vLLM `MambaSpec.max_memory_usage_bytes`, `gated_delta_net_state_shape`). (The MTP
layer's own attention KV joins the full-attention group; without a printed memory it moves
no printed figure, so the rows leave it out.)

Waste: vLLM RFC #11382 (Dec 2024) gives 25 % for Gemma-2 and 56.25 % for Ministral; kvsim
computes 1 - (KV the layout holds) / (KV with every layer full) at the model's longest
context (Gemma-2: 8,192; Ministral: 131,072, its advertised 128k context). The RFC's mllama
figure (79.6 %) depends on the split of image (cross-attention) and text tokens, which the
RFC does not state, so there is no row for it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from experiments.validation.rows import make_row
from kvcore.model.hybrid_plan import HybridPlan, kv_waste_as_full, vllm_plan
from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.memory import MemorySpec
from kvcore.model.planner import plan
from kvcore.model.presets import GiB
from kvcore.model.state_dtypes import resolve_state_dtypes
from kvcore.model.vllm_rules import vllm_rules

SECTION = "Hybrid models"
BLOCK_SIZES = (  # model, vLLM version, published block size, Mamba padding % (None: not logged)
    ("qwen3.5-4b", "0.31.0", 528, 0.76),
    ("nemotron-nano-9b-v2", "0.11.0", 672, None),
)
RFC_WASTE = (  # model, context length, RFC #11382 waste %
    ("gemma-2-9b", 8_192, 25.0),
    ("ministral-8b", 131_072, 56.25),
)


@dataclass(frozen=True)
class LogRow:
    """One engine log's printed KV cache figures and what produced them. `kv_gib` is the
    printed "Available KV cache memory" (per GPU); `num_blocks` replaces it where the log
    prints none; `prefix_caching` None is the version's default."""

    source: str
    version: str
    model: str
    max_model_len: int
    tokens: int
    concurrency: str  # as printed, two decimals
    kv_dtype: str = "bf16"
    kv_gib: float | None = None
    num_blocks: int | None = None
    prefix_caching: bool | None = None
    max_num_batched_tokens: int = 8192
    logged_model: str = ""  # the model the log ran, where the preset stands for its layout
    tp: int = 1
    model_dtype: str = "bf16"  # vLLM's --dtype (the conv state's dtype)
    spec_tokens: int = 0  # speculative_config num_speculative_tokens


LOG_ROWS: tuple[LogRow, ...] = (
    # vLLM v0.19.0 on an H20, `vllm serve Qwen3.5-27B --max-model-len 32768 --max-num-seqs 16
    # --max-num-batched-token 16384 --load-format dummy` (prefix caching default: off for
    # hybrids); no memory printed: only 1,487 blocks give both figures
    LogRow("https://github.com/vllm-project/vllm/issues/40691", "0.19.0", "qwen3.5-27b",
           32_768, 290_864, "33.04", num_blocks=1487, max_num_batched_tokens=16384),
    # vLLM v0.24.0 on an RTX 5090, Qwen3.6-35B-A3B NVFP4, kv_cache_dtype fp8,
    # enable_prefix_caching True, max_model_len 131,072, max_num_batched_tokens 8,192
    LogRow("https://github.com/noonghunna/club-3090/issues/612", "0.24.0", "qwen3.5-35b-a3b",
           131_072, 567_978, "4.33", kv_dtype="fp8", kv_gib=5.98, prefix_caching=True,
           logged_model="Qwen3.6-35B-A3B (NVFP4), the Qwen3.5-35B-A3B layout"),
    LogRow("https://github.com/noonghunna/club-3090/issues/652", "0.24.0", "qwen3.5-35b-a3b",
           131_072, 569_878, "4.35", kv_dtype="fp8", kv_gib=6.01, prefix_caching=True,
           logged_model="Qwen3.6-35B-A3B (NVFP4), the Qwen3.5-35B-A3B layout"),
    # vLLM v0.22 (kv_cache_utils.py:1733, that release's line), two RTX 3090s, Qwen3.6-27B
    # int4, tensor_parallel_size 2, dtype float16, kv_cache_dtype fp8_e5m2,
    # enable_prefix_caching True, MTP with num_speculative_tokens 3, max_model_len 262,144;
    # no memory printed: only 424 (#295) and 425 (#294) blocks give both figures
    LogRow("https://github.com/noonghunna/club-3090/issues/295", "0.22.0", "qwen3.6-27b",
           262_144, 620_944, "2.37", kv_dtype="fp8", num_blocks=424, prefix_caching=True,
           tp=2, model_dtype="fp16", spec_tokens=3),
    LogRow("https://github.com/noonghunna/club-3090/issues/294", "0.22.0", "qwen3.6-27b",
           262_144, 622_408, "2.37", kv_dtype="fp8", num_blocks=425, prefix_caching=True,
           tp=2, model_dtype="fp16", spec_tokens=3),
)


def log_plan(row: LogRow) -> HybridPlan:
    """vLLM's plan of `row` (kvcore.model.hybrid_plan.vllm_plan under the row's version): the
    preset's layout, its states as that version stores them in the log's dtype and with its
    speculative tokens."""
    rules = vllm_rules(row.version)
    layout = resolve_state_dtypes(replace(LAYOUTS[row.model], model_dtype=row.model_dtype),
                                  "vllm", rules, spec_tokens=row.spec_tokens)
    kw: dict[str, Any] = dict(kv_dtype=row.kv_dtype, tp=row.tp, rules=rules,
                              prefix_caching=row.prefix_caching,
                              speculative_tokens=row.spec_tokens,
                              max_num_batched_tokens=row.max_num_batched_tokens)
    if row.num_blocks is not None:  # one block id's bytes times the blocks
        budget = float(row.num_blocks * vllm_plan(layout, GiB, row.max_model_len,
                                                  **kw).block_bytes)
    else:
        assert row.kv_gib is not None
        budget = row.kv_gib * GiB
    return vllm_plan(layout, budget, row.max_model_len, **kw)


def log_rows() -> list[dict]:
    """Each LOG_ROWS entry as two exact rows: the token figure and the concurrency."""
    out = []
    for r in LOG_ROWS:
        p = log_plan(r)
        memory = (f"{r.kv_gib} GiB" if r.kv_gib is not None
                  else f"{r.num_blocks:,} blocks (no memory printed)")
        if r.tp > 1 or r.spec_tokens:
            memory += f"; tp {r.tp}; {r.spec_tokens} speculative tokens (MTP)"
        note = (f"{r.source}; vLLM v{r.version}; {r.logged_model or r.model}; {memory}; "
                f"max_model_len {r.max_model_len:,}; KV {r.kv_dtype}; mode "
                f"{p.mamba_cache_mode}; block {p.block_size}, {p.num_blocks:,} blocks")
        name = f"{r.model} v{r.version} {r.source.rsplit('/', 1)[-1]}"
        out.append(make_row(SECTION, f"{name} GPU KV cache size (tokens)", r.tokens,
                            p.kv_cache_tokens, "exact", p.kv_cache_tokens == r.tokens,
                            note=note))
        conc = f"{p.max_concurrency:.2f}"
        out.append(make_row(SECTION, f"{name} maximum concurrency (x)", float(r.concurrency),
                            float(conc), "exact at the 2 printed decimals",
                            conc == r.concurrency, note=note))
    return out


def hybrid_rows(notes: dict[str, str] | None = None) -> list[dict]:
    """Block-size rows (exact), log rows (exact) and RFC waste rows (to 0.01 percentage
    point); milliseconds. `notes` gets the method note of the log rows."""
    if notes is not None:
        notes["Hybrid start-up logs"] = (
            "Each row pair is one vLLM log's 'GPU KV cache size' and 'Maximum concurrency' "
            "lines, computed by kvsim's planner under the rules of the version that printed "
            "them (kvcore/model/vllm_rules.py: up to v0.20.0 the token figure is num_blocks // "
            "groups x the smallest block, from v0.20.1 int(concurrency x max_model_len); "
            "prefix caching off by default for hybrids until v0.26, mamba cache mode none "
            "then, align for gated delta net models with it on, two state pages per request "
            "plus one per speculative token). The memory is the log's 'Available KV cache "
            "memory' (two printed decimals of a GiB) or, where it prints none, the only block "
            "count both figures admit. Qwen3.6-35B-A3B runs the Qwen3.5-35B-A3B layout (the "
            "same architecture); every figure must match exactly.")
    rows = []
    for model, version, block, pad in BLOCK_SIZES:
        r = plan(MemorySpec(model=model, gpu="h100", budget="vllm", vllm_version=version),
                 page_size=16, prefix_caching=False)
        assert r.hybrid is not None
        note = f"vLLM v{version} rules; {LAYOUTS[model].mix}"
        rows.append(make_row(SECTION, f"{model} vLLM attention block size", block,
                             r.hybrid.block_size, "exact", r.hybrid.block_size == block,
                             note=note))
        if pad is not None:
            ours = round(_padding_pct(r.hybrid.log), 2)
            rows.append(make_row(SECTION, f"{model} vLLM Mamba page padding (%)", pad, ours,
                                 "0.01 pp (the log prints 2 decimals)", ours == pad,
                                 note=note))
    rows += log_rows()
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


__all__ = ["BLOCK_SIZES", "LOG_ROWS", "RFC_WASTE", "LogRow", "hybrid_rows", "log_plan",
           "log_rows"]
