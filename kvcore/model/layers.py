"""Layer kinds of hybrid models and the KV memory each one holds.

A model is a tuple of `LayerGroup`s (kind, number of layers, shapes). Attention kinds hold
bytes per token (full attention every token, a sliding window only its last window plus the
tokens of the current step, chunked local attention only the current chunk); linear attention
(gated delta net) and Mamba-2 hold a fixed state per request (a conv state and a recurrent
state), whatever the request's length. The planner (kvcore.model.hybrid_plan) sizes the engines'
pools from these figures.

State shapes follow vLLM v0.11 (vllm/model_executor/layers/mamba/mamba_utils.py,
`MambaStateShapeCalculator.mamba2_state_shape` and `.gated_delta_net_state_shape`, unchanged
to v0.31): heads and groups are split over the tensor-parallel ranks; Mamba-2 groups that do
not divide by tp are replicated up to tp (`extra_groups_for_head_shards`); a gated delta net's
conv state holds `conv_kernel - 1 + speculative tokens` positions.

State dtypes are the engine's, never the KV dtype: the conv state is in `conv_dtype` (None:
the model's dtype, `HybridLayout.model_dtype`), the recurrent state in `state_dtype` (None:
the conv state's), as vLLM's `--mamba-cache-dtype auto` / `--mamba-ssm-cache-dtype auto`
resolve them (vllm/model_executor/layers/mamba/mamba_utils.py `_mamba_state_dtype`).
kvcore.model.state_dtypes fills them per engine from the config and the options.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcore.model.presets import dtype_bytes

#: the dtype of a model whose config names none (every preset here is bf16)
MODEL_DTYPE = "bf16"

FULL, SLIDING, CHUNKED, LINEAR, MAMBA = "full", "sliding", "chunked", "linear", "mamba"
KIND_LABELS: dict[str, str] = {FULL: "full", SLIDING: "SWA", CHUNKED: "chunked-local",
                               LINEAR: "linear-attention (GDN)", MAMBA: "Mamba-2"}


def _per_rank(n: int, tp: int, what: str) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    if n % tp and n > tp:
        raise ValueError(f"{what} = {n} does not divide by tp = {tp}")
    return max(1, n // tp)


@dataclass(frozen=True)
class LayerGroup:
    """`layers` layers of one kind. Attention kinds use `kv_heads`, `head_dim` (and `window`
    for SLIDING, `chunk` for CHUNKED); LINEAR uses `num_k_heads`, `num_v_heads`, `k_head_dim`,
    `v_head_dim`, `conv_kernel`; MAMBA uses `num_heads` (as `num_v_heads`), `head_dim` (as
    `v_head_dim`), `state_size` (as `k_head_dim`), `n_groups`, `conv_kernel` and
    `mamba_chunk_size` (the SSD kernel's chunk, config `chunk_size`; vLLM aligns blocks to it
    in mamba cache mode "all"). `conv_dtype` and `state_dtype` are the state dtypes (None:
    the model's dtype for the conv state, the conv state's for the recurrent one);
    `spec_tokens` speculative tokens widen a gated delta net's conv state."""

    kind: str
    layers: int
    kv_heads: int = 0
    head_dim: int = 0
    window: int = 0
    chunk: int = 0
    num_k_heads: int = 0
    num_v_heads: int = 0
    k_head_dim: int = 0
    v_head_dim: int = 0
    n_groups: int = 0
    conv_kernel: int = 0
    conv_dtype: str | None = None
    state_dtype: str | None = None
    mamba_chunk_size: int = 0
    spec_tokens: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KIND_LABELS:
            raise ValueError(f"unknown layer kind {self.kind!r}; known: {', '.join(KIND_LABELS)}")
        if self.layers < 1:
            raise ValueError(f"{self.kind} group: layers must be >= 1, got {self.layers}")
        if self.kind == SLIDING and self.window < 1:
            raise ValueError("sliding group: window must be >= 1")
        if self.kind == CHUNKED and self.chunk < 1:
            raise ValueError("chunked group: chunk must be >= 1")
        if self.is_state and self.conv_kernel < 2:
            raise ValueError(f"{self.kind} group: conv_kernel must be >= 2")

    @property
    def is_state(self) -> bool:
        """Linear attention and Mamba keep a fixed state per request instead of per-token KV."""
        return self.kind in (LINEAR, MAMBA)

    # -- attention --------------------------------------------------------------------
    def kv_bytes_per_token_layer(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """One token's K and V in one layer on one rank (0 for state kinds)."""
        if self.is_state:
            return 0
        _per_rank(1, tp, "")  # checks tp
        kvh = max(1, self.kv_heads // tp)  # replicated when tp > kv heads
        return 2 * kvh * self.head_dim * dtype_bytes(kv_dtype)

    def kv_bytes_per_token(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        return self.layers * self.kv_bytes_per_token_layer(kv_dtype, tp)

    # -- state ------------------------------------------------------------------------
    def state_shapes(self, tp: int = 1) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """(conv state shape, recurrent/SSM state shape) of one layer on one rank."""
        if not self.is_state:
            return (0, 0), (0, 0, 0)
        if self.kind == LINEAR:  # vLLM gated_delta_net_state_shape
            conv_dim = (2 * _per_rank(self.num_k_heads * self.k_head_dim, tp, "key dim")
                        + _per_rank(self.num_v_heads * self.v_head_dim, tp, "value dim"))
            return ((self.conv_kernel - 1 + self.spec_tokens, conv_dim),
                    (_per_rank(self.num_v_heads, tp, "linear value heads"), self.k_head_dim,
                     self.v_head_dim))
        groups = self.n_groups if self.n_groups % tp == 0 else self.n_groups + (tp - self.n_groups)
        inner = self.num_v_heads * self.v_head_dim  # mamba2_state_shape
        conv_dim = (_per_rank(inner, tp, "mamba intermediate size")
                    + 2 * _per_rank(groups * self.k_head_dim, tp, "mamba group state"))
        return ((self.conv_kernel - 1, conv_dim),
                (_per_rank(self.num_v_heads, tp, "mamba heads"), self.v_head_dim,
                 self.k_head_dim))

    def state_bytes_layer(self, kv_dtype: str = "bf16", tp: int = 1,
                          model_dtype: str = MODEL_DTYPE) -> int:
        """One request's conv + recurrent state in one layer on one rank. The KV dtype does
        not apply (`kv_dtype` is accepted for a uniform signature): states are stored in
        their own dtypes (module notes)."""
        if not self.is_state:
            return 0
        conv, ssm = self.state_shapes(tp)
        conv_dtype = self.conv_dtype or model_dtype
        cb = dtype_bytes(conv_dtype)
        sb = dtype_bytes(self.state_dtype or conv_dtype)
        return conv[0] * conv[1] * cb + ssm[0] * ssm[1] * ssm[2] * sb

    def state_bytes_per_request(self, kv_dtype: str = "bf16", tp: int = 1,
                                model_dtype: str = MODEL_DTYPE) -> int:
        return self.layers * self.state_bytes_layer(kv_dtype, tp, model_dtype)

    # -- a request ------------------------------------------------------------------
    def tokens_held(self, length: int, step_tokens: int = 0) -> int:
        """Tokens of KV a request of `length` tokens keeps in this kind's layers: all of them
        (full), its last window plus the `step_tokens` being computed (sliding), the current
        chunk (chunked), none (state kinds)."""
        if length < 0 or step_tokens < 0:
            raise ValueError(f"length and step_tokens must be >= 0, got {length}, {step_tokens}")
        if self.kind == FULL:
            return length
        if self.kind == SLIDING:
            return min(length, self.window + step_tokens)
        if self.kind == CHUNKED:
            return 0 if length == 0 else length - (length - 1) // self.chunk * self.chunk
        return 0

    def bytes_for_length(self, length: int, kv_dtype: str = "bf16", tp: int = 1,
                         step_tokens: int = 0, model_dtype: str = MODEL_DTYPE) -> int:
        """Bytes a request of `length` tokens holds in this group on one rank."""
        return (self.tokens_held(length, step_tokens) * self.kv_bytes_per_token(kv_dtype, tp)
                + (self.state_bytes_per_request(kv_dtype, tp, model_dtype) if length else 0))

    @property
    def label(self) -> str:
        extra = (f" w={self.window}" if self.kind == SLIDING
                 else f" chunk={self.chunk}" if self.kind == CHUNKED else "")
        return f"{self.layers} {KIND_LABELS[self.kind]}{extra}"


@dataclass(frozen=True)
class HybridLayout:
    """A model's layers as groups of one kind each (in no particular order), with what the
    engines read besides the shapes: the model's dtype (config `torch_dtype`), its
    architecture family (`arch`: config `model_type`, e.g. qwen3_5, qwen3_next, nemotron_h)
    and the state dtype its config names (`config_ssm_dtype`: `mamba_ssm_dtype`, or
    Nemotron-H's `mamba_ssm_cache_dtype`), which kvcore.model.state_dtypes resolves per engine."""

    groups: tuple[LayerGroup, ...]
    model_dtype: str = MODEL_DTYPE
    arch: str = ""
    config_ssm_dtype: str | None = None

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a layout needs at least one layer group")

    @property
    def num_layers(self) -> int:
        return sum(g.layers for g in self.groups)

    @property
    def is_hybrid(self) -> bool:
        return any(g.kind != FULL for g in self.groups)

    def attention_groups(self) -> tuple[LayerGroup, ...]:
        return tuple(g for g in self.groups if not g.is_state)

    def state_groups(self) -> tuple[LayerGroup, ...]:
        return tuple(g for g in self.groups if g.is_state)

    def state_bytes_per_request(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """One request's states over every state layer on one rank (the KV dtype does not
        apply; see the module notes)."""
        return sum(g.state_bytes_per_request(kv_dtype, tp, self.model_dtype)
                   for g in self.groups)

    def kv_bytes_per_token(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """One token's KV over the attention layers on one rank (state layers hold none)."""
        return sum(g.kv_bytes_per_token(kv_dtype, tp) for g in self.attention_groups())

    @property
    def mamba2(self) -> bool:
        """State layers that are all Mamba-2: vLLM's SupportsMambaPrefixCaching models
        (NemotronH, Mamba2, Bamba, ...); gated delta net models are not."""
        states = self.state_groups()
        return bool(states) and all(g.kind == MAMBA for g in states)

    def bytes_for_length(self, length: int, kv_dtype: str = "bf16", tp: int = 1,
                         step_tokens: int = 0) -> int:
        """Bytes one request of `length` tokens holds over all layers on one rank."""
        return sum(g.bytes_for_length(length, kv_dtype, tp, step_tokens, self.model_dtype)
                   for g in self.groups)

    @property
    def mix(self) -> str:
        """The layer mix in words, e.g. '18 linear-attention (GDN) + 6 full'."""
        return " + ".join(g.label for g in self.groups)


__all__ = ["CHUNKED", "FULL", "KIND_LABELS", "LINEAR", "MAMBA", "MODEL_DTYPE", "SLIDING",
           "HybridLayout", "LayerGroup"]
