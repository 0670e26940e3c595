"""The pools of a layout, sized from its `PolicyConfig`: what SGLang's manager
(kvcore/sglang/policy.py) runs on.

Full attention is the layout with no side pool: `kv_tokens // page_size` pages in one
`PagedAllocator`. A hybrid layout (`PolicyConfig.layout`) is sized by
`kvcore.model.hybrid_plan.sglang_plan` from the rank's KV budget (`PolicyConfig.kv_bytes`), so the
planner and the simulation agree: the full-attention pages and, with sliding-window (or chunked
local) layers, an SWA pool of `swa_full_tokens_ratio` x its tokens allocated with them
(kvcore/sglang/swa_pool.py, the `SlidingWindow` kind); with linear-attention / Mamba layers, a
state pool (kvcore/sglang/mamba_pool.py, the `MambaStates` kind) of `mamba_full_memory_ratio`
or `max_mamba_cache_size` slots.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcore.contract.policy import PolicyConfig
from kvcore.contract.validation import positive_int
from kvcore.model.hybrid_plan import HybridPlan, sglang_plan
from kvcore.model.layers import CHUNKED, FULL, SLIDING
from kvcore.sglang.allocator import PagedAllocator
from kvcore.sglang.mamba_pool import MambaPool
from kvcore.sglang.mamba_state import MambaStates
from kvcore.sglang.pool_kind import PoolKind
from kvcore.sglang.sliding_window import SlidingWindow
from kvcore.sglang.swa_pool import SWAPagePool

__all__ = ["LayoutPools", "layout_pools"]


@dataclass(frozen=True)
class LayoutPools:
    """`allocator`: the full-attention pages (an `SWAPagePool` with sliding-window layers);
    `kinds`: the side pools, deciding kinds before allocating ones (kvcore/sglang/pool_kind.py);
    `full_bytes_per_token`: the full-attention layers' KV bytes per token (0: full attention,
    which reports no pool kinds); `plan`: a hybrid layout's plan."""

    allocator: PagedAllocator
    kinds: tuple[PoolKind, ...] = ()
    full_bytes_per_token: int = 0
    plan: HybridPlan | None = None


def layout_pools(config: PolicyConfig, cache_enabled: bool) -> LayoutPools:
    """The pools of `config`'s layout (ValueError naming what cannot be built)."""
    ps = positive_int("page_size", config.page_size)
    if not config.is_hybrid:
        num_pages = config.kv_tokens // ps
        if num_pages < 1:
            raise ValueError(f"kv_tokens {config.kv_tokens} is smaller than one page of {ps} "
                             "tokens")
        return LayoutPools(PagedAllocator(num_pages, ps, config.device))
    layout = config.layout
    assert layout is not None  # is_hybrid
    if config.kv_bytes <= 0:
        raise ValueError(f"kv_bytes must be > 0 for a hybrid layout (the KV budget of one "
                         f"rank in bytes), got {config.kv_bytes}")
    plan = sglang_plan(
        layout, config.kv_bytes, config.max_context_len, kv_dtype=config.kv_dtype,
        page_size=ps, swa_full_tokens_ratio=config.swa_full_tokens_ratio,
        mamba_full_memory_ratio=config.mamba_full_memory_ratio,
        max_mamba_cache_size=config.max_mamba_cache_size or None)
    full_pages = plan.kv_cache_tokens // ps
    if full_pages < 1:
        raise ValueError(f"kv_bytes {config.kv_bytes:,} holds less than one page of "
                         f"{ps} full-attention tokens")
    dt = config.kv_dtype
    windowed = [g for g in layout.attention_groups() if g.kind in (SLIDING, CHUNKED)]
    kinds: list[PoolKind] = []
    allocator: PagedAllocator
    if windowed:
        swa_tokens = next((p.tokens for p in plan.pools if p.kind in (SLIDING, CHUNKED)), 0)
        if swa_tokens < ps:
            raise ValueError(f"the SWA pool ({swa_tokens} tokens) is smaller than one page")
        allocator = SWAPagePool(full_pages, swa_tokens // ps, ps, config.device)
        kinds.append(SlidingWindow(
            "swa" if any(g.kind == SLIDING for g in windowed) else "chunked",
            max(g.window or g.chunk for g in windowed), allocator,
            sum(g.kv_bytes_per_token(dt) for g in windowed)))
    else:
        allocator = PagedAllocator(full_pages, ps, config.device)
    state_bytes = layout.state_bytes_per_request(dt)
    if state_bytes:
        slots = next((p.pages for p in plan.pools if p.note == "state slots"), 0)
        kinds.append(MambaStates(MambaPool(slots, state_bytes, config.device, config.store_kv),
                                 ps, cache_enabled))
    full_bpt = sum(g.kv_bytes_per_token(dt) for g in layout.groups if g.kind == FULL)
    return LayoutPools(allocator, tuple(kinds), full_bpt, plan)
