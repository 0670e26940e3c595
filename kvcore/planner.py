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
paper's Table 1 lists it), `kv_tokens` (slots), `num_gpu_blocks_override` (pages).

Budgets are computed per rank (one GPU), then tokens = budget // KV bytes per token per rank,
floored to a multiple of the page size. The pool adds its reserved dummy page on top.
Nothing here needs SimPy or torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvcore.presets import GiB, GpuPreset, ModelPreset, get_gpu, get_model

PAGE_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_ACTIVATION_PEAK_GIB = 2.0
DEFAULT_NON_TORCH_GIB = 0.5
DEFAULT_MAX_RUNNING_REQUESTS = 256
DEFAULT_CONCURRENCY_CONTEXTS: tuple[int, ...] = (512, 2048, 8192, 32768)
INT32_BYTES = 4


def _sglang_fraction(tp: int) -> float:
    """mem_fraction_static as older SGLang releases picked it by TP size (more ranks, more
    headroom for communication buffers)."""
    if tp >= 16:
        return 0.79
    if tp >= 8:
        return 0.81
    if tp >= 4:
        return 0.85
    if tp >= 2:
        return 0.87
    return 0.88


@dataclass(frozen=True)
class BudgetRule:
    """One engine's way to size the KV pool; `budget` returns bytes per rank (may be < 0)."""

    name: str
    knob: str
    default_fraction: Callable[[int], float]
    formula: str
    budget: Callable[[float, float, float, float, float], float]  # total, w, act, nt, f
    native_page_size: int


BUDGET_RULES: dict[str, BudgetRule] = {r.name: r for r in [
    BudgetRule("vllm", "gpu_memory_utilization", lambda tp: 0.9,
               "f x total - weights - activation_peak - non_torch",
               lambda t, w, a, n, f: f * t - w - a - n, 16),
    BudgetRule("sglang", "mem_fraction_static", _sglang_fraction,
               "(total - weights - non_torch) - total x (1 - f)",
               lambda t, w, a, n, f: (t - w - n) - t * (1 - f), 1),
    BudgetRule("trtllm", "free_gpu_memory_fraction", lambda tp: 0.9,
               "f x (total - weights - activation_peak - non_torch)",
               lambda t, w, a, n, f: f * (t - w - a - n), 32),
    BudgetRule("lmdeploy", "cache_max_entry_count", lambda tp: 0.8,
               "f x (total - weights - non_torch)",
               lambda t, w, a, n, f: f * (t - w - n), 64),
]}
DIRECT_OPTIONS: tuple[str, ...] = ("kv_mem_gib", "kv_tokens", "num_gpu_blocks_override")


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

    @property
    def kv_budget_gib(self) -> float:
        return self.kv_budget_bytes / GiB

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- pieces ----------------------------------------------------------------------------------
def _as_model(model: ModelPreset | str) -> ModelPreset:
    return model if isinstance(model, ModelPreset) else get_model(model)


def _as_gpu(gpu: GpuPreset | str | None) -> GpuPreset | None:
    return gpu if gpu is None or isinstance(gpu, GpuPreset) else get_gpu(gpu)


def _check_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_nonneg(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


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
    tokens_unaligned: int | None  # set by kv_tokens / num_gpu_blocks_override


def _budget(
    m: ModelPreset, g: GpuPreset | None, tp: int, kv_dtype: str, rule: str,
    fraction: float | None, kv_mem_gib: float | None, kv_tokens: int | None,
    num_gpu_blocks_override: int | None, gpu_mem_gib: float | None,
    act: float, non_torch: float, page_size: int,
) -> _Budget:
    values = (kv_mem_gib, kv_tokens, num_gpu_blocks_override)
    direct = {k: v for k, v in zip(DIRECT_OPTIONS, values, strict=True) if v is not None}
    if len(direct) > 1:
        raise ValueError(f"give at most one of {', '.join(DIRECT_OPTIONS)}; got "
                         f"{', '.join(direct)}")
    if gpu_mem_gib is not None:
        total = _check_nonneg("gpu_mem_gib", gpu_mem_gib) * GiB
        if total <= 0:
            raise ValueError(f"gpu_mem_gib must be > 0, got {gpu_mem_gib!r}")
    elif g is not None:
        total = g.mem_bytes
    else:
        total = math.nan
    bpt = m.kv_bytes_per_token(kv_dtype, tp)
    if direct:
        (opt, val), = direct.items()
        if opt == "kv_mem_gib":
            gib = _check_nonneg("kv_mem_gib", val)
            per_rank = gib * GiB / tp
            return _Budget("kv_mem_gib", "kv_mem_gib / tp", None, total, per_rank, None)
        n = _check_int(opt, val)
        tokens = n if opt == "kv_tokens" else n * page_size
        return _Budget(opt, f"{opt}" + ("" if opt == "kv_tokens" else " x page_size"), None,
                       total, float(tokens * bpt), tokens)
    key = rule.strip().lower()
    if key not in BUDGET_RULES:
        raise ValueError(f"unknown budget rule {rule!r}; known: "
                         f"{', '.join([*BUDGET_RULES, *DIRECT_OPTIONS])}")
    r = BUDGET_RULES[key]
    if math.isnan(total):
        raise ValueError(f"the {key} rule needs a GPU preset or gpu_mem_gib")
    f = r.default_fraction(tp) if fraction is None else float(fraction)
    if not 0 < f <= 1:
        raise ValueError(f"{r.knob} (fraction) must be in (0, 1], got {fraction!r}")
    per_rank = r.budget(total, m.weight_bytes(tp), act, non_torch, f)
    return _Budget(key, f"{r.formula}  (f = {r.knob} = {f:g})", f, total, per_rank, None)


# -- the planner -----------------------------------------------------------------------------
def plan(
    model: ModelPreset | str,
    gpu: GpuPreset | str | None = None,
    *,
    tp: int = 1,
    kv_dtype: str = "bf16",
    rule: str = "vllm",
    fraction: float | None = None,
    kv_mem_gib: float | None = None,
    kv_tokens: int | None = None,
    num_gpu_blocks_override: int | None = None,
    gpu_mem_gib: float | None = None,
    activation_peak_gib: float = DEFAULT_ACTIVATION_PEAK_GIB,
    non_torch_gib: float = DEFAULT_NON_TORCH_GIB,
    page_size: int | None = None,
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS,
    context_len: int | None = None,
    concurrency_contexts: Sequence[int] | None = None,
    lengths: np.ndarray | Sequence[int] | None = None,
    page_sizes: Sequence[int] = PAGE_SIZES,
) -> PlanResult:
    """Plan the KV pool of `model` on `tp` x `gpu` under one budget rule or direct size.

    `page_size` defaults to the rule's native page (vllm 16, sglang 1, trtllm 32, lmdeploy
    64; 1 for the direct options). `context_len` defaults to the model's max_position.
    `lengths` (final KV lengths of a workload) feed the per-page-size fragmentation table;
    without them the table uses `context_len`. A budget below one page raises ValueError
    saying how many GiB are missing.
    """
    m = _as_model(model)
    g = _as_gpu(gpu)
    tp = _check_int("tp", tp)
    act = _check_nonneg("activation_peak_gib", activation_peak_gib) * GiB
    nt = _check_nonneg("non_torch_gib", non_torch_gib) * GiB
    direct_given = any(v is not None for v in (kv_mem_gib, kv_tokens, num_gpu_blocks_override))
    if page_size is None:
        key = rule.strip().lower()
        page_size = (1 if direct_given or key not in BUDGET_RULES
                     else BUDGET_RULES[key].native_page_size)
    ps = _check_int("page_size", page_size)
    mrr = _check_int("max_running_requests", max_running_requests)
    ctx = _check_int("context_len", m.max_position if context_len is None else context_len)
    b = _budget(m, g, tp, kv_dtype, rule, fraction, kv_mem_gib, kv_tokens,
                num_gpu_blocks_override, gpu_mem_gib, act, nt, ps)

    bpt = m.kv_bytes_per_token(kv_dtype, tp)
    w_rank = m.weight_bytes(tp)
    gpu_label = g.id if g is not None else (f"{gpu_mem_gib:g}GiB" if gpu_mem_gib else "-")
    where = f"{tp} x {gpu_label}" if tp > 1 else gpu_label
    page_bytes = bpt * ps
    if b.per_rank < page_bytes:
        short = (page_bytes - b.per_rank) / GiB
        raise ValueError(
            f"{m.id} does not fit on {where} under the {b.rule} rule: weights take "
            f"{w_rank / GiB:.2f} GiB per GPU of {b.total / GiB:.2f} GiB and the KV budget "
            f"comes out at {b.per_rank / GiB:.2f} GiB per GPU; {short:.2f} GiB per GPU short "
            f"of one {ps}-token page (more GPUs via tp, a smaller model or a larger GPU)")
    warnings: list[str] = []
    if not math.isnan(b.total):
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
    if m.sliding_window:
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
        model=m.id, gpu=gpu_label, tp=tp, kv_dtype=kv_dtype, weight_dtype=m.weight_dtype,
        budget_rule=b.rule, budget_formula=b.formula, fraction=b.fraction,
        gpu_mem_bytes=b.total, activation_peak_bytes=act, non_torch_bytes=nt,
        kv_bytes_per_token=bpt * tp, kv_bytes_per_token_per_rank=bpt,
        weight_bytes=w_rank * tp, weight_bytes_per_rank=w_rank,
        kv_budget_bytes=b.per_rank * tp, kv_budget_bytes_per_rank=b.per_rank,
        page_size=ps, kv_tokens=tokens, kv_pages=pages, kv_tokens_unaligned=tokens_raw,
        max_running_requests=mrr, context_len=ctx,
        req_to_token_bytes=(mrr + 1) * ctx * INT32_BYTES,
        concurrency=concurrency, page_sizes=rows, notes=notes, warnings=warnings,
    )


def resolve_kv_tokens(
    model: ModelPreset | str,
    gpu: GpuPreset | str | None,
    tp: int = 1,
    kv_dtype: str = "bf16",
    *,
    page_size: int = 1,
    rule: str = "vllm",
    fraction: float | None = None,
    kv_mem_gib: float | None = None,
    kv_tokens: int | None = None,
    num_gpu_blocks_override: int | None = None,
    gpu_mem_gib: float | None = None,
    activation_peak_gib: float = DEFAULT_ACTIVATION_PEAK_GIB,
    non_torch_gib: float = DEFAULT_NON_TORCH_GIB,
) -> int:
    """The slot count (a multiple of `page_size`) the simulator's pool gets for these memory
    options; the same numbers `plan` reports as `kv_tokens`. ValueError if nothing fits."""
    return plan(
        model, gpu, tp=tp, kv_dtype=kv_dtype, rule=rule, fraction=fraction,
        kv_mem_gib=kv_mem_gib, kv_tokens=kv_tokens,
        num_gpu_blocks_override=num_gpu_blocks_override, gpu_mem_gib=gpu_mem_gib,
        activation_peak_gib=activation_peak_gib, non_torch_gib=non_torch_gib,
        page_size=page_size, context_len=1, concurrency_contexts=(1,), page_sizes=(page_size,),
    ).kv_tokens


# -- page-size recommendation ------------------------------------------------------------------
@dataclass(frozen=True)
class PageSizeRecommendation:
    """The largest page size within `tolerance` of the best latency and the best hit rate."""

    page_size: int
    tolerance: float
    best_latency_s: float
    best_latency_page_size: int
    best_hit_rate: float
    best_hit_page_size: int
    within_tolerance: bool  # False: nothing met both, the best-latency page size was taken
    rule: str
    rows: list[dict[str, float]]  # page_size, normalized_latency_s, prefix_hit_rate, flags

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def recommend_page_size(df: Any, tolerance: float = 0.02) -> PageSizeRecommendation:
    """Pick from sweep rows (a pandas DataFrame with page_size, normalized_latency_s,
    prefix_hit_rate; several rows per page size, e.g. seeds, are averaged).

    Small pages pay per-page work, large pages pay rounding and missed reuse; the rule takes the
    largest page size whose latency <= best x (1 + tol) and hit rate >= best x (1 - tol).
    """
    need = ("page_size", "normalized_latency_s", "prefix_hit_rate")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"sweep rows lack column(s) {', '.join(missing)}")
    if len(df) == 0:
        raise ValueError("sweep rows are empty")
    tol = _check_nonneg("tolerance", tolerance)
    g = df.groupby("page_size", sort=True)[list(need[1:])].mean()
    ps = g.index.to_numpy(dtype=np.int64)
    lat = g["normalized_latency_s"].to_numpy(dtype=float)
    hit = g["prefix_hit_rate"].to_numpy(dtype=float)
    i_lat = int(np.nanargmin(lat))
    i_hit = int(np.nanargmax(hit))
    lat_ok = lat <= lat[i_lat] * (1 + tol)
    hit_ok = hit >= hit[i_hit] * (1 - tol)
    ok = lat_ok & hit_ok
    chosen = int(ps[ok].max()) if ok.any() else int(ps[i_lat])
    rows = [{"page_size": int(p), "normalized_latency_s": float(a), "prefix_hit_rate": float(h),
             "latency_within": bool(lo), "hit_within": bool(ho)}
            for p, a, h, lo, ho in zip(ps, lat, hit, lat_ok, hit_ok, strict=True)]
    rule = (f"largest page size with normalized latency <= {lat[i_lat]:.4g} s x (1 + {tol:g}) "
            f"and prefix hit rate >= {hit[i_hit]:.4g} x (1 - {tol:g})")
    return PageSizeRecommendation(
        page_size=chosen, tolerance=tol, best_latency_s=float(lat[i_lat]),
        best_latency_page_size=int(ps[i_lat]), best_hit_rate=float(hit[i_hit]),
        best_hit_page_size=int(ps[i_hit]), within_tolerance=bool(ok.any()), rule=rule, rows=rows)
