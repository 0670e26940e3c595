"""Memory planning: how much KV fits on a GPU (group), and what each page size costs.

Every engine sizes its KV pool as (a budget) minus (what it measured besides KV), divided by
the bytes of one token of KV. Engines differ in the budget, so the budget is a named rule:

* `vllm`:    gpu_memory_utilization x total - weights - activation peak - non-torch
* `sglang`:  mem_fraction_static x total - weights - non-torch (SGLang's classic formula
             `free_after_load - total x (1 - f)`, with free_after_load = total - weights -
             non-torch); the activation peak lives inside the (1 - f) headroom
* `trtllm`:  free_gpu_memory_fraction x (total - weights - activation peak - non-torch)
             (TensorRT-LLM takes a fraction of the memory free after the engine loaded)
* `lmdeploy`: cache_max_entry_count x (total - weights - non-torch) (a fraction of the memory
             free after the weights loaded)

or a direct size: `kv_mem_gib` (the KV memory of the whole tensor-parallel group, as the vLLM
paper's Table 1 lists it), `kv_tokens` (slots), `num_pages` (pages; vLLM's
num_gpu_blocks_override).

The inputs are one `kvcore.model.memory.MemorySpec` (model, GPU, TP, KV dtype, the rule or direct
size, the maximum context), which also holds the rule table and validates every input; this
module does the arithmetic. Budgets are computed per rank (one GPU), then tokens = budget // KV
bytes per token per rank, floored to a multiple of the page size. The pool adds its reserved
dummy page on top. Nothing here needs SimPy or torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvcore.model.hybrid_plan import HybridPlan, sglang_plan, vllm_plan
from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.layers import HybridLayout
from kvcore.model.memory import BUDGET_RULES, DIRECT_SIZES, MemorySpec
from kvcore.model.model_config import layout_from_hf_config
from kvcore.model.presets import GiB, GpuPreset, ModelPreset, get_gpu
from kvcore.model.state_dtypes import resolve_state_dtypes
from kvcore.model.vllm_rules import vllm_rules

PAGE_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: a hybrid plan's figures that store every layer as full attention: named `baseline_<key>`
#: in its JSON (PlanResult.to_dict)
BASELINE_KEYS: tuple[str, ...] = ("kv_tokens", "kv_pages", "kv_tokens_unaligned",
                                  "kv_bytes_per_token", "kv_bytes_per_token_per_rank",
                                  "concurrency", "page_sizes")
DEFAULT_MAX_RUNNING_REQUESTS = 256
DEFAULT_CONCURRENCY_CONTEXTS: tuple[int, ...] = (512, 2048, 8192, 32768)
INT32_BYTES = 4


@dataclass
class PlanResult:
    """What the planner found; `to_dict()` is the JSON form. Bytes are per token / per rank
    where the name says so, else for the whole tensor-parallel group."""

    model: str
    gpu: str
    tp: int
    kv_dtype: str
    weight_dtype: str
    budget_rule: str
    budget_formula: str
    fraction: float | None
    gpu_mem_bytes: float
    activation_peak_bytes: float
    non_torch_bytes: float
    kv_bytes_per_token: int  # all ranks together (MLA: replicated, counted on each rank)
    kv_bytes_per_token_per_rank: int
    weight_bytes: float
    weight_bytes_per_rank: float
    kv_budget_bytes: float
    kv_budget_bytes_per_rank: float
    page_size: int
    kv_tokens: int  # page-aligned slots
    kv_pages: int
    kv_tokens_unaligned: int
    max_running_requests: int
    context_len: int
    req_to_token_bytes: int
    concurrency: list[dict[str, int]]
    page_sizes: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    layer_mix: str = ""
    hybrid: HybridPlan | None = None  # hybrids only: what the engine prints at start-up
    # hybrids only, per rank: KV bytes per token of the attention layers, state bytes per
    # request of the Mamba / linear-attention layers (the engine's state dtypes)
    attention_kv_bytes_per_token: int = 0
    state_bytes_per_request: int = 0
    weights_unknown: str = ""  # a KV-only config: why (its weights count as 0 here)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form. `kv_tokens` answers how many tokens fit: for a hybrid the engine's
        own figure ("GPU KV cache size" or SGLang's full-attention tokens), with the figures
        of every layer stored as full attention under `baseline_` names (`baseline_kv_tokens`,
        ...) and the engine's layout (block_size, max_concurrency, pools, ...) as top-level
        keys; a full-attention model has none of these and its keys are unchanged."""
        d = asdict(self)
        if not d["weights_unknown"]:
            d.pop("weights_unknown")
        h = d.pop("hybrid")
        if not h:
            for key in ("layer_mix", "attention_kv_bytes_per_token", "state_bytes_per_request"):
                d.pop(key)
            return d
        for key in BASELINE_KEYS:
            d[f"baseline_{key}"] = d.pop(key)
        d["hybrid_engine"] = h.pop("engine")
        d["kv_tokens"] = h.pop("kv_cache_tokens")
        h.pop("baseline_tokens")  # the same baseline at the engine's default page
        d.update(h)
        return d


def model_layout(memory: MemorySpec, model: ModelPreset,
                 engine: str | None = None) -> HybridLayout | None:
    """The layout of a hybrid model (a preset in kvcore.model.hybrid_presets or a --model-config
    with more than one layer kind), its state dtypes as `engine` (default: the spec's,
    `MemorySpec.engine`) stores them under the spec's options and vLLM version; None for a
    full-attention model, whose plans stay as they were."""
    layout: HybridLayout | None = (layout_from_hf_config(memory.model_config)
                                   if memory.model_config else LAYOUTS.get(model.id))
    if layout is None or not layout.is_hybrid:
        return None
    return resolve_state_dtypes(layout, engine or memory.engine,
                                vllm_rules(memory.vllm_version), memory.mamba_cache_dtype,
                                memory.mamba_ssm_cache_dtype)


# -- pieces ----------------------------------------------------------------------------------
def _check_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def internal_fragmentation(lengths: np.ndarray | Sequence[int], page_size: int) -> float:
    """Mean of ceil(L/ps)*ps - L over the lengths: slots lost in each request's last page."""
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.size == 0:
        return 0.0
    return float(np.mean(-(-arr // page_size) * page_size - arr))


def page_table_entries(lengths: np.ndarray | Sequence[int], page_size: int) -> float:
    """Mean ceil(L/ps): block-table entries per request (vLLM's per-request block list)."""
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.size == 0:
        return 0.0
    return float(np.mean(-(-arr // page_size)))


@dataclass(frozen=True)
class _Budget:
    rule: str
    formula: str
    fraction: float | None
    total: float
    per_rank: float  # bytes
    tokens_unaligned: int | None  # set by kv_tokens / num_pages


def _budget(mem: MemorySpec, m: ModelPreset, g: GpuPreset, page_size: int) -> _Budget:
    """The KV budget per rank under the spec's direct size or budget rule (the spec has
    already checked that at most one is given and that every number is in its domain)."""
    total = mem.gpu_mem_gib * GiB if mem.gpu_mem_gib is not None else g.mem_bytes
    tp = mem.tp
    bpt = m.kv_bytes_per_token(mem.kv_dtype, tp)
    rule = mem.rule
    if rule == "kv_mem_gib":
        assert mem.kv_mem_gib is not None
        per_rank = mem.kv_mem_gib * GiB / tp
        return _Budget(rule, "kv_mem_gib / tp", None, total, per_rank, None)
    if rule == "kv_cache_memory_bytes":
        assert mem.kv_cache_memory_bytes is not None
        return _Budget(rule, "kv_cache_memory_bytes (per GPU)", None, total,
                       float(mem.kv_cache_memory_bytes), None)
    if rule in ("kv_tokens", "num_pages"):
        n = mem.kv_tokens if rule == "kv_tokens" else mem.num_pages
        assert n is not None
        tokens = n if rule == "kv_tokens" else n * page_size
        return _Budget(rule, rule + ("" if rule == "kv_tokens" else " x page_size"), None,
                       total, float(tokens * bpt), tokens)
    r = BUDGET_RULES[rule]
    f = r.default_fraction(tp) if mem.mem_fraction is None else float(mem.mem_fraction)
    per_rank = r.budget(total, m.weight_bytes(tp), mem.activation_peak_gib * GiB,
                        mem.non_torch_gib * GiB, f)
    return _Budget(rule, f"{r.formula}  (f = {r.knob} = {f:g})", f, total, per_rank, None)


def _below_one_page(mem: MemorySpec, b: _Budget, bpt: int, ps: int, model: str) -> str:
    """The error of a direct pool size smaller than one page: the pool, the page, the way out
    (a larger size or a smaller page), not the GPU or the model."""
    if b.rule == "kv_tokens":
        return (f"--kv-tokens {mem.kv_tokens} is smaller than one {ps}-token page: the KV pool "
                f"would hold no page (give --kv-tokens {ps} or more, or a smaller --page-size)")
    given = (("--kv-cache-memory-bytes", f"{mem.kv_cache_memory_bytes}")
             if b.rule == "kv_cache_memory_bytes" else ("--kv-mem-gib", f"{mem.kv_mem_gib:g}"))
    return (f"{given[0]} {given[1]} is {b.per_rank / 2**20:.3g} MiB of KV per GPU, "
            f"smaller than one {ps}-token page of {model} ({bpt * ps / 2**20:.3g} MiB): the KV "
            f"pool would hold no page (give more {given[0]}, or a smaller --page-size)")


# -- the planner -----------------------------------------------------------------------------
def plan(
    memory: MemorySpec,
    *,
    page_size: int | None = None,
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS,
    context_len: int | None = None,
    concurrency_contexts: Sequence[int] | None = None,
    lengths: np.ndarray | Sequence[int] | None = None,
    page_sizes: Sequence[int] = PAGE_SIZES,
    engine_figures: bool = True,
    prefix_caching: bool | None = None,
    mamba_cache_mode: str | None = None,
) -> PlanResult:
    """Plan the KV pool that `memory` describes (model on `tp` GPUs, a direct size or a budget
    rule; see kvcore.model.memory).

    `page_size` defaults to the rule's native page (vllm 16, sglang 1, trtllm 32, lmdeploy
    64; 1 for the direct sizes). `context_len` defaults to the spec's maximum context (the
    model's max_position unless it sets one). `lengths` (final KV lengths of a workload) feed
    the per-page-size fragmentation table; without them the table uses `context_len`. A
    budget below one page raises ValueError saying how many GiB are missing. For a hybrid
    model (kvcore.model.hybrid_presets, or a --model-config with several layer kinds)
    `engine_figures` adds what the engine prints at start-up (kvcore.model.hybrid_plan: SGLang's
    pools under the sglang rule, vLLM's KV cache groups otherwise, by the rules of the spec's
    vLLM version with prefix caching `prefix_caching` (None: the version's default) or the
    mode `mamba_cache_mode`; an explicit `page_size` is vLLM's --block-size). A preset whose
    weights are unknown (a KV-only config) plans with a direct size only.
    """
    m = memory.model_preset()
    g = get_gpu(memory.gpu)
    tp = memory.tp
    act = memory.activation_peak_gib * GiB
    nt = memory.non_torch_gib * GiB
    block_size = page_size
    if page_size is None:
        rule = memory.rule
        page_size = BUDGET_RULES[rule].native_page_size if rule in BUDGET_RULES else 1
    ps = _check_int("page_size", page_size)
    mrr = _check_int("max_running_requests", max_running_requests)
    ctx = _check_int("context_len", memory.resolved_max_context_len() if context_len is None
                     else context_len)
    b = _budget(memory, m, g, ps)

    bpt = m.kv_bytes_per_token(memory.kv_dtype, tp)
    # a KV-only config (weights unknown) plans a direct size: its weights count as 0 below
    # and a note says so; a budget rule needed them and refused in _budget
    w_rank = 0.0 if m.weights_unknown else m.weight_bytes(tp)
    gpu_label = g.id
    where = f"{tp} x {gpu_label}" if tp > 1 else gpu_label
    page_bytes = bpt * ps
    if b.per_rank < page_bytes and b.rule in DIRECT_SIZES:
        # the size given holds no whole page: more GPUs or a smaller model would not help
        raise ValueError(_below_one_page(memory, b, bpt, ps, m.id))
    if b.per_rank < page_bytes:
        short = (page_bytes - b.per_rank) / GiB
        raise ValueError(
            f"{m.id} does not fit on {where} under the {b.rule} rule: weights take "
            f"{w_rank / GiB:.2f} GiB per GPU of {b.total / GiB:.2f} GiB and the KV budget "
            f"comes out at {b.per_rank / GiB:.2f} GiB per GPU; {short:.2f} GiB per GPU short "
            f"of one {ps}-token page (more GPUs via tp, a smaller model or a larger GPU)")
    warnings: list[str] = []
    used = w_rank + b.per_rank
    if used > b.total:
        over = (used - b.total) / GiB
        raise ValueError(
            f"{m.id} does not fit on {where}: weights {w_rank / GiB:.2f} GiB + KV "
            f"{b.per_rank / GiB:.2f} GiB per GPU exceed {b.total / GiB:.2f} GiB by "
            f"{over:.2f} GiB")
    if used + act + nt > b.total:
        warnings.append(
            f"weights + KV leave {(b.total - used) / GiB:.2f} GiB per GPU, less than the "
            f"activation peak + non-torch memory ({(act + nt) / GiB:.2f} GiB)")
    tokens_raw = b.tokens_unaligned if b.tokens_unaligned is not None else int(
        b.per_rank // bpt)
    pages = tokens_raw // ps
    tokens = pages * ps
    cc = list(concurrency_contexts or DEFAULT_CONCURRENCY_CONTEXTS)
    concurrency = []
    for L in cc:
        L = _check_int("concurrency context length", L)
        per_req = -(-L // ps)
        concurrency.append({"context_len": L, "pages_per_request": per_req,
                            "max_requests": pages // per_req})
    dist = (np.asarray(lengths, dtype=np.int64) if lengths is not None
            else np.asarray([ctx], dtype=np.int64))
    if dist.size and dist.min() < 0:
        raise ValueError("lengths must be >= 0")
    rows = []
    for p in page_sizes:
        p = _check_int("page size", p)
        pg = tokens_raw // p
        frag = internal_fragmentation(dist, p)
        mean_len = float(dist.mean()) if dist.size else 0.0
        rows.append({
            "page_size": p, "kv_pages": pg, "kv_tokens": pg * p,
            "mean_internal_frag_tokens": frag,
            "internal_frag_pct": 100.0 * frag / (mean_len + frag) if mean_len + frag else 0.0,
            "internal_frag_bytes": frag * bpt * tp,
            "mean_page_table_entries": page_table_entries(dist, p),
            "block_table_bytes_per_request": INT32_BYTES * -(-ctx // p),
        })
    notes = []
    if m.weights_unknown:
        notes.append(f"weights unknown ({m.weights_unknown}): the KV memory is the size "
                     "given, the weights are not checked against the GPU")
    layout = model_layout(memory, m)
    hybrid = None
    if layout is not None and engine_figures:
        if memory.engine == "vllm":  # vLLM's layout for every rule but sglang's
            hybrid = vllm_plan(layout, b.per_rank, ctx, kv_dtype=memory.kv_dtype, tp=tp,
                               block_size=block_size, rules=vllm_rules(memory.vllm_version),
                               prefix_caching=prefix_caching, mamba_cache_mode=mamba_cache_mode)
        else:
            # SGLang v0.5 runs a model with Mamba / linear-attention layers at page size 1:
            # its Mamba radix cache (mem_cache/mamba_radix_cache.py, the default no_buffer
            # strategy) supports no other, as kvcore/sglang/mamba_state.py enforces
            sg_ps = 1 if layout.state_groups() else ps
            hybrid = sglang_plan(layout, b.per_rank, ctx, kv_dtype=memory.kv_dtype, tp=tp,
                                 page_size=sg_ps, max_running_requests=mrr)
            if sg_ps != ps:
                notes.append(f"sglang layout at page size 1, not {ps}: SGLang's Mamba radix "
                             "cache (v0.5) runs no other")
    if layout is not None:
        notes.append(f"hybrid: {layout.mix}; the KV bytes per token, tokens, pages and "
                     "max requests above store every layer as full attention (the "
                     "pre-hybrid baseline); the engine's own figures are in its layout")
    elif m.sliding_window:
        notes.append(f"{m.id} uses a sliding window of {m.sliding_window} tokens; kvsim "
                     "models full attention, so KV per request is not capped by the window")
    if m.is_moe:
        notes.append(f"MoE: all {m.num_experts} experts stay resident "
                     f"({m.num_params / 1e9:.1f}B weights, {m.params_per_token / 1e9:.1f}B "
                     "active per token)")
    if m.is_mla:
        notes.append("MLA: one latent of kv_lora_rank + qk_rope_head_dim per token and layer, "
                     "replicated on every TP rank")
    if not m.is_mla and m.num_kv_heads < tp:
        notes.append(f"{m.num_kv_heads} KV heads over tp={tp}: heads replicated, one per rank")
    if lengths is None:
        notes.append(f"fragmentation column uses a single length = context_len ({ctx})")
    if ctx > m.max_position:
        warnings.append(f"context_len {ctx} exceeds the model's max_position {m.max_position}")
    if tokens < ctx:
        warnings.append(f"the pool ({tokens} tokens) cannot hold one {ctx}-token request")
    return PlanResult(
        model=m.id, gpu=gpu_label, tp=tp, kv_dtype=memory.kv_dtype, weight_dtype=m.weight_dtype,
        budget_rule=b.rule, budget_formula=b.formula, fraction=b.fraction,
        gpu_mem_bytes=b.total, activation_peak_bytes=act, non_torch_bytes=nt,
        kv_bytes_per_token=bpt * tp, kv_bytes_per_token_per_rank=bpt,
        weight_bytes=w_rank * tp, weight_bytes_per_rank=w_rank,
        kv_budget_bytes=b.per_rank * tp, kv_budget_bytes_per_rank=b.per_rank,
        page_size=ps, kv_tokens=tokens, kv_pages=pages, kv_tokens_unaligned=tokens_raw,
        max_running_requests=mrr, context_len=ctx,
        req_to_token_bytes=(mrr + 1) * ctx * INT32_BYTES,
        concurrency=concurrency, page_sizes=rows, notes=notes, warnings=warnings,
        layer_mix=layout.mix if layout is not None else "", hybrid=hybrid,
        attention_kv_bytes_per_token=(layout.kv_bytes_per_token(memory.kv_dtype, tp)
                                      if layout is not None else 0),
        state_bytes_per_request=(layout.state_bytes_per_request(memory.kv_dtype, tp)
                                 if layout is not None else 0),
        weights_unknown=m.weights_unknown,
    )


def resolve_kv_tokens(memory: MemorySpec, page_size: int = 1) -> int:
    """The slot count (a multiple of `page_size`) the simulator's pool gets for `memory`; the
    same number `plan` reports as `kv_tokens`. ValueError if nothing fits."""
    return plan(memory, page_size=page_size, context_len=1, concurrency_contexts=(1,),
                page_sizes=(page_size,), engine_figures=False).kv_tokens


def resolve_kv_bytes(memory: MemorySpec, page_size: int = 1) -> int:
    """The KV budget of one rank in bytes (`kv_budget_bytes_per_rank`, floored), which a
    hybrid model's pools are sized from (kvcore.model.hybrid_plan), as `plan` computes it."""
    return int(plan(memory, page_size=page_size, context_len=1, concurrency_contexts=(1,),
                    page_sizes=(page_size,), engine_figures=False).kv_budget_bytes_per_rank)
