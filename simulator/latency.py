"""Latency models: how long one engine iteration takes, chosen by name.

An iteration mixes a prefill batch (new tokens of some requests, each after some context that
is already in the KV cache) with one decode token for every running request. Two models:

* `roofline`: time = max(FLOPs / (peak x mfu), bytes / (bandwidth x mbu)) + a fixed cost per KV
  page touched per layer (the attention backend's: simulator/attention_backends.py) +
  per-request and per-iteration overheads + tensor-parallel all-reduces. The defaults here are
  the `vllm-paper-2023` profile's (OPT-13B on A100-40GB decodes ~30 ShareGPT requests in
  ~45 ms per iteration, as the vLLM paper's Fig. 13 implies); runs take their constants from a
  profile (simulator/latency_profiles.py, docs/latency.md).
* `constant`: fixed seconds per prefill token and per decode step, for tests and analytic checks.

Every model also prices swapping KV to host memory (`swap_time`). Calls are O(batch) numpy with
no pandas, since the simulator calls them about once per iteration.

A hybrid model's run hands the roofline its `layout`: attention is then priced per layer kind
(sliding-window layers over the window, chunked local ones over the current chunk, linear
attention / Mamba by their state read and write; simulator/latency_layers.py). Without one
(every full-attention model, and the pre-hybrid baseline) nothing changes.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kvcore.contract.registry import Registry
from kvcore.model.layers import HybridLayout
from kvcore.model.presets import (
    GpuPreset,
    ModelPreset,
    dtype_bytes,
    get_gpu,
    get_model,
    weight_dtype_bytes,
)
from simulator.latency_layers import LayerCosts

# the two roofline constants a user calibrates to a GPU (--page-head-overhead-s,
# --iteration-overhead-s; simulator/specs.py shows these defaults); docs/latency.md says how
PAGE_HEAD_OVERHEAD_S = 1.5e-9
ITERATION_OVERHEAD_S = 5e-3
CALIBRATED = ("page_head_overhead_s", "iteration_overhead_s")

PrefillBatch = Sequence[tuple[int, int]] | np.ndarray  # (new tokens, context before) per request
Contexts = Sequence[int] | np.ndarray


def _prefill_arrays(prefill: PrefillBatch) -> tuple[np.ndarray, np.ndarray]:
    arr = np.asarray(prefill, dtype=np.int64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def _cdiv_sum(x: np.ndarray, page_size: int) -> int:
    return int((-(-x // page_size)).sum()) if x.size else 0


@dataclass(frozen=True)
class LatencyModel(ABC):
    """One engine's iteration cost. Subclasses are dataclasses whose fields are the constants;
    `make_latency_model(name, ..., **overrides)` sets any of them."""

    model: ModelPreset
    gpu: GpuPreset
    tp: int = 1
    kv_dtype: str = "bf16"
    layout: HybridLayout | None = None  # a hybrid's layer kinds (None: all full attention)
    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp must be a positive integer, got {self.tp!r}")
        dtype_bytes(self.kv_dtype)
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.init and isinstance(v, float) and not v >= 0:
                raise ValueError(f"latency constant {f.name} must be >= 0, got {v!r}")

    def iteration_time(
        self, prefill: PrefillBatch = (), decode_contexts: Contexts = (), page_size: int = 1
    ) -> float:
        """Seconds for one iteration: `prefill` lists (new tokens, context before) per request;
        `decode_contexts` the sequence length (KV tokens attended, the new one included) of each
        request that decodes one token in this iteration."""
        new, before = _prefill_arrays(prefill)
        dec = np.asarray(decode_contexts, dtype=np.int64).reshape(-1)
        return self.iteration_time_arrays(new, before, dec, page_size)

    @abstractmethod
    def iteration_time_arrays(
        self, new: np.ndarray, before: np.ndarray, decode: np.ndarray, page_size: int
    ) -> float:
        """`iteration_time` on int64 arrays (the simulator's fast path)."""

    def decode_step_times(self, contexts: Contexts, page_size: int, steps: int) -> np.ndarray:
        """Seconds of each of `steps` decode-only iterations of the same running set, whose
        contexts grow by one per step starting from `contexts`; equal to stepping."""
        c = np.asarray(contexts, dtype=np.int64).reshape(-1)
        return np.array([self.iteration_time_arrays(_EMPTY, _EMPTY, c + j, page_size)
                         for j in range(steps)], dtype=float)

    def decode_step_ends(self, contexts: Contexts, page_size: int, steps: int, now: float,
                         due: float = math.inf) -> np.ndarray:
        """End times of those `decode_step_times` steps, accumulated left to right from `now`
        (as SimPy adds successive timeouts), up to and including the first that reaches
        `due` (the next arrival: a stretch ends in that step) or all `steps`."""
        return step_ends(now, self.decode_step_times(contexts, page_size, steps), due)

    def decode_run_time(self, contexts: Contexts, page_size: int, steps: int) -> float:
        """Total of `decode_step_times`."""
        return float(np.sum(self.decode_step_times(contexts, page_size, steps)))

    @abstractmethod
    def swap_time(self, n_bytes: float, n_pages: int) -> float:
        """Seconds to move `n_bytes` of KV in `n_pages` pages over the host link (one way)."""

    def swap_tokens_time(self, tokens: int, page_size: int) -> float:
        """`swap_time` for `tokens` tokens of KV laid out in pages of `page_size`."""
        return self.swap_time(tokens * self.model.kv_bytes_per_token(self.kv_dtype, self.tp),
                              -(-tokens // page_size))

    def describe(self) -> dict[str, Any]:
        """The constants, for reports and run metadata."""
        out: dict[str, Any] = {"latency_model": self.name, "model": self.model.id,
                               "gpu": self.gpu.id, "tp": self.tp, "kv_dtype": self.kv_dtype}
        if self.layout is not None:
            out["layout"] = self.layout.mix
        for f in dataclasses.fields(self):
            if f.init and f.name not in _SHAPE:
                out[f.name] = getattr(self, f.name)
        return out


_SHAPE = ("model", "gpu", "tp", "kv_dtype", "layout")  # what a model runs, not a constant


SCALAR_DECODE = 64  # _decode_sums: up to this many contexts, Python ints beat numpy's calls


def _decode_sums(decode: np.ndarray, ps: int) -> tuple[int, int, int]:
    """(requests, context sum, pages at kernel page `ps`) of one decode batch: the same
    integers from Python ints for a small batch (numpy's cost per call is most of it)."""
    n = decode.size
    if n > SCALAR_DECODE:
        return n, int(decode.sum()), _cdiv_sum(decode, ps)
    ctx = decode.tolist()
    total = sum(ctx)
    return n, total, (total if ps == 1 else sum([-(-c // ps) for c in ctx]))


def _step_sums(ctx: list[int], ps: int) -> tuple[int, int, list[int]]:
    """(sum, pages at kernel page `ps`, counts of (1 - c) % ps) of a small batch, as ints."""
    counts, pages = [0] * ps, 0
    for c in ctx:
        counts[(1 - c) % ps] += 1
        pages -= -c // ps
    return sum(ctx), pages, counts


def step_ends(now: float, times: np.ndarray, due: float = math.inf) -> np.ndarray:
    """End times of consecutive steps, accumulated left to right from `now` exactly as SimPy
    accumulates one timeout after another (now + t0, then + t1, ...: np.add.accumulate adds
    left to right), so that a stretch ends at bit-for-bit the same instant as stepping; cut
    after the first end at or past `due` (the next arrival: a stretch ends in that step)."""
    ends = np.add.accumulate(np.concatenate(([now], np.asarray(times, dtype=float))))[1:]
    if len(ends) and ends[-1] >= due:
        ends = ends[: int(np.argmax(ends >= due)) + 1]
    return ends


_EMPTY = np.zeros(0, dtype=np.int64)
SCALAR_STEPS = 24  # decode_step_times: up to this many steps, Python floats beat numpy's calls

LATENCY_MODELS: Registry[type[LatencyModel]] = Registry("latency model")


def register_latency_model(name: str) -> Callable[[type[LatencyModel]], type[LatencyModel]]:
    def deco(cls: type[LatencyModel]) -> type[LatencyModel]:
        cls.name = name
        LATENCY_MODELS.add(name, cls)
        return cls

    return deco


@register_latency_model("roofline")
@dataclass(frozen=True)
class RooflineLatency(LatencyModel):
    """Roofline per iteration, per tensor-parallel rank (ranks run in lockstep).

    FLOPs = 2 x active params / tp per token + attention 2 x heads/tp x (qk_dim + v_dim) per
    (query, key) pair and layer (causal within a prefill chunk). Bytes = resident weights
    (MoE: only the experts the batch's tokens are expected to route to) + KV read for every
    context + KV written for every new token.
    """

    mfu: float = 0.5  # achieved fraction of peak dense FLOPs
    mbu: float = 0.6  # achieved fraction of HBM bandwidth
    # per KV page touched, per KV head on the rank, per layer (index, loop, partial tiles):
    # 1.5 ns x 40 heads = 60 ns per page and layer for OPT-13B, the calibration point; a GQA
    # model with 8 KV heads pays a fifth of that, since each head's slice is its own work item
    page_head_overhead_s: float = PAGE_HEAD_OVERHEAD_S
    request_overhead_s: float = 20e-6  # per request in the batch (sampling, bookkeeping)
    iteration_overhead_s: float = ITERATION_OVERHEAD_S  # scheduling, launches, host sync
    tp_link_gb_s: float = 150.0  # effective all-reduce bus bandwidth between ranks
    tp_allreduce_latency_s: float = 10e-6  # fixed cost of each all-reduce
    act_bytes: int = 2  # bytes of one activation element in all-reduces
    swap_efficiency: float = 0.8  # achieved fraction of the host link
    swap_copy_overhead_s: float = 5e-6  # per copy; one copy per page, layer and K/V part
    # the attention backend's page cost (simulator/attention_backends.py); the defaults are
    # the 2023 kernel's: prefill pays per page like decode, attention time as dense
    prefill_attention_factor: float = 1.0  # paged prefill attention time / dense kernel's
    prefill_pages: bool = True  # prefill pays page_head_overhead_s per page touched
    kernel_page_one: bool = False  # the kernel walks page 1 whatever the pool's page size

    _c: dict[str, float] = field(init=False, repr=False, compare=False, default_factory=dict)
    _layers: LayerCosts | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        for k in ("mfu", "mbu", "swap_efficiency"):
            v = getattr(self, k)
            if not 0 < v <= 1:
                raise ValueError(f"{k} must be in (0, 1], got {v!r}")
        if self.tp_link_gb_s <= 0:
            raise ValueError(f"tp_link_gb_s must be > 0, got {self.tp_link_gb_s!r}")
        m, tp = self.model, self.tp
        m.weight_bytes(tp)  # the roofline reads the weights: a KV-only config cannot run it
        wb = weight_dtype_bytes(m.weight_dtype)  # the experts' (mxfp4 / nvfp4 / int4 too)
        heads = m.num_heads / tp
        if m.is_mla:  # absorbed attention over the latent: q.k over 576, values over 512
            qk, v = m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank
        else:
            qk = v = m.head_dim
        expert_layer = 3.0 * m.hidden_size * m.expert_intermediate_size * wb / tp
        c = self._c
        c["flop_tok"] = 2.0 * m.params_per_token / tp
        c["flop_pair"] = 2.0 * heads * (qk + v) * m.num_layers
        c["kv_tok"] = float(m.kv_bytes_per_token(self.kv_dtype, tp))
        rest_b = m.nonexpert_weight_bytes_per_param  # bf16 where only the experts are mxfp4
        c["w_fixed"] = (m.num_params - m.routed_expert_params) * rest_b / tp
        c["w_expert"] = expert_layer * m.num_moe_layers  # one expert in every MoE layer
        c["flops_s"] = self.gpu.flops * self.mfu
        c["bytes_s"] = self.gpu.bandwidth_bytes_s * self.mbu
        kv_heads = 1 if m.is_mla else m.kv_heads_per_rank(tp)
        c["page"] = self.page_head_overhead_s * kv_heads * m.num_layers
        c["ar_tok"] = (0.0 if tp == 1 else 2 * m.num_layers * 2 * (tp - 1) / tp
                       * m.hidden_size * self.act_bytes / (self.tp_link_gb_s * 1e9))
        c["ar_fixed"] = 0.0 if tp == 1 else 2 * m.num_layers * self.tp_allreduce_latency_s
        c["copies_page"] = m.num_layers * (1 if m.is_mla else 2)
        c["swap_bw"] = self.gpu.host_link_bytes_s * self.swap_efficiency
        layers = (LayerCosts(self.layout, m, self.kv_dtype, tp, self.page_head_overhead_s)
                  if self.layout is not None and self.layout.is_hybrid else None)
        object.__setattr__(self, "_layers", layers)

    def weight_bytes_read(self, tokens: float | np.ndarray) -> float | np.ndarray:
        """Weight bytes one rank reads for a batch of `tokens` tokens (MoE: expected distinct
        experts per layer, E x (1 - (1 - k/E)^tokens), with uniform routing)."""
        m, c = self.model, self._c
        if not m.is_moe:
            return c["w_fixed"]
        e, k = m.num_experts, m.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** np.asarray(tokens, dtype=float))
        return c["w_fixed"] + c["w_expert"] * touched

    def kernel_page_size(self, page_size: int) -> int:
        """The page size attention walks (1 where the engine expands pages to tokens)."""
        return 1 if self.kernel_page_one else page_size

    def _time(self, tokens, n_req, pairs, kv_read, pages):
        """Vectorised core over per-iteration aggregates (scalars or equal-length arrays)."""
        c = self._c
        flops = tokens * c["flop_tok"] + pairs * c["flop_pair"]
        mem = self.weight_bytes_read(tokens) + (kv_read + tokens) * c["kv_tok"]
        t = np.maximum(flops / c["flops_s"], mem / c["bytes_s"])
        t = t + pages * c["page"] + n_req * self.request_overhead_s + self.iteration_overhead_s
        return t + tokens * c["ar_tok"] + c["ar_fixed"]

    def _time_scalar(self, tokens: int, n_req: int, pairs: float, kv_read: int,
                     pages: int) -> float:
        """`_time` for one iteration in Python floats: the same operations in the same order
        (so the same doubles), without numpy's cost per call on 0-d values."""
        c = self._c
        flops = tokens * c["flop_tok"] + pairs * c["flop_pair"]
        mem = float(self.weight_bytes_read(tokens)) + (kv_read + tokens) * c["kv_tok"]
        t = max(flops / c["flops_s"], mem / c["bytes_s"])
        t = t + pages * c["page"] + n_req * self.request_overhead_s + self.iteration_overhead_s
        return t + tokens * c["ar_tok"] + c["ar_fixed"]

    def _hybrid_time(self, new: np.ndarray, before: np.ndarray, decode: np.ndarray,
                     page_size: int) -> float:
        """`_time` with the attention terms summed per layer kind (latency_layers.py)."""
        c = self._c
        a = self._layers.terms(new, before, decode, self.kernel_page_size(page_size),
                               self.prefill_pages, self.prefill_attention_factor)
        tokens = int(new.sum()) + decode.size
        flops = tokens * c["flop_tok"] + a.flops
        mem = self.weight_bytes_read(tokens) + a.kv_bytes
        t = max(flops / c["flops_s"], mem / c["bytes_s"])
        t = t + a.page_s + (new.size + decode.size) * self.request_overhead_s \
            + self.iteration_overhead_s
        return float(t + tokens * c["ar_tok"] + c["ar_fixed"])

    def iteration_time(
        self, prefill: PrefillBatch = (), decode_contexts: Contexts = (), page_size: int = 1
    ) -> float:
        """The prefill chunks of an iteration are few: their sums in Python ints (the same
        integers as the array form), the decode contexts through numpy."""
        if self._layers is not None or isinstance(prefill, np.ndarray):
            return super().iteration_time(prefill, decode_contexts, page_size)
        ps = self.kernel_page_size(page_size)
        n_pre = t_new = kv_before = pairs = pre_pages = 0
        for new, before in prefill:
            n_pre += 1
            t_new += new
            kv_before += before
            pairs += new * before + new * (new + 1) // 2
            pre_pages += -(-(new + before) // ps)
        dec = np.asarray(decode_contexts, dtype=np.int64).reshape(-1)
        return self._iteration(n_pre, t_new, kv_before, pairs, pre_pages,
                               *_decode_sums(dec, ps))

    def iteration_time_arrays(
        self, new: np.ndarray, before: np.ndarray, decode: np.ndarray, page_size: int
    ) -> float:
        n_pre = new.size
        if self._layers is not None and (n_pre or decode.size):
            return self._hybrid_time(new, before, decode, page_size)
        ps = self.kernel_page_size(page_size)
        t_new = int(new.sum()) if n_pre else 0
        kv_before = int(before.sum()) if n_pre else 0
        pairs = (int((new * before).sum() + (new * (new + 1) // 2).sum()) if n_pre else 0)
        return self._iteration(n_pre, t_new, kv_before, pairs, _cdiv_sum(new + before, ps),
                               *_decode_sums(decode, ps))

    def _iteration(self, n_pre: int, t_new: int, kv_before: int, pairs: int, pre_pages: int,
                   n_dec: int, ctx_sum: int, pages: int) -> float:
        """One iteration from its prefill sums and its decode sums (`_decode_sums`)."""
        if n_pre == 0 and n_dec == 0:
            return 0.0
        if self.prefill_pages:
            pages += pre_pages
        # an integer sum when the factor is 1 (the 2023 kernel's numbers stay bit-identical)
        att = pairs + ctx_sum if self.prefill_attention_factor == 1.0 else (
            pairs * self.prefill_attention_factor + ctx_sum)
        return self._time_scalar(t_new + n_dec, n_pre + n_dec, att,
                                 kv_before + ctx_sum - n_dec, pages)

    def decode_step_times(self, contexts: Contexts, page_size: int, steps: int) -> np.ndarray:
        if self._layers is not None:  # per layer kind: step by step (the reference)
            return super().decode_step_times(contexts, page_size, max(steps, 0))
        c = np.asarray(contexts, dtype=np.int64).reshape(-1)
        n = c.size
        if n == 0 or steps <= 0:
            return np.zeros(max(steps, 0))
        page_size = self.kernel_page_size(page_size)
        # pages grow by one for each request whose length passes a multiple of page_size:
        # ceil((c+j)/ps) steps up at j where (c + j - 1) % ps == 0, j >= 1.
        offs = (1 - c) % page_size
        counts = np.bincount(offs, minlength=page_size)
        if steps <= SCALAR_STEPS:  # most stretches are short: one scalar formula per step
            return np.array(self._short_steps(n, int(c.sum()), _cdiv_sum(c, page_size),
                                              counts.tolist(), steps), dtype=float)
        return self._long_steps(c, counts, page_size, steps)

    def decode_step_ends(self, contexts: Contexts, page_size: int, steps: int, now: float,
                         due: float = math.inf) -> np.ndarray:
        """The first SCALAR_STEPS steps priced one by one in Python floats and stopped at
        `due`: a stretch's plan usually ends at the next arrival a few steps in, so pricing
        all `steps` (up to --max-steps-per-stretch) would be mostly wasted. Past them, the
        array formula from the contexts SCALAR_STEPS steps on: each step's time is a function
        of its integer sums only, so the pieces are the same doubles as one call."""
        c = np.asarray(contexts, dtype=np.int64).reshape(-1)
        if self._layers is not None or c.size == 0 or steps <= 0:
            return super().decode_step_ends(c, page_size, steps, now, due)
        ps = self.kernel_page_size(page_size)
        if c.size <= SCALAR_DECODE:
            total, pages, counts = _step_sums(c.tolist(), ps)
        else:
            total, pages = int(c.sum()), _cdiv_sum(c, ps)
            counts = np.bincount((1 - c) % ps, minlength=ps).tolist()
        short = min(steps, SCALAR_STEPS)
        ends = self._short_steps(c.size, total, pages, counts, short, now, due)
        if len(ends) == steps or (ends and ends[-1] >= due):
            return np.array(ends, dtype=float)
        done = len(ends)
        start = ends[-1] if ends else now
        rest = step_ends(start, self.decode_step_times(c + done, page_size, steps - done),
                           due)
        return np.concatenate((np.array(ends, dtype=float), rest))

    def _long_steps(self, c: np.ndarray, counts: np.ndarray, page_size: int,
                    steps: int) -> np.ndarray:
        """decode_step_times over arrays (kernel page `page_size`, `counts` of page offsets)."""
        n = c.size
        j = np.arange(steps, dtype=np.int64)
        ctx_sum = int(c.sum()) + n * j
        delta = counts[j % page_size]
        delta[0] = 0
        pages = _cdiv_sum(c, page_size) + np.cumsum(delta)
        return np.broadcast_to(self._time(n, n, ctx_sum, ctx_sum - n, pages), (steps,)).astype(
            float
        )

    def _short_steps(self, n: int, ctx: int, pages: int, counts: list[int], steps: int,
                     start: float | None = None, due: float = math.inf) -> list[float]:
        """`_time_scalar(n, n, ctx_j, ctx_j - n, pages_j)` of each step j, its terms that do
        not change with j computed once: each is the same product, added in the same order,
        so each step's time is the same double (the test compares them). With `start`: the
        steps' end times instead (start + t0, then + t1, ...), stopped at the first >= `due`."""
        c = self._c
        flop_tok, flop_pair, kv_tok = n * c["flop_tok"], c["flop_pair"], c["kv_tok"]
        weights = float(self.weight_bytes_read(n))
        flops_s, bytes_s, page = c["flops_s"], c["bytes_s"], c["page"]
        per_req, fixed = n * self.request_overhead_s, self.iteration_overhead_s
        ar_tok, ar_fixed = n * c["ar_tok"], c["ar_fixed"]
        ps = len(counts)
        out = []
        for j in range(steps):
            if j:
                ctx += n
                pages += counts[j % ps]
            # kv_read + tokens = (ctx - n) + n = ctx, an integer either way
            t = max((flop_tok + ctx * flop_pair) / flops_s, (weights + ctx * kv_tok) / bytes_s)
            t = t + pages * page + per_req + fixed + ar_tok + ar_fixed
            if start is None:
                out.append(t)
                continue
            start = start + t
            out.append(start)
            if start >= due:
                break
        return out

    def swap_time(self, n_bytes: float, n_pages: int) -> float:
        c = self._c
        return n_bytes / c["swap_bw"] + n_pages * c["copies_page"] * self.swap_copy_overhead_s


@register_latency_model("constant")
@dataclass(frozen=True)
class ConstantLatency(LatencyModel):
    """Fixed costs: prefill_token_s per new prefill token, decode_step_s per iteration that
    decodes (plus decode_token_s per decoding request), iteration_s per non-empty iteration."""

    prefill_token_s: float = 1e-4
    decode_step_s: float = 0.02
    decode_token_s: float = 0.0
    iteration_s: float = 0.0
    swap_byte_s: float = 0.0
    swap_page_s: float = 0.0

    def iteration_time_arrays(
        self, new: np.ndarray, before: np.ndarray, decode: np.ndarray, page_size: int
    ) -> float:
        if new.size == 0 and decode.size == 0:
            return 0.0
        t = self.iteration_s + self.prefill_token_s * (int(new.sum()) if new.size else 0)
        if decode.size:
            t += self.decode_step_s + self.decode_token_s * decode.size
        return t

    def decode_step_times(self, contexts: Contexts, page_size: int, steps: int) -> np.ndarray:
        n = np.asarray(contexts).size
        if n == 0 or steps <= 0:
            return np.zeros(max(steps, 0))
        return np.full(steps, self.iteration_s + self.decode_step_s + self.decode_token_s * n)

    def swap_time(self, n_bytes: float, n_pages: int) -> float:
        return n_bytes * self.swap_byte_s + n_pages * self.swap_page_s


def make_latency_model(
    name: str,
    model: ModelPreset | str,
    gpu: GpuPreset | str,
    tp: int = 1,
    kv_dtype: str = "bf16",
    layout: HybridLayout | None = None,
    **overrides: Any,
) -> LatencyModel:
    """A latency model by registry name; `overrides` set its constants (dataclass fields);
    `layout`: a hybrid model's layer kinds (the roofline prices attention per kind)."""
    key = name.strip().lower()
    if key not in LATENCY_MODELS:
        raise ValueError(f"unknown latency model {name!r}; known: {', '.join(LATENCY_MODELS)}")
    cls = LATENCY_MODELS.get(key)
    allowed = {f.name for f in dataclasses.fields(cls) if f.init} - set(_SHAPE)
    bad = sorted(set(overrides) - allowed)
    if bad:
        raise ValueError(f"unknown {key} latency constant(s) {', '.join(bad)}; known: "
                         f"{', '.join(sorted(allowed))}")
    m = model if isinstance(model, ModelPreset) else get_model(model)
    g = gpu if isinstance(gpu, GpuPreset) else get_gpu(gpu)
    return cls(model=m, gpu=g, tp=tp, kv_dtype=kv_dtype, layout=layout, **overrides)
