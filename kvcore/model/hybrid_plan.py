"""How vLLM and SGLang lay out the KV memory of a hybrid model, from a per-rank KV budget.

vLLM: the rules change with the version and are data (kvcore.model.vllm_rules, each with its file
and version); the functions here apply one version's `VllmRules`
(vllm/v1/core/kv_cache_utils.py, vllm/v1/kv_cache_interface.py, vllm/model_executor/models/
config.py, vllm/platforms/interface.py):

* attention + Mamba / linear attention: the attention block size is raised to
  `a * cdiv(mamba_page, a * attn_page_1_token)` (a: the block alignment of the version)
  unless the user's block size is already larger, or, in mamba cache mode "all", to a
  multiple of lcm(mamba chunk, a) holding one state page; then the Mamba page (one layer's
  conv + recurrent state) is padded to the attention page ("Padding mamba page size by X%");
* layers are grouped by kind into KV cache groups of `group_size` layers (the smallest kind's
  count, or the largest when it is under the version's ratio x the smallest), padding the
  last group of a kind and warning "Add N padding layers, may waste at most X% KV cache
  memory" with X = N / that kind's layers; every group has the same page size in bytes and
  all draw block ids from one pool of `num_blocks = budget // (page_bytes * group_size)`
  blocks;
* "Maximum concurrency for L tokens per request: X" = num_blocks / (sum over groups of one
  request's worst-case pages): cdiv(L, block) for full attention, cdiv(min(window - 1 +
  max_num_batched_tokens, L), block) + 1 for a sliding window, cdiv(min(chunk +
  max_num_batched_tokens, L), block) for chunked local attention, and the state pages of the
  mamba cache mode for a Mamba group (`VllmRules.state_pages`);
* "GPU KV cache size: N tokens": num_blocks // groups x the smallest group block size up to
  v0.20.0 (a state group's block is max_model_len in mode none), int(X x L) from v0.20.1.

SGLang (v0.5; python/sglang/srt/model_executor/model_runner.py and pool_configurator.py):

* sliding window (and chunked local, which SGLang serves through the same SWA pool): with
  r = --swa-full-tokens-ratio (0.8), full_tokens = budget // (full bytes/token + r x SWA
  bytes/token), swa_tokens = r x full_tokens;
* Mamba / linear attention: a state pool of budget x m / (1 + m) bytes, m =
  --mamba-full-memory-ratio (0.9), or --max-mamba-cache-size slots; the rest is full-attention
  KV; the running-request cap is the state slots over `MAMBA_SLOTS_PER_REQUEST` (3 with the
  radix cache: a running request's slot, the state it forks when its prefix is cached and
  one in flight; 1 without the cache).

State dtypes are the layout's (kvcore.model.state_dtypes resolves them per engine before these
functions run); the KV dtype sizes attention only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from math import lcm
from typing import Any

from kvcore.contract.validation import cdiv
from kvcore.model.layers import CHUNKED, FULL, KIND_LABELS, SLIDING, HybridLayout, LayerGroup
from kvcore.model.vllm_rules import VllmRules, vllm_rules

#: the smallest kernel block of the attention backends (FlashAttention, FlashInfer) on
#: non-MLA models: HybridAttentionMambaModelConfig's kernel_block_alignment_size (v0.11 -
#: v0.19), the backends' get_supported_kernel_block_sizes minimum from v0.20
VLLM_BLOCK_ALIGNMENT = 16
#: vLLM ModelConfig.get_mamba_chunk_size: config `mamba_chunk_size`, else `chunk_size`, else
#: 2048 (Mamba-1 has no chunk)
VLLM_DEFAULT_MAMBA_CHUNK = 2048
VLLM_DEFAULT_BLOCK_SIZE = 16  # vLLM CacheConfig.DEFAULT_BLOCK_SIZE
# vLLM v0.11 EngineArgs usage-context default of max_num_batched_tokens for `vllm serve` on a
# GPU with >= 70 GiB (H100 / H200 class); it sizes the sliding-window worst case.
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8  # sglang server_args.py --swa-full-tokens-ratio default
#: state slots per running request with the radix cache (SGLang v0.5
#: MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, no_buffer strategy); 1 without the cache
MAMBA_SLOTS_PER_REQUEST = 3
SGLANG_MAMBA_FULL_MEMORY_RATIO = 0.9  # sglang server_args.py --mamba-full-memory-ratio default


@dataclass(frozen=True)
class BlockSizeRule:
    """vLLM's block size for a hybrid: the attention block, one attention page and one Mamba
    page (before padding), and the padding that makes them equal (0 without state layers)."""

    block_size: int
    attn_page_bytes: int
    mamba_page_bytes: int
    padding_pct: float
    raised: bool  # vLLM logs "Setting attention block size to N tokens ..."


def vllm_block_size(layout: HybridLayout, kv_dtype: str = "bf16", tp: int = 1,
                    requested: int | None = None,
                    alignment: int = VLLM_BLOCK_ALIGNMENT, *, rules: VllmRules | None = None,
                    mamba_cache_mode: str = "none") -> BlockSizeRule:
    """The attention block size vLLM picks (see the module notes) under `rules` (default:
    the default version's) in `mamba_cache_mode`."""
    rules = rules or vllm_rules()
    attn = layout.attention_groups()
    base = requested or VLLM_DEFAULT_BLOCK_SIZE
    if not attn:
        raise ValueError("the layout has no attention layer to size blocks for")
    per_token = max(g.kv_bytes_per_token_layer(kv_dtype, tp) for g in attn)
    states = layout.state_groups()
    if not states:
        return BlockSizeRule(base, base * per_token, 0, 0.0, False)
    mamba = max(g.state_bytes_layer(kv_dtype, tp, layout.model_dtype) for g in states)
    align = alignment if rules.block_alignment == "fixed" else max(alignment, base)
    if mamba_cache_mode == "all" and layout.mamba2:  # Mamba-2 SSD chunks (vLLM's "all")
        chunk = max(g.mamba_chunk_size for g in states) or VLLM_DEFAULT_MAMBA_CHUNK
        step = lcm(chunk, align)
        needed = step * cdiv(cdiv(mamba, per_token), step)
    else:
        needed = align * cdiv(mamba, align * per_token)
    raised = requested is None or requested < needed
    bs = needed if raised else base
    page = bs * per_token
    return BlockSizeRule(bs, page, mamba, 100.0 * (page - mamba) / mamba, raised)


@dataclass(frozen=True)
class Pool:
    """One pool or KV cache group: its kind, layers, page bytes (one layer), pages, tokens."""

    kind: str
    layers: int
    page_bytes: int
    pages: int
    tokens: int
    note: str = ""


@dataclass
class HybridPlan:
    """What the engine prints at start-up for a hybrid model, and the full-attention
    baseline (every layer stored as full attention). `to_dict()` is the JSON form."""

    engine: str
    block_size: int
    kv_cache_tokens: int
    max_concurrency: float
    context_len: int
    pools: list[Pool]
    baseline_tokens: int
    baseline_max_concurrency: float
    running_request_cap: int | None = None  # SGLang: min(state slots, limit)
    log: list[str] = field(default_factory=list)
    # vLLM only: the version whose rules were applied, the mamba cache mode and prefix
    # caching they resolved to, the shared pool's blocks and one block id's bytes, and the
    # source of each rule (kvcore.model.vllm_rules)
    vllm_version: str = ""
    mamba_cache_mode: str = ""
    prefix_caching: bool | None = None
    num_blocks: int = 0
    block_bytes: int = 0
    rules: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _spec_key(g: LayerGroup) -> tuple[str, int, int]:
    return (g.kind, g.window, g.chunk)


def vllm_kinds(layout: HybridLayout) -> dict[tuple[str, int, int], LayerGroup]:
    """One layer spec per kind (window / chunk distinguish specs), its layers summed."""
    kinds: dict[tuple[str, int, int], LayerGroup] = {}
    for g in layout.groups:
        k = _spec_key(g)
        kinds[k] = g if k not in kinds else LayerGroup(**{**asdict(g), "layers":
                                                           kinds[k].layers + g.layers})
    return kinds


def vllm_group_size(counts: list[int], ratio: float = 1.5) -> int:
    """Layers per KV cache group: the smallest kind's count, or the largest when it is under
    `ratio` x the smallest (the version's `VllmRules.group_ratio`; see the module notes)."""
    group_size = min(counts)
    return max(counts) if max(counts) < group_size * ratio else group_size


def _worst_case_pages(g: LayerGroup, bs: int, ctx: int, batched: int, rules: VllmRules,
                      mode: str, spec: int) -> int:
    """Pages one request of `ctx` tokens may need in one group (vLLM max_memory_usage_bytes)."""
    if g.is_state:
        return rules.state_pages(mode, ctx, bs, spec)
    if g.kind == SLIDING:
        return cdiv(min(g.window - 1 + batched, ctx), bs) + 1
    if g.kind == CHUNKED:
        return cdiv(min(g.chunk + batched, ctx), bs)
    return cdiv(ctx, bs)


def vllm_plan(layout: HybridLayout, budget_bytes: float, context_len: int, *,
              kv_dtype: str = "bf16", tp: int = 1, block_size: int | None = None,
              max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS,
              rules: VllmRules | None = None, mamba_cache_mode: str | None = None,
              prefix_caching: bool | None = None, speculative_tokens: int = 0) -> HybridPlan:
    """vLLM's KV cache groups, block count and start-up figures for a per-rank budget, under
    `rules` (default: the default version's). The mamba cache mode is `mamba_cache_mode`,
    else what the version picks with `prefix_caching` (None: its default for hybrids)."""
    rules = rules or vllm_rules()
    mode = rules.mamba_cache_mode(layout.mamba2, prefix_caching, speculative_tokens,
                                  mamba_cache_mode) if layout.state_groups() else "none"
    on = rules.hybrid_prefix_caching if prefix_caching is None else prefix_caching
    rule = vllm_block_size(layout, kv_dtype, tp, block_size, rules=rules,
                           mamba_cache_mode=mode)
    bs, page = rule.block_size, rule.attn_page_bytes
    log = []
    if rule.raised and layout.state_groups():
        log.append(f"Setting attention block size to {bs} tokens to ensure that attention "
                   "page size is >= mamba page size.")
    if rule.padding_pct:
        log.append(f"Padding mamba page size by {rule.padding_pct:.2f}% to ensure that mamba "
                   "page size and attention page size are exactly equal.")
    kinds = vllm_kinds(layout)
    counts = [g.layers for g in kinds.values()]
    group_size = vllm_group_size(counts, rules.group_ratio)
    for n in counts:  # vLLM warns per kind: padding / that kind's layers
        padding = cdiv(n, group_size) * group_size - n
        if padding:
            log.append(f"Add {padding} padding layers, may waste at most "
                       f"{100.0 * padding / n:.2f}% KV cache memory")
    num_blocks = int(budget_bytes // (page * group_size))
    n_groups = sum(cdiv(n, group_size) for n in counts)
    block_sizes = []
    pools = []
    worst = 0
    for g in kinds.values():
        # an attention kind with fewer bytes per token gets a larger block, one page in bytes
        # (vLLM unify_kv_cache_spec_page_size); a state kind's page is one request's state
        gbs = bs if g.is_state else page // g.kv_bytes_per_token_layer(kv_dtype, tp)
        if not g.is_state and gbs * g.kv_bytes_per_token_layer(kv_dtype, tp) != page:
            raise ValueError(f"{g.label}: its page does not divide the largest attention page")
        # a state group's block: max_model_len in mode none (one state per request), the
        # attention block otherwise (vLLM MambaModelConfig mamba_block_size)
        block_sizes.append(context_len if g.is_state and mode == "none" else gbs)
        worst += cdiv(g.layers, group_size) * _worst_case_pages(
            g, gbs, context_len, max_num_batched_tokens, rules, mode, speculative_tokens)
        pools.append(Pool(g.kind, g.layers, page, num_blocks,
                          0 if g.is_state else num_blocks * gbs,
                          note=f"{cdiv(g.layers, group_size)} group(s) of {group_size}"))
    conc = num_blocks / worst
    if rules.token_formula == "blocks":
        tokens = num_blocks // n_groups * min(block_sizes)
    else:
        tokens = int(conc * context_len)
    log.append(f"GPU KV cache size: {tokens:,} tokens")
    log.append(f"Maximum concurrency for {context_len:,} tokens per request: {conc:.2f}x")
    base_tokens, base_conc = _baseline(layout, budget_bytes, context_len, kv_dtype, tp,
                                       VLLM_DEFAULT_BLOCK_SIZE)
    return HybridPlan("vllm", bs, tokens, conc, context_len, pools, base_tokens, base_conc,
                      None, log, vllm_version=rules.version, mamba_cache_mode=mode,
                      prefix_caching=on, num_blocks=num_blocks, block_bytes=page * group_size,
                      rules=dict(rules.sources))


def _baseline(layout: HybridLayout, budget: float, ctx: int, kv_dtype: str, tp: int,
              page: int) -> tuple[int, float]:
    """Tokens and requests of `ctx` tokens if every layer were stored as full attention."""
    per_token = max(g.kv_bytes_per_token_layer(kv_dtype, tp) for g in layout.attention_groups())
    pages = int(budget // (page * per_token * layout.num_layers))
    return pages * page, pages / cdiv(ctx, page)


def sglang_plan(layout: HybridLayout, budget_bytes: float, context_len: int, *,
                kv_dtype: str = "bf16", tp: int = 1, page_size: int = 1,
                max_running_requests: int | None = None,
                swa_full_tokens_ratio: float = SGLANG_SWA_FULL_TOKENS_RATIO,
                mamba_full_memory_ratio: float = SGLANG_MAMBA_FULL_MEMORY_RATIO,
                max_mamba_cache_size: int | None = None,
                radix_cache: bool = True) -> HybridPlan:
    """SGLang's full / SWA / state pools for a per-rank budget (see the module notes);
    `radix_cache` False: SGLang's chunk cache (one state slot per running request)."""
    if not 0 < swa_full_tokens_ratio <= 1:
        raise ValueError(f"swa_full_tokens_ratio must be in (0, 1], got {swa_full_tokens_ratio}")
    if mamba_full_memory_ratio <= 0:
        raise ValueError(f"mamba_full_memory_ratio must be > 0, got {mamba_full_memory_ratio}")
    full_bpt = sum(g.kv_bytes_per_token(kv_dtype, tp) for g in layout.groups if g.kind == FULL)
    swa_bpt = sum(g.kv_bytes_per_token(kv_dtype, tp) for g in layout.groups
                  if g.kind in (SLIDING, CHUNKED))
    state = layout.state_bytes_per_request(kv_dtype, tp)  # the layout's state dtypes
    pools: list[Pool] = []
    log: list[str] = []
    budget = float(budget_bytes)
    slots = None
    if state:
        if max_mamba_cache_size is not None:
            slots = int(max_mamba_cache_size)
        else:
            slots = int(budget * mamba_full_memory_ratio / (1 + mamba_full_memory_ratio)
                        // state)
        budget -= slots * state
        if budget <= 0:
            raise ValueError(f"{slots} state slots of {state:,} B leave no memory for KV")
        for g in layout.state_groups():
            pools.append(Pool(g.kind, g.layers,
                              g.state_bytes_layer(kv_dtype, tp, layout.model_dtype), slots, 0,
                              note="state slots"))
        log.append(f"mamba state: {slots:,} slots x {state:,} B")
    cell = full_bpt + swa_full_tokens_ratio * swa_bpt
    full_tokens = int(budget // cell) // page_size * page_size
    swa_tokens = int(full_tokens * swa_full_tokens_ratio) // page_size * page_size
    for g in layout.attention_groups():
        t = full_tokens if g.kind == FULL else swa_tokens
        pools.append(Pool(g.kind, g.layers, page_size * g.kv_bytes_per_token_layer(kv_dtype, tp),
                          t // page_size, t))
    log.append(f"max_total_num_tokens={full_tokens}" + (
        f", full_max_total_num_tokens={full_tokens}, swa_max_total_num_tokens={swa_tokens}"
        if swa_bpt else ""))
    per_req_full = context_len if full_bpt else 0
    caps = []
    if per_req_full:
        caps.append(full_tokens / per_req_full)
    for g in layout.attention_groups():
        if g.kind != FULL:
            caps.append(swa_tokens / min(context_len, (g.window or g.chunk) + page_size))
    state_cap = None if slots is None else slots // (MAMBA_SLOTS_PER_REQUEST if radix_cache
                                                     else 1)
    if state_cap is not None:
        caps.append(float(state_cap))
    conc = min(caps) if caps else 0.0
    cap = state_cap if max_running_requests is None else (
        max_running_requests if state_cap is None else min(state_cap, max_running_requests))
    base_tokens, base_conc = _baseline(layout, budget_bytes, context_len, kv_dtype, tp,
                                       page_size)
    return HybridPlan("sglang", page_size, full_tokens, conc, context_len, pools, base_tokens,
                      base_conc, cap, log)


def kv_waste_as_full(layout: HybridLayout, context_len: int, kv_dtype: str = "bf16") -> float:
    """Share of KV memory wasted at `context_len` when every attention layer is stored as full
    attention (vLLM RFC #11382's figure): 1 - (bytes the layout needs) / (bytes as full)."""
    need = sum(g.bytes_for_length(context_len, kv_dtype) for g in layout.attention_groups())
    full = sum(context_len * g.kv_bytes_per_token(kv_dtype) for g in layout.attention_groups())
    return 1.0 - need / full


__all__ = ["KIND_LABELS", "MAMBA_SLOTS_PER_REQUEST", "BlockSizeRule", "HybridPlan", "Pool",
           "kv_waste_as_full",
           "sglang_plan", "vllm_block_size", "vllm_group_size", "vllm_kinds", "vllm_plan"]
