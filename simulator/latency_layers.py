"""What one iteration's attention costs per layer kind of a hybrid model (the roofline's
attention terms; simulator/latency.py adds weights, overheads and all-reduces).

The cost model is the roofline's own: an attention layer reads the KV it attends to and
does 2 x heads x (qk + v) FLOPs per (query, key) pair (FlashAttention's count, Dao 2022,
arXiv 2205.14135 section 3), so a kind's cost follows the keys each query attends:

* full attention: every earlier token (key position 1..p for the query at p);
* sliding window W: the last W (min(p, W)) - the window mask of Mistral / Gemma kernels;
* chunked local C: the tokens of its own chunk ((p - 1) mod C + 1), Llama 4's iRoPE chunks;
* linear attention (gated delta net) and Mamba-2: no keys at all. Each request's step reads
  and writes its fixed state once per iteration (conv state + recurrent state, the bytes
  kvcore.model.layers gives), and every token updates the recurrent state: Mamba-2's
  h_t = a_t h_{t-1} + B_t x_t, y_t = C_t h_t (Dao & Gu 2024, arXiv 2405.21060 eq. (1)) is
  5 FLOPs per state element and token (decay 1, input 2, readout 2); the gated delta rule
  S_t = S_{t-1} a_t (I - b_t k_t k_t^T) + b_t v_t k_t^T, o_t = S_t q_t (Yang et al. 2024,
  arXiv 2412.06464 eq. (6)) is 7 (decay 1, S k 2, rank-1 update 2, readout 2); the conv is
  2 x kernel FLOPs per channel and token. The chunked scan's intra-chunk term in prefill is
  left out (a constant per token, under the weights' FLOPs at any batch).

Each kind's pairs, KV read and pages are integers, summed over the kinds with their own
per-layer constants, so a sliding window at least as long as every request costs exactly
what full attention costs (tests/simulator/test_latency_layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.model.layers import CHUNKED, FULL, LINEAR, SLIDING, HybridLayout, LayerGroup
from kvcore.model.presets import ModelPreset

#: FLOPs per recurrent-state element per token (see the module notes)
STATE_FLOPS_PER_ELEMENT = {LINEAR: 7, "mamba": 5}


def _prefix_pairs(kind: str, span: int, x: np.ndarray) -> np.ndarray:
    """Sum over query positions p = 1..x of the keys each attends (x >= 0, int64)."""
    if kind == FULL:
        return x * (x + 1) // 2
    if kind == SLIDING:
        w = np.minimum(x, span)
        return w * (w + 1) // 2 + (x - w) * span
    q, r = x // span, x % span  # CHUNKED: q whole chunks of span (span + 1) / 2, then r
    return q * (span * (span + 1) // 2) + r * (r + 1) // 2


def _keys(kind: str, span: int, p: np.ndarray) -> np.ndarray:
    """Keys the query at position p (>= 1) attends."""
    if kind == FULL:
        return p
    if kind == SLIDING:
        return np.minimum(p, span)
    return (p - 1) % span + 1


@dataclass(frozen=True)
class KindCost:
    """One attention group's per-layer-sum constants: FLOPs per (query, key) pair over its
    layers, KV bytes per token over its layers on one rank, page cost over its layers."""

    kind: str
    span: int  # window or chunk (0 for full)
    flop_pair: float
    kv_tok: float
    page: float


@dataclass(frozen=True)
class IterationTerms:
    """One iteration's attention terms summed over the kinds: FLOPs, KV bytes moved (read
    and written), page cost in seconds, and the state layers' FLOPs and bytes."""

    flops: float
    kv_bytes: float
    page_s: float


class LayerCosts:
    """The attention terms of a hybrid layout on one tensor-parallel rank."""

    def __init__(self, layout: HybridLayout, model: ModelPreset, kv_dtype: str, tp: int,
                 page_head_overhead_s: float) -> None:
        heads = model.num_heads / tp
        self.kinds: list[KindCost] = []
        for g in layout.attention_groups():
            span = g.window if g.kind == SLIDING else g.chunk if g.kind == CHUNKED else 0
            kv_heads = max(1, g.kv_heads // tp)
            self.kinds.append(KindCost(
                g.kind, span, 2.0 * heads * (2 * g.head_dim) * g.layers,
                float(g.kv_bytes_per_token(kv_dtype, tp)),
                page_head_overhead_s * kv_heads * g.layers))
        states = layout.state_groups()
        # read and write of each request's state, every iteration it runs in
        self.state_rw = float(2 * sum(g.state_bytes_per_request(kv_dtype, tp) for g in states))
        self.state_flop_tok = float(sum(_state_flops(g, tp) for g in states))

    def terms(self, new: np.ndarray, before: np.ndarray, decode: np.ndarray, page_size: int,
              prefill_pages: bool, prefill_factor: float) -> IterationTerms:
        """Attention FLOPs, KV bytes and page seconds of an iteration: `new` tokens after
        `before` per prefilling request, one token at context `decode` per decoding one
        (the new token included, as RooflineLatency counts it)."""
        tokens = int(new.sum()) + decode.size
        flops = bytes_ = page_s = 0.0
        for k in self.kinds:
            pre = int((_prefix_pairs(k.kind, k.span, before + new)
                       - _prefix_pairs(k.kind, k.span, before)).sum()) if new.size else 0
            held = _keys(k.kind, k.span, decode) if decode.size else decode
            dec = int(held.sum())
            # the keys before the first new token that its query sees: read from the cache
            seen = (_keys(k.kind, k.span, before + 1) - 1) if new.size else before
            read = int(seen.sum()) + dec - decode.size
            pages = int((-(-held // page_size)).sum())
            if prefill_pages and new.size:
                pages += int((-(-(seen + new) // page_size)).sum())
            att = pre + dec if prefill_factor == 1.0 else pre * prefill_factor + dec
            flops += att * k.flop_pair
            bytes_ += (read + tokens) * k.kv_tok
            page_s += pages * k.page
        n_req = new.size + decode.size
        return IterationTerms(flops + tokens * self.state_flop_tok,
                              bytes_ + n_req * self.state_rw, page_s)


def _state_flops(g: LayerGroup, tp: int) -> float:
    """FLOPs per token of one state group on one rank: the recurrence over its state
    elements and the causal conv over its channels (see the module notes)."""
    conv, ssm = g.state_shapes(tp)
    per_layer = (STATE_FLOPS_PER_ELEMENT[g.kind] * ssm[0] * ssm[1] * ssm[2]
                 + 2 * g.conv_kernel * conv[1])
    return float(per_layer * g.layers)


__all__ = ["STATE_FLOPS_PER_ELEMENT", "IterationTerms", "KindCost", "LayerCosts"]
