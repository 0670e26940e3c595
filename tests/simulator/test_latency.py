"""Latency models: monotonicity, page-size penalty, the constant model, the calibration point."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from simulator.latency import LATENCY_MODELS, make_latency_model

PAGE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@pytest.fixture
def opt13b():
    return make_latency_model("roofline", "opt-13b", "a100-40gb", tp=1, kv_dtype="fp16")


def sharegpt_like(n=30, seed=0):
    return np.random.default_rng(seed).integers(150, 501, n)


def test_registry_and_overrides():
    assert {"roofline", "constant"} <= set(LATENCY_MODELS)
    lm = make_latency_model("ROOFLINE", "llama-3.1-8b", "h100", mbu=0.9)
    assert lm.mbu == 0.9 and lm.describe()["latency_model"] == "roofline"
    with pytest.raises(ValueError, match="unknown roofline latency constant"):
        make_latency_model("roofline", "llama-3.1-8b", "h100", warp_speed=2.0)
    with pytest.raises(ValueError, match="unknown latency model"):
        make_latency_model("vidur", "llama-3.1-8b", "h100")
    with pytest.raises(ValueError, match="mbu"):
        make_latency_model("roofline", "llama-3.1-8b", "h100", mbu=1.5)


def test_calibration_point_vllm_fig13(opt13b):
    # ~30 running ShareGPT-like requests on OPT-13B / A100-40GB: ~45 ms per decode iteration
    for seed in range(3):
        t = opt13b.iteration_time([], sharegpt_like(seed=seed), page_size=16)
        assert 0.040 <= t <= 0.050


def test_monotonic_in_tokens_and_context(opt13b):
    ctx = sharegpt_like()
    base = opt13b.iteration_time([], ctx, 16)
    assert opt13b.iteration_time([], ctx + 100, 16) > base
    assert opt13b.iteration_time([], np.append(ctx, 300), 16) > base
    prev = 0.0
    for n in [1, 16, 128, 512, 2048, 8192]:
        t = opt13b.iteration_time([(n, 0)], ctx, 16)
        assert t > prev
        prev = t
    assert opt13b.iteration_time([(512, 1024)], [], 16) > opt13b.iteration_time([(512, 0)], [], 16)
    assert opt13b.iteration_time([], [], 16) == 0.0


@pytest.mark.parametrize("model", ["opt-13b", "llama-3.1-8b", "mixtral-8x7b", "deepseek-v3"])
def test_smaller_pages_never_faster(model):
    lm = make_latency_model("roofline", model, "h200", tp=8 if model == "deepseek-v3" else 1)
    ctx = sharegpt_like(64, seed=1)
    times = [lm.iteration_time([(300, 77)], ctx, ps) for ps in PAGE_SIZES]
    assert all(a >= b for a, b in itertools.pairwise(times))
    assert times[0] > times[4]  # page 1 strictly slower than 16
    swaps = [lm.swap_tokens_time(4096, ps) for ps in PAGE_SIZES]
    assert all(a >= b for a, b in itertools.pairwise(swaps))
    assert swaps[0] > 2 * swaps[4]


def test_page_term_counts_every_page_attended(opt13b):
    """The per-page cost (a page-table walk per KV head and layer) covers every page a request
    attends: for a prefill, the new tokens and the cached prefix before them. Counted apart
    from the model: between page sizes 1 and 16 only the page count changes (4,112 slots:
    4,112 pages vs 257), so the time differs by exactly that many page costs. 1 ms."""
    m = opt13b.model
    per_page = opt13b.page_head_overhead_s * m.kv_heads_per_rank(1) * m.num_layers
    assert per_page > 0
    for prefill, decode in (([(16, 4096)], []), ([], [4112]), ([(16, 4096)], [4112])):
        t1 = opt13b.iteration_time(prefill, decode, page_size=1)
        t16 = opt13b.iteration_time(prefill, decode, page_size=16)
        pages = (len(prefill) + len(decode)) * (4112 - 257)
        assert t1 - t16 == pytest.approx(pages * per_page, rel=1e-9)


def test_decode_run_equals_stepping(opt13b):
    ctx = sharegpt_like(37, seed=2)
    for ps in (1, 7, 16):
        stepped = sum(opt13b.iteration_time([], ctx + j, ps) for j in range(50))
        assert opt13b.decode_run_time(ctx, ps, 50) == pytest.approx(stepped, rel=1e-12)


def test_constant_model_exact():
    lm = make_latency_model("constant", "opt-13b", "a100-40gb", prefill_token_s=0.001,
                            decode_step_s=0.03, decode_token_s=0.0005, iteration_s=0.002)
    assert lm.iteration_time([(100, 0), (50, 20)], [10, 20, 30], 16) == pytest.approx(
        0.002 + 0.150 + 0.03 + 3 * 0.0005)
    assert lm.iteration_time([(64, 0)], [], 1) == pytest.approx(0.002 + 0.064)
    assert lm.iteration_time([], [5], 256) == pytest.approx(0.002 + 0.03 + 0.0005)
    assert lm.decode_run_time([5, 6], 16, 10) == pytest.approx(10 * (0.002 + 0.03 + 0.001))
    assert lm.swap_time(1e9, 100) == 0.0


def test_swap_time_uses_host_link(opt13b):
    n_bytes = 1e9
    t = opt13b.swap_time(n_bytes, 0)
    assert t == pytest.approx(n_bytes / (32e9 * opt13b.swap_efficiency))
    assert opt13b.swap_time(n_bytes, 10) > t


def test_tp_and_moe():
    one = make_latency_model("roofline", "llama-3.1-70b", "h100", tp=4)
    two = make_latency_model("roofline", "llama-3.1-70b", "h100", tp=8)
    ctx = sharegpt_like(32)
    assert two.iteration_time([], ctx, 16) < one.iteration_time([], ctx, 16)
    mix = make_latency_model("roofline", "mixtral-8x7b", "h100")
    # a single token reads 2 of 8 experts; a large batch reads nearly all of them
    assert mix.weight_bytes_read(1) < 0.4 * mix.weight_bytes_read(256)


# nccl-tests all_reduce_perf on 8 H100 SXM ranks (an AWS p5 node, NVLink / NVSwitch; bf16
# activations move like its float rows, bytes are bytes), out-of-place column, as published in
# aws-samples/awsome-distributed-training, 1.architectures/3.aws-batch ("NCCL Tests on AWS
# Batch", read 2026-12-05): message bytes -> time (s); busbw at 128 MiB 396.19 GB/s.
NCCL_H100_X8_ALLREDUCE_S = {16_384: 17.46e-6, 134_217_728: 592.8e-6}
NCCL_H100_X8_BUSBW_GB_S = 396.19


def _allreduce_seconds(prefill, decode, **link) -> float:
    """The all-reduce term of one Llama-3.1-70B iteration at TP 8: the iteration with the
    link's constants minus the same iteration on an instant link (every other term is
    independent of them)."""
    def t(**kw) -> float:
        lm = make_latency_model("roofline", "llama-3.1-70b", "h100", tp=8, **kw)
        return lm.iteration_time(prefill, decode, page_size=16)
    return t(**link) - t(tp_link_gb_s=1e12, tp_allreduce_latency_s=0.0)


def test_tp_allreduce_term_matches_nccl_on_h100():
    """Issue 39 item 7: Megatron-style TP runs two all-reduces of the activations (tokens x
    hidden x 2 bytes) per layer. Llama-3.1-70B (hidden 8192, 80 layers) at TP 8: one decode
    token all-reduces 16 KiB, an 8,192-token prefill chunk 128 MiB, both rows of the published
    table. With the fixed cost set to the 16 KiB time and the link to the 128 MiB bus
    bandwidth, the term of each iteration is 160 x the published time within 5 %: dropping
    the term, doubling it, forgetting the 2-byte activation, one all-reduce per layer, or a
    message split over the ranks each miss by 40 % or more."""
    link = {"tp_link_gb_s": NCCL_H100_X8_BUSBW_GB_S,
            "tp_allreduce_latency_s": NCCL_H100_X8_ALLREDUCE_S[16_384]}
    per_layer = 2 * 80
    decode = _allreduce_seconds([], [4096], **link)
    assert decode == pytest.approx(per_layer * NCCL_H100_X8_ALLREDUCE_S[16_384], rel=0.05)
    prefill = _allreduce_seconds([(8192, 0)], [], **link)
    assert prefill == pytest.approx(per_layer * NCCL_H100_X8_ALLREDUCE_S[134_217_728],
                                    rel=0.05)
    # one rank has nothing to reduce
    one = make_latency_model("roofline", "llama-3.1-70b", "h100", tp=1)
    assert one.iteration_time([(8192, 0)], [], 16) == make_latency_model(
        "roofline", "llama-3.1-70b", "h100", tp=1, **link).iteration_time([(8192, 0)], [], 16)
