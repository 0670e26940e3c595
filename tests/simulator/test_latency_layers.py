"""The roofline per layer kind (simulator/latency_layers.py): sliding-window layers priced over
the window, chunked local over the current chunk, linear attention / Mamba by their state read
and write. Numbers by hand; a window longer than every request costs exactly what full
attention costs. Cost: about 1.5 s (the hypothesis test draws 20 batches)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.model.hybrid_presets import LAYOUTS
from kvcore.model.layers import CHUNKED, FULL, SLIDING, HybridLayout, LayerGroup
from simulator.latency import make_latency_model
from simulator.latency_layers import LayerCosts, _prefix_pairs

P = 1.5e-9  # the roofline's default page_head_overhead_s


def _ints(*xs: int) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


def test_keys_each_query_attends_summed_by_hand() -> None:
    # window 4 over positions 1..10: 1, 2, 3, 4 then 4 six times = 10 + 24
    assert _prefix_pairs(SLIDING, 4, _ints(10))[0] == 34
    # chunks of 4 over positions 1..10: 1..4, 1..4, 1, 2 = 10 + 10 + 3
    assert _prefix_pairs(CHUNKED, 4, _ints(10))[0] == 23
    assert _prefix_pairs(FULL, 0, _ints(10))[0] == 55
    for kind, span in ((SLIDING, 4), (CHUNKED, 4), (FULL, 0)):
        assert _prefix_pairs(kind, span, _ints(0))[0] == 0


def test_gpt_oss_decode_reads_the_window_in_its_sliding_layers() -> None:
    # gpt-oss-20b: 12 sliding (window 128) + 12 full layers, 64 query heads, 8 KV heads x 64.
    costs = LayerCosts(LAYOUTS["gpt-oss-20b"], _model("gpt-oss-20b"), "bf16", 1, P)
    t = costs.terms(_ints(), _ints(), _ints(1000), 16, True, 1.0)
    flop_pair = 2 * 64 * (64 + 64) * 12  # one (query, key) pair over 12 layers
    assert t.flops == (128 + 1000) * flop_pair
    per_tok = 12 * 2 * 8 * 64 * 2  # KV bytes of one token over 12 layers
    assert t.kv_bytes == (127 + 1) * per_tok + (999 + 1) * per_tok
    # pages: cdiv(128, 16) = 8 in the window, cdiv(1000, 16) = 63 in full attention
    assert t.page_s == pytest.approx((8 + 63) * P * 8 * 12, rel=1e-12)


def test_chunked_prefill_reads_only_its_own_chunk() -> None:
    layout = HybridLayout((LayerGroup(CHUNKED, 1, kv_heads=1, head_dim=1, chunk=8),))
    costs = LayerCosts(layout, _model("llama-3.1-8b"), "bf16", 1, P)
    # 4 new tokens after 10: positions 11..14 attend 3, 4, 5, 6 keys of their chunk (9..16)
    t = costs.terms(_ints(4), _ints(10), _ints(), 1, True, 1.0)
    assert t.flops == (3 + 4 + 5 + 6) * 2 * 32 * 2
    # read: the 2 keys of the chunk before the first new token; written: 4; 1 layer x 4 B
    assert t.kv_bytes == (2 + 4) * 4
    assert t.page_s == pytest.approx((2 + 4) * P, rel=1e-12)


def test_state_layers_cost_their_state_whatever_the_context() -> None:
    # Qwen3.5-4B: 24 gated-delta-net layers, one request's state 51,511,296 B (docs/hybrid.md)
    costs = LayerCosts(LAYOUTS["qwen3.5-4b"], _model("qwen3.5-4b"), "bf16", 1, P)
    assert costs.state_rw == 2 * 51_511_296
    # per token and layer: 7 x 32 x 128 x 128 (the delta rule) + 2 x 4 x 8,192 (the conv)
    assert costs.state_flop_tok == 24 * (7 * 32 * 128 * 128 + 2 * 4 * 8192)
    short = costs.terms(_ints(), _ints(), _ints(10), 16, True, 1.0)
    long = costs.terms(_ints(), _ints(), _ints(100_000), 16, True, 1.0)
    full_tok = 8 * 2 * 4 * 256 * 2  # the 8 full layers' KV bytes per token
    assert long.kv_bytes - short.kv_bytes == (100_000 - 10) * full_tok
    assert short.kv_bytes == 10 * full_tok + 2 * 51_511_296


def test_a_hybrid_decodes_long_contexts_faster_than_all_full() -> None:
    full = make_latency_model("roofline", "qwen3.5-4b", "h100")
    hybrid = make_latency_model("roofline", "qwen3.5-4b", "h100",
                                layout=LAYOUTS["qwen3.5-4b"])
    ctx = [30_000] * 32
    assert hybrid.iteration_time([], ctx, 16) < full.iteration_time([], ctx, 16) / 2
    assert hybrid.describe()["layout"] == LAYOUTS["qwen3.5-4b"].mix
    assert "layout" not in full.describe()


def test_hybrid_decode_stretch_equals_stepping() -> None:
    lm = make_latency_model("roofline", "gpt-oss-20b", "h100", layout=LAYOUTS["gpt-oss-20b"])
    got = lm.decode_step_times([100, 127, 4000], 16, 5)
    want = [lm.iteration_time([], [100 + j, 127 + j, 4000 + j], 16) for j in range(5)]
    assert list(got) == want


# llama-3.1-8b's 32 layers split in two groups of 16: a window of 2^20 never slides
WIDE = HybridLayout((LayerGroup(SLIDING, 16, kv_heads=8, head_dim=128, window=1 << 20),
                     LayerGroup(FULL, 16, kv_heads=8, head_dim=128)))


@settings(max_examples=20, deadline=None)
@given(pre=st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 20_000)), max_size=3),
       dec=st.lists(st.integers(1, 60_000), max_size=6), ps=st.sampled_from([1, 16, 64]))
def test_a_window_longer_than_every_request_costs_exactly_full_attention(pre, dec, ps) -> None:
    full = make_latency_model("roofline", "llama-3.1-8b", "h100")
    wide = make_latency_model("roofline", "llama-3.1-8b", "h100", layout=WIDE)
    assert wide.iteration_time(pre, dec, ps) == full.iteration_time(pre, dec, ps)


def test_a_layout_of_full_layers_only_takes_the_full_attention_path() -> None:
    only_full = HybridLayout((LayerGroup(FULL, 32, kv_heads=8, head_dim=128),))
    lm = make_latency_model("roofline", "llama-3.1-8b", "h100", layout=only_full)
    assert lm._layers is None


def _model(name: str):
    from kvcore.model.presets import get_model

    return get_model(name)
