"""vLLM's KV cache groups of a model, and the prefix hit each kind of group accepts.

A model whose layers are all full attention is one KV cache group of `num_pages` blocks
(`full_attention_groups`). A hybrid model's groups are sized here with the planner's own
functions (kvcore/model/hybrid_plan.py: `vllm_block_size`, `vllm_kinds`, `vllm_group_size`,
`vllm_plan`), so what `kvsim plan` prints and what the simulation allocates are the same
blocks. The `vllm` manager (kvcore/vllm/manager.py) builds one group rule per group
(kvcore/vllm/group_rules.py) from these specs.

Rules followed, and the vLLM version of each (vllm/v1/core/, vllm/v1/kv_cache_interface.py):

* Grouping (v0.11 `kv_cache_utils.py`, with vllm #29303's 1.25 x case): layers of one spec
  (kind, window, chunk) form `cdiv(layers, group_size)` KV cache groups of `group_size` layers;
  every group has the same page in bytes; all draw block ids from one pool of
  `budget // (page x group_size)` blocks. A block id is one page in each layer of its group.
* Block size (v0.11 `HybridAttentionMambaModelConfig.verify_and_update_config`; the same
  rule and log line since moved to vllm/platforms/interface.py by vllm #37467): attention +
  state layers raise the attention block until one attention page holds a state page; a
  requested block size below that is raised, not refused ("override attention block size if
  either (a) the user has not set it or (b) the user has set it too small"; it logs "Setting
  attention block size to N tokens"), one above it is kept. Attention kinds whose bytes per
  token differ would get different block sizes in vLLM (`unify_kv_cache_spec_page_size`);
  this model keeps one block size and refuses such a layout with a one-line error.
* Hits (`HybridKVCacheCoordinator.find_longest_cache_hit`, main of 2026-Q2, after vllm #46453;
  the fixed point dates from v0.10.2): full attention first, scanned from the left once; every
  other kind asked for the longest hit it accepts up to the current candidate; the candidate
  shrinks to the smallest answer and the round repeats until no kind shrinks it (one round
  when there are exactly two kinds and one is full attention). Per kind
  (`single_type_kv_cache_manager.py`):
  - full attention: the cached blocks from block 0 up to the first miss;
  - sliding window W: from the right, the first run of `cdiv(W - 1, block)` consecutive
    cached blocks (the blocks before it are not needed); without such a run, the run of
    cached blocks starting at block 0;
  - chunked local attention C: the blocks before the candidate's chunk start are not needed;
    from there, cached blocks up to the first miss (a chunk that divides by the block size);
  - Mamba / linear attention (`MambaManager`, modes `align` and `all`): from the right, the
    first cached state block; a hit at its end.
  Hits are whole blocks: a prompt shorter than one block + 1 token gets 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.contract.validation import cdiv
from kvcore.model.hybrid_plan import (
    HybridPlan,
    vllm_block_size,
    vllm_kinds,
    vllm_plan,
)
from kvcore.model.layers import CHUNKED, FULL, SLIDING, HybridLayout
from kvcore.model.vllm_rules import VllmRules

# vLLM's Mamba prefix-cache modes (vllm/config/cache.py `MambaCacheMode`, kvcore.model.vllm_rules):
# "none" keeps one state block per request and caches nothing (prefix caching off); "align"
# keeps the state at block boundaries where a scheduler step ends (the scheduler cuts prefill
# chunks there); "all" keeps the state at every block boundary. Which one a run uses when
# none is given is the version's rule (`VllmRules.mamba_cache_mode`), resolved by the run
# into `PolicyConfig.mamba_cache_mode`.

#: the pool kinds reported per kind (`PoolUsage.kind`)
POOL_KIND = {FULL: "full", SLIDING: "swa", CHUNKED: "chunked", "linear": "mamba",
             "mamba": "mamba"}

#: per block position, whether every group of a spec holds it cached (positions past the
#: end: not cached)
Cached = np.ndarray


@dataclass(frozen=True)
class GroupSpec:
    """The KV cache groups of one spec: its kind, window / chunk, the layers of that kind
    and how many groups of `group_size` layers hold them."""

    kind: str
    window: int
    chunk: int
    layers: int
    count: int

    @property
    def is_state(self) -> bool:
        return self.kind in ("linear", "mamba")

    @property
    def pool_kind(self) -> str:
        return POOL_KIND[self.kind]

    def skipped_tokens(self, computed: int) -> int:
        """Tokens whose KV the next token no longer needs (vLLM `get_num_skipped_tokens`):
        none for full attention, those before the window for a sliding window (the next
        token attends to the last W - 1 and itself), those before the current chunk for
        chunked local attention, all but the last for a state (its block holds the state
        after the last token)."""
        if self.kind == FULL or computed <= 0:
            return 0
        if self.kind == SLIDING:
            return max(computed - self.window + 1, 0)
        if self.kind == CHUNKED:
            return computed // self.chunk * self.chunk
        return computed - 1

    def first_skipping(self, tokens: int) -> int:
        """The fewest computed tokens at which `skipped_tokens` reaches `tokens` (>= 1): the
        written count at which a decode step frees the block ending there (the inverse the
        decode stretch plans with). Full attention never skips: ValueError."""
        if tokens < 1:
            raise ValueError(f"first_skipping needs tokens >= 1, got {tokens}")
        if self.kind == FULL:
            raise ValueError("full attention skips no tokens")
        if self.kind == SLIDING:
            return tokens + self.window - 1
        if self.kind == CHUNKED:
            return cdiv(tokens, self.chunk) * self.chunk
        return tokens + 1


@dataclass(frozen=True)
class KVCacheGroups:
    """vLLM's layout of a model's KV memory on one rank: the block size, one layer's page in
    bytes, layers per group, the shared pool's blocks and the specs (full attention first),
    with the planner's `HybridPlan` it was read from (None for a full-attention model sized
    in slots)."""

    block_size: int
    page_bytes: int
    group_size: int
    num_blocks: int
    specs: tuple[GroupSpec, ...]
    plan: HybridPlan | None = None

    @property
    def num_groups(self) -> int:
        return sum(s.count for s in self.specs)

    @property
    def block_bytes(self) -> int:
        """Bytes one block id stands for: one page in each layer of its group."""
        return self.page_bytes * self.group_size

    def group_ids(self) -> list[list[int]]:
        """Per spec, the ids of its KV cache groups (consecutive, in spec order)."""
        out, at = [], 0
        for s in self.specs:
            out.append(list(range(at, at + s.count)))
            at += s.count
        return out


def _order(kind: str) -> int:
    return {FULL: 0, SLIDING: 1, CHUNKED: 2}.get(kind, 3)


def full_attention_groups(num_blocks: int, block_size: int) -> KVCacheGroups:
    """A model whose layers are all full attention: one KV cache group of `num_blocks`
    blocks (kvsim's `--kv-tokens` // page size; a block is one page in every layer)."""
    return KVCacheGroups(block_size, 0, 1, num_blocks, (GroupSpec(FULL, 0, 0, 1, 1),))


def vllm_groups(layout: HybridLayout, kv_bytes: int, context_len: int, *,
                kv_dtype: str = "bf16", tp: int = 1,
                block_size: int | None = None, rules: VllmRules | None = None,
                mamba_cache_mode: str = "align") -> KVCacheGroups:
    """The KV cache groups vLLM builds for `layout` with a budget of `kv_bytes` on one rank,
    under the version's `rules` in `mamba_cache_mode`, sized by the planner (`vllm_plan`), so
    both agree block for block."""
    if kv_bytes <= 0:
        raise ValueError(f"kv_bytes must be > 0 for a hybrid layout, got {kv_bytes}")
    mode = mamba_cache_mode if layout.state_groups() else None
    rule = vllm_block_size(layout, kv_dtype, tp, block_size, rules=rules,
                           mamba_cache_mode=mode or "none")
    bs, page = rule.block_size, rule.attn_page_bytes
    for g in layout.attention_groups():
        per_token = g.kv_bytes_per_token_layer(kv_dtype, tp)
        if per_token * bs != page:
            raise ValueError(f"{g.label}: {per_token} B per token and layer differs from the "
                             f"largest attention kind's {page // bs} B; one block size per "
                             "model is modelled")
        if g.kind == CHUNKED and g.chunk % bs:
            raise ValueError(f"{g.label}: the chunk of {g.chunk} tokens does not divide by "
                             f"the block size {bs}")
    plan = vllm_plan(layout, kv_bytes, context_len, kv_dtype=kv_dtype, tp=tp, block_size=bs,
                     rules=rules, mamba_cache_mode=mode)
    kinds = vllm_kinds(layout)
    group_size = plan.block_bytes // page
    num_blocks = int(kv_bytes // (page * group_size))
    if any(p.pages != num_blocks for p in plan.pools) or plan.block_size != bs:
        raise AssertionError("vllm_groups disagrees with vllm_plan")  # pragma: no cover
    if num_blocks < 1:
        raise ValueError(f"kv_bytes = {kv_bytes} holds no block of {page * group_size} B")
    specs = tuple(sorted((GroupSpec(g.kind, g.window, g.chunk, g.layers,
                                    cdiv(g.layers, group_size)) for g in kinds.values()),
                         key=lambda s: _order(s.kind)))
    return KVCacheGroups(bs, page, group_size, num_blocks, specs, plan)


# -- the hit each kind accepts -----------------------------------------------------------------
# Each finder reads `cached` (bool per block position) up to `max_len` tokens and returns (hit
# tokens, first block the hit needs): the blocks the request takes are those from that index
# to hit // block_size; the blocks before it are not needed.


def full_hit(cached: Cached, max_len: int, bs: int) -> tuple[int, int]:
    """Full attention: cached blocks from block 0 up to the first miss."""
    seg = cached[: max_len // bs]
    return (len(seg) if seg.all() else int(seg.argmin())) * bs, 0


def sliding_hit(cached: Cached, max_len: int, bs: int, window: int) -> tuple[int, int]:
    """Sliding window: from the right, the first run of cdiv(window - 1, bs) cached blocks
    (at least one); without one, the run of cached blocks from block 0."""
    need = max(cdiv(window - 1, bs), 1)
    seg = cached[: max_len // bs]
    if len(seg) >= need:
        ends = np.concatenate([[0], np.cumsum(seg)])
        full = np.flatnonzero(ends[need:] - ends[: len(seg) - need + 1] == need)
        if len(full):
            i = int(full[-1])
            return (i + need) * bs, i
    return (len(seg) if seg.all() else int(seg.argmin())) * bs, 0


def chunked_hit(cached: Cached, max_len: int, bs: int, chunk: int) -> tuple[int, int]:
    """Chunked local attention: blocks before the candidate's chunk start are not needed;
    from there, cached blocks up to the first miss."""
    first = max_len // chunk * chunk // bs
    seg = cached[first : max_len // bs]
    return (first + (len(seg) if seg.all() else int(seg.argmin()))) * bs, first


def state_hit(cached: Cached, max_len: int, bs: int) -> tuple[int, int]:
    """Mamba / linear attention: from the right, the first cached state block."""
    held = np.flatnonzero(cached[: max_len // bs])
    if not len(held):
        return 0, 0
    i = int(held[-1])
    return (i + 1) * bs, i


def spec_hit(spec: GroupSpec, cached: Cached, max_len: int, bs: int) -> tuple[int, int]:
    """The finder of `spec`'s kind."""
    if spec.kind == FULL:
        return full_hit(cached, max_len, bs)
    if spec.kind == SLIDING:
        return sliding_hit(cached, max_len, bs, spec.window)
    if spec.kind == CHUNKED:
        return chunked_hit(cached, max_len, bs, spec.chunk)
    return state_hit(cached, max_len, bs)


def longest_hit(specs: tuple[GroupSpec, ...], cached: list[Cached], max_len: int,
                bs: int) -> tuple[int, list[int]]:
    """The hit all specs accept, by vLLM's fixed point (module notes): (hit tokens, per spec
    the first block it needs)."""
    hit = max_len
    first = [0] * len(specs)
    full_len = -1
    simple = len(specs) == 2 and specs[0].kind == FULL
    while True:
        curr = hit
        for k, spec in enumerate(specs):
            if spec.kind == FULL and full_len >= 0:
                curr = min(curr, full_len)
                continue
            got, first[k] = spec_hit(spec, cached[k], curr, bs)
            if spec.kind == FULL:
                full_len = got
            curr = got
        if curr >= hit:
            break
        hit = curr
        if simple:
            break
    return hit, first


__all__ = ["POOL_KIND", "GroupSpec", "KVCacheGroups", "chunked_hit", "full_attention_groups",
           "full_hit", "longest_hit", "sliding_hit", "spec_hit", "state_hit", "vllm_groups"]
