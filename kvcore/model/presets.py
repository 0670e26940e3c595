"""Model and GPU presets: the one table that the KV pool, the latency model and the planner read.

Each preset is a frozen dataclass written on one line, so the table reads like a datasheet.
Derived quantities (KV bytes per token, weight bytes) are properties, never stored, so they
cannot drift from the architecture they come from. Sources are in docs/presets.md.

`ModelPreset.from_hf_config` builds a preset from a Hugging Face `config.json` and counts the
parameters from the architecture (see `ModelPreset.count_params` for the assumptions);
`to_hf_config` writes the fields back so that a round trip gives the same preset.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

GB = 10**9  # vendors quote decimal gigabytes
GiB = 2**30

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# Weight formats below one byte, in bytes per parameter with their block scales: MXFP4 is 4-bit
# E2M1 plus one 8-bit E8M0 scale per 32 values (OCP MX spec v1.0), 4.25 bits; NVFP4 is 4-bit
# E2M1 plus one fp8 scale per 16 values (NVIDIA ModelOpt), 4.5 bits; int4 (AWQ / GPTQ, group
# size 128) is 4 bits plus an fp16 scale and a 4-bit zero per 128 values, 4.16 bits.
WEIGHT_DTYPE_BYTES: dict[str, float] = {**DTYPE_BYTES, "mxfp4": 4.25 / 8, "nvfp4": 4.5 / 8,
                                        "int4": (4 + 20 / 128) / 8}
# Formats whose MoE checkpoints quantize the routed experts only: gpt-oss's MXFP4 config.json
# lists self_attn, mlp.router, embed_tokens and lm_head in quantization_config's
# modules_to_not_convert, so attention, router, embeddings and head stay bf16 (with them the
# gpt-oss model card's checkpoint sizes, 60.8 / 12.8 GiB, come out; tests/kvcore/
# test_weight_bytes.py). A dense model in such a format counts every parameter in it.
EXPERTS_ONLY_FORMATS = frozenset({"mxfp4"})
UNQUANTIZED_WEIGHT_BYTES = DTYPE_BYTES["bf16"]

# Hugging Face dtype names -> ours
_HF_DTYPES: dict[str, str] = {
    "float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "fp8": "fp8",
}
_TO_HF_DTYPE: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16",
                                "fp8": "bfloat16", "mxfp4": "bfloat16", "nvfp4": "bfloat16",
                                "int4": "float16"}
_TO_HF_QUANT: dict[str, dict[str, Any]] = {
    "fp8": {"quant_method": "fp8"}, "mxfp4": {"quant_method": "mxfp4"},
    "nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    "int4": {"quant_method": "awq", "bits": 4}}


def weight_dtype_from_quant(quant: object, default: str, where: str = "model config") -> str:
    """The weight format a Hugging Face `quantization_config` names (fp8, MXFP4, NVFP4, AWQ /
    GPTQ int4); `default` (the torch dtype) when there is none, with a warning for a method
    kvsim does not know (its weights are then counted at `default`)."""
    if not isinstance(quant, Mapping) or not quant:
        return default
    method = str(quant.get("quant_method", "")).lower()
    algo = str(quant.get("quant_algo", "") or quant.get("format", "")).lower()
    bits = quant.get("bits") or quant.get("w_bit")
    if "fp8" in method or (method == "modelopt" and "fp8" in algo):
        return "fp8"
    if method == "mxfp4":
        return "mxfp4"
    if "nvfp4" in method or (method == "modelopt" and "nvfp4" in algo):
        return "nvfp4"
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin") and int(bits or 4) == 4:
        return "int4"
    warnings.warn(f"{where}: quantization method {method or quant!r} is unknown to kvsim; "
                  f"weights counted as {default}", stacklevel=3)
    return default


def dtype_bytes(name: str) -> int:
    """Bytes per element of a KV / weight dtype name (bf16, fp16, fp8, fp32)."""
    key = name.lower()
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


def weight_dtype_bytes(name: str) -> float:
    """Bytes per parameter of a weight format (the KV dtypes plus mxfp4, nvfp4, int4)."""
    key = name.lower()
    if key not in WEIGHT_DTYPE_BYTES:
        raise ValueError(f"unknown weight dtype {name!r}; known: {', '.join(WEIGHT_DTYPE_BYTES)}")
    return WEIGHT_DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelPreset:
    """A decoder-only transformer, as far as KV memory and a roofline latency model care.

    `num_params` is the total resident parameter count (all MoE experts), `active_params` the
    count touched per token (equal for dense models). MLA models (DeepSeek-V3) cache one latent
    of `kv_lora_rank + qk_rope_head_dim` per token and layer instead of a K/V pair, and that
    latent is replicated on every tensor-parallel rank. For MLA, `head_dim` is the query/key
    head dimension (nope + rope) and `v_head_dim` the value head dimension.

    `arch` selects the parameter-count formula: "llama" (gated SiLU MLP, RMSNorm, no biases;
    also Mistral, Mixtral, Qwen2 with `attention_bias`), "opt" (fc1/fc2 MLP with biases,
    LayerNorm, learned positions) or "deepseek_v3" (MLA + MoE).
    """

    id: str
    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position: int
    num_params: float
    active_params: float = 0.0
    weight_dtype: str = "bf16"
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    sliding_window: int | None = None
    num_experts: int = 0
    experts_per_token: int = 0
    source: str = ""
    arch: str = "llama"
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    moe_intermediate_size: int = 0  # per routed expert; 0 = intermediate_size
    num_shared_experts: int = 0
    first_k_dense: int = 0  # leading layers with a dense MLP in an MoE model
    q_lora_rank: int = 0  # MLA query compression (0 = full query projection)
    v_head_dim: int = 0  # MLA value head dim (0 = head_dim)
    weights_unknown: str = ""  # why the weights cannot be counted (a KV-only config), or ""

    # -- KV -------------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def params_per_token(self) -> float:
        """Parameters whose weights each token multiplies (MoE: the active experts only)."""
        return self.active_params or self.num_params

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads on one tensor-parallel rank: split across ranks, at least one (replicated)."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be a positive integer, got {tp!r}")
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_layer(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes one token's KV takes in one layer on one rank."""
        elem = dtype_bytes(kv_dtype)
        if self.is_mla:
            if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
                raise ValueError(f"tp must be a positive integer, got {tp!r}")
            return (self.kv_lora_rank + self.qk_rope_head_dim) * elem
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * elem

    def kv_bytes_per_token(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes one token's KV takes across all layers on one rank (the pool's unit of cost)."""
        return self.num_layers * self.kv_bytes_per_token_layer(kv_dtype, tp)

    def kv_bytes_per_token_total(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes one token's KV takes on all `tp` ranks together (replicas counted each time)."""
        return tp * self.kv_bytes_per_token(kv_dtype, tp)

    # -- weights --------------------------------------------------------------------------
    def weight_bytes(self, tp: int = 1) -> float:
        """Resident weight bytes on one rank (all experts, each part in the format it is
        stored in: `nonexpert_weight_bytes_per_param`; weights split evenly over tp);
        ValueError naming the missing fields for a preset whose weights are unknown."""
        if self.weights_unknown:
            raise ValueError(f"{self.weights_unknown}, which the weights need (a KV-only "
                             "config plans with a direct size: --kv-mem-gib or "
                             "--kv-cache-memory-bytes)")
        wb = weight_dtype_bytes(self.weight_dtype)
        if not self.quantizes_experts_only:
            return self.num_params * wb / tp
        experts = self.routed_expert_params
        return ((self.num_params - experts) * UNQUANTIZED_WEIGHT_BYTES + experts * wb) / tp

    @property
    def quantizes_experts_only(self) -> bool:
        """An MoE model in a format whose checkpoints quantize the routed experts only
        (EXPERTS_ONLY_FORMATS): everything else is stored in bf16."""
        return self.is_moe and self.weight_dtype.lower() in EXPERTS_ONLY_FORMATS

    @property
    def nonexpert_weight_bytes_per_param(self) -> float:
        """Bytes per parameter outside the routed experts."""
        if self.quantizes_experts_only:
            return UNQUANTIZED_WEIGHT_BYTES
        return weight_dtype_bytes(self.weight_dtype)

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense if self.is_moe else 0

    @property
    def routed_expert_params(self) -> float:
        """Parameters of all routed experts (gated MLPs), 0 for a dense model."""
        return 3.0 * self.hidden_size * self.expert_intermediate_size * self.num_experts * (
            self.num_moe_layers)

    def count_params(self) -> tuple[int, int]:
        """(total, active) parameters counted from the architecture.

        Assumptions: untied models have an lm_head of vocab x hidden; "llama" MLPs are gated
        (gate, up, down: 3 x hidden x intermediate) without biases and use RMSNorm (one weight
        vector of hidden per norm, two per layer plus a final one); `attention_bias` adds q/k/v
        biases (Qwen2); "opt" has fc1/fc2 with biases, biases on all attention projections,
        LayerNorm (weight + bias) and learned positions of max_position + 2 rows; MoE layers hold
        a router (hidden x experts) plus routed and shared gated experts of
        `moe_intermediate_size`; "deepseek_v3" uses MLA projections with their two norms and
        excludes the multi-token-prediction module (as the published 671B does). Rotary
        embeddings have no parameters.
        """
        h, L, nh, hd = self.hidden_size, self.num_layers, self.num_heads, self.head_dim
        opt = self.arch == "opt"
        emb = self.vocab_size * h + (0 if self.tie_word_embeddings else self.vocab_size * h)
        if opt:
            emb += (self.max_position + 2) * h
        if self.is_mla:
            rope = self.qk_rope_head_dim
            vd = self.v_head_dim or hd
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * hd
                 if self.q_lora_rank else h * nh * hd)
            kv = (h * (self.kv_lora_rank + rope) + self.kv_lora_rank
                  + self.kv_lora_rank * nh * (hd - rope + vd))
            attn = q + kv + nh * vd * h
        else:
            kvh = self.num_kv_heads
            attn = h * nh * hd + 2 * h * kvh * hd + nh * hd * h
            if opt:
                attn += nh * hd + 2 * kvh * hd + h
            elif self.attention_bias:
                attn += nh * hd + 2 * kvh * hd
        norms = 4 * h if opt else 2 * h
        final_norm = 2 * h if opt else h
        dense_mlp = (2 * h * self.intermediate_size + self.intermediate_size + h if opt
                     else 3 * h * self.intermediate_size)
        expert = 3 * h * self.expert_intermediate_size
        n_moe = self.num_moe_layers
        n_dense = L - n_moe
        moe_common = h * self.num_experts + self.num_shared_experts * expert
        total = (emb + final_norm + L * (attn + norms) + n_dense * dense_mlp
                 + n_moe * (moe_common + self.num_experts * expert))
        active = total - n_moe * (self.num_experts - self.experts_per_token) * expert
        return int(total), int(active)

    # -- Hugging Face config.json ---------------------------------------------------------
    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any] | str | os.PathLike[str], id: str | None = None
    ) -> ModelPreset:
        """A preset from a Hugging Face config.json (a dict or a path), parameters counted.

        Read: num_hidden_layers, num_attention_heads, num_key_value_heads (default
        num_attention_heads), head_dim (default hidden_size / num_attention_heads), torch_dtype
        or dtype, vocab_size, intermediate_size (OPT: ffn_dim), num_local_experts /
        n_routed_experts / num_experts, moe_intermediate_size, num_experts_per_tok,
        n_shared_experts, first_k_dense_replace, tie_word_embeddings, kv_lora_rank,
        qk_rope_head_dim, qk_nope_head_dim, v_head_dim, q_lora_rank, sliding_window,
        max_position_embeddings. An fp8 `quantization_config` makes the weights fp8.
        """
        where = "model config"
        if not isinstance(config, Mapping):
            path = where = os.fspath(config)
            try:
                with open(path, encoding="utf-8") as f:
                    config = json.load(f)
            except (OSError, ValueError, RecursionError) as e:  # ValueError: not UTF-8 / JSON
                raise ValueError(f"model config {path!r} cannot be read: {e}") from e
            if not isinstance(config, Mapping):
                raise ValueError(f"model config {path!r} is not a JSON object")
        c = dict(config)
        text = c.get("text_config")
        if isinstance(text, Mapping):  # multimodal wrappers nest the language model
            c = {**{k: v for k, v in c.items() if k != "text_config"}, **text}
        model_type = str(c.get("model_type", "")).lower()

        def need(*keys: str) -> int:
            for k in keys:
                if c.get(k) is not None:
                    return int(c[k])
            raise ValueError(f"model config lacks {' / '.join(keys)}")

        # the weights need the embedding and hidden sizes, KV sizing does not: a config with
        # only the attention (and state) fields makes a preset whose weights are unknown,
        # which direct KV sizes (--kv-mem-gib) can plan and budget rules refuse
        weightless = [k for k in ("vocab_size", "hidden_size")
                      if c.get(k) is None and not (k == "hidden_size"
                                                   and (c.get("n_embd") or c.get("d_model")))]
        layers = need("num_hidden_layers", "n_layer", "num_layers")
        heads = need("num_attention_heads", "n_head")
        hidden = (int(c.get("hidden_size") or c.get("n_embd") or c.get("d_model") or 0)
                  if c.get("head_dim") else need("hidden_size", "n_embd", "d_model"))
        kv_heads = int(c.get("num_key_value_heads") or heads)
        kv_lora = int(c.get("kv_lora_rank") or 0)
        rope = int(c.get("qk_rope_head_dim") or 0)
        if kv_lora and c.get("qk_nope_head_dim") is not None:
            head_dim = int(c["qk_nope_head_dim"]) + rope
        elif c.get("head_dim"):
            head_dim = int(c["head_dim"])
        else:
            if hidden % heads:
                raise ValueError(f"hidden_size {hidden} is not a multiple of "
                                 f"num_attention_heads {heads}; give head_dim")
            head_dim = hidden // heads
        dtype_name = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16").lower()
        weight_dtype = _HF_DTYPES.get(dtype_name.replace("torch.", ""), "bf16")
        weight_dtype = weight_dtype_from_quant(c.get("quantization_config"), weight_dtype,
                                               where)
        experts = int(c.get("num_local_experts") or c.get("n_routed_experts")
                      or c.get("num_experts") or 0)
        moe_inter = int(c.get("moe_intermediate_size") or 0)
        shared = int(c.get("n_shared_experts") or 0)
        if not shared and c.get("shared_expert_intermediate_size") and moe_inter:
            shared = round(int(c["shared_expert_intermediate_size"]) / moe_inter)
        arch = ("opt" if model_type == "opt"
                else "deepseek_v3" if kv_lora else "llama")
        intermediate = int(c.get("intermediate_size") or c.get("ffn_dim") or 4 * hidden)
        window = c.get("sliding_window")
        if c.get("use_sliding_window") is False:
            window = None
        name = str(c.get("_name_or_path") or c.get("name") or model_type or "custom")
        preset = cls(
            id=(id or name.split("/")[-1]).lower(), name=name.split("/")[-1],
            num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
            hidden_size=hidden, intermediate_size=intermediate,
            vocab_size=int(c.get("vocab_size") or 0),
            max_position=int(c.get("max_position_embeddings") or 2048),
            num_params=0.0, weight_dtype=weight_dtype, kv_lora_rank=kv_lora,
            qk_rope_head_dim=rope, sliding_window=int(window) if window else None,
            num_experts=experts,
            experts_per_token=int(c.get("num_experts_per_tok") or 0) if experts else 0,
            source="config.json", arch=arch,
            tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),  # HF default
            attention_bias=bool(c.get("attention_bias", model_type.startswith("qwen2"))),
            moe_intermediate_size=moe_inter if experts else 0,
            num_shared_experts=shared if experts else 0,
            first_k_dense=int(c.get("first_k_dense_replace") or 0) if experts else 0,
            q_lora_rank=int(c.get("q_lora_rank") or 0),
            v_head_dim=int(c.get("v_head_dim") or 0) if kv_lora else 0,
        )
        if weightless:
            return replace(preset, weights_unknown=f"{where} lacks {', '.join(weightless)}")
        total, active = preset.count_params()
        return replace(preset, num_params=float(total),
                       active_params=float(active) if experts else 0.0)

    def to_hf_config(self) -> dict[str, Any]:
        """The fields `from_hf_config` reads, in Hugging Face spelling (a round trip is exact
        for the architecture; parameter counts are recomputed, not carried)."""
        model_type = {"opt": "opt", "deepseek_v3": "deepseek_v3"}.get(self.arch, "llama")
        if self.arch == "llama" and self.is_moe:
            model_type = "mixtral"
        elif self.arch == "llama" and self.attention_bias:
            model_type = "qwen2"
        elif self.arch == "llama" and self.sliding_window:
            model_type = "mistral"
        cfg: dict[str, Any] = {
            "_name_or_path": self.name, "model_type": model_type,
            "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size, "max_position_embeddings": self.max_position,
            "torch_dtype": _TO_HF_DTYPE[self.weight_dtype],
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "sliding_window": self.sliding_window,
        }
        if self.arch == "opt":
            cfg["ffn_dim"] = self.intermediate_size
        if self.weight_dtype in _TO_HF_QUANT:
            cfg["quantization_config"] = dict(_TO_HF_QUANT[self.weight_dtype])
        if self.is_moe:
            key = "n_routed_experts" if self.arch == "deepseek_v3" else "num_local_experts"
            cfg[key] = self.num_experts
            cfg["num_experts_per_tok"] = self.experts_per_token
            if self.moe_intermediate_size:
                cfg["moe_intermediate_size"] = self.moe_intermediate_size
            if self.num_shared_experts:
                cfg["n_shared_experts"] = self.num_shared_experts
            if self.first_k_dense:
                cfg["first_k_dense_replace"] = self.first_k_dense
        if self.is_mla:
            cfg.update(kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim,
                       qk_nope_head_dim=self.head_dim - self.qk_rope_head_dim,
                       v_head_dim=self.v_head_dim or self.head_dim,
                       q_lora_rank=self.q_lora_rank or None)
        return cfg


@dataclass(frozen=True)
class GpuPreset:
    """One accelerator: memory, HBM bandwidth, dense bf16 FLOPs, and the host link (GB/s, one
    direction) used when preempted KV is swapped out.

    Memory is what the device reports to CUDA (`torch.cuda.get_device_properties(i)
    .total_memory`, the "total capacity" of PyTorch's out-of-memory message), in GiB: that is
    the `total` every engine's budget rule starts from, and it is less than the datasheet's
    decimal GB (an "80 GB" H100 reports 79.11 GiB, not 74.5). `mem_gb` keeps the datasheet
    figure; `reported_gib` the device's, with `mem_source` saying where it was seen; a preset
    without a public device report falls back to the datasheet GB converted to GiB (and says
    so)."""

    id: str
    name: str
    mem_gb: float
    bandwidth_tb_s: float
    bf16_tflops: float
    host_link_gb_s: float = 32.0
    source: str = ""
    reported_gib: float | None = None
    mem_source: str = "datasheet decimal GB (no public device-reported total found)"

    @property
    def mem_bytes(self) -> float:
        """Bytes the device reports to CUDA (the datasheet's GB where no report is known)."""
        return self.reported_gib * GiB if self.reported_gib is not None else self.mem_gb * GB

    @property
    def mem_gib(self) -> float:
        return self.mem_bytes / GiB

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_tb_s * 1e12

    @property
    def flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def host_link_bytes_s(self) -> float:
        return self.host_link_gb_s * 1e9


# fmt: off
MODELS: dict[str, ModelPreset] = {p.id: p for p in [
    ModelPreset("opt-13b", "OPT-13B", num_layers=40, num_heads=40, num_kv_heads=40, head_dim=128, hidden_size=5120, intermediate_size=20480, vocab_size=50272, max_position=2048, num_params=12.85e9, weight_dtype="fp16", arch="opt", tie_word_embeddings=True, source="facebook/opt-13b config.json; vLLM paper Table 1"),
    ModelPreset("opt-66b", "OPT-66B", num_layers=64, num_heads=72, num_kv_heads=72, head_dim=128, hidden_size=9216, intermediate_size=36864, vocab_size=50272, max_position=2048, num_params=65.7e9, weight_dtype="fp16", arch="opt", tie_word_embeddings=True, source="facebook/opt-66b config.json; vLLM paper Table 1"),
    ModelPreset("opt-175b", "OPT-175B", num_layers=96, num_heads=96, num_kv_heads=96, head_dim=128, hidden_size=12288, intermediate_size=49152, vocab_size=50272, max_position=2048, num_params=174.6e9, weight_dtype="fp16", arch="opt", tie_word_embeddings=True, source="OPT paper (arXiv 2205.01068) Table 1; vLLM paper Table 1"),
    ModelPreset("llama-3.1-8b", "Llama-3.1-8B", num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, hidden_size=4096, intermediate_size=14336, vocab_size=128256, max_position=131072, num_params=8.03e9, source="meta-llama/Llama-3.1-8B config.json"),
    ModelPreset("llama-3.1-70b", "Llama-3.1-70B", num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128, hidden_size=8192, intermediate_size=28672, vocab_size=128256, max_position=131072, num_params=70.55e9, source="meta-llama/Llama-3.1-70B config.json"),
    ModelPreset("qwen2.5-7b", "Qwen2.5-7B", num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128, hidden_size=3584, intermediate_size=18944, vocab_size=152064, max_position=131072, num_params=7.62e9, attention_bias=True, source="Qwen/Qwen2.5-7B config.json (7.61B published)"),
    ModelPreset("qwen2.5-72b", "Qwen2.5-72B", num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128, hidden_size=8192, intermediate_size=29568, vocab_size=152064, max_position=131072, num_params=72.71e9, attention_bias=True, source="Qwen/Qwen2.5-72B config.json (72.7B published)"),
    ModelPreset("mistral-7b", "Mistral-7B-v0.1", num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, hidden_size=4096, intermediate_size=14336, vocab_size=32000, max_position=32768, num_params=7.24e9, sliding_window=4096, source="mistralai/Mistral-7B-v0.1 config.json"),
    ModelPreset("mixtral-8x7b", "Mixtral-8x7B-v0.1", num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, hidden_size=4096, intermediate_size=14336, vocab_size=32000, max_position=32768, num_params=46.70e9, active_params=12.88e9, num_experts=8, experts_per_token=2, source="mistralai/Mixtral-8x7B-v0.1 config.json (all experts resident)"),
    ModelPreset("deepseek-v3", "DeepSeek-V3", num_layers=61, num_heads=128, num_kv_heads=128, head_dim=192, hidden_size=7168, intermediate_size=18432, vocab_size=129280, max_position=163840, num_params=671e9, active_params=37e9, weight_dtype="fp8", kv_lora_rank=512, qk_rope_head_dim=64, num_experts=256, experts_per_token=8, arch="deepseek_v3", moe_intermediate_size=2048, num_shared_experts=1, first_k_dense=3, q_lora_rank=1536, v_head_dim=128, source="deepseek-ai/DeepSeek-V3 config.json; arXiv 2412.19437 (671B / 37B active, fp8 weights)"),
]}

# -- current models, hybrids included. Layer layouts (which layers are full, sliding,
# chunked, linear attention or Mamba) live in kvcore.model.hybrid_presets under the same id;
# num_layers is the config's num_hidden_layers. Parameter counts are the published totals.
# "verified" on a source: every field checked against a stored copy of that config.json
# (tests/kvcore/test_preset_configs.py holds the transcribed fields).
HYBRID_ERA_MODELS: list[ModelPreset] = [
    ModelPreset("gpt-oss-20b", "gpt-oss-20b", num_layers=24, num_heads=64, num_kv_heads=8, head_dim=64, hidden_size=2880, intermediate_size=2880, vocab_size=201088, max_position=131072, num_params=20.9e9, active_params=3.6e9, weight_dtype="mxfp4", sliding_window=128, num_experts=32, experts_per_token=4, attention_bias=True, source="openai/gpt-oss-20b config.json (layer_types 12 x [sliding, full], quant_method mxfp4; verified); gpt-oss model card (20.9B / 3.6B active)"),
    ModelPreset("gpt-oss-120b", "gpt-oss-120b", num_layers=36, num_heads=64, num_kv_heads=8, head_dim=64, hidden_size=2880, intermediate_size=2880, vocab_size=201088, max_position=131072, num_params=116.8e9, active_params=5.1e9, weight_dtype="mxfp4", sliding_window=128, num_experts=128, experts_per_token=4, attention_bias=True, source="openai/gpt-oss-120b config.json (layer_types 18 x [sliding, full], quant_method mxfp4; verified); gpt-oss model card (116.8B / 5.1B active)"),
    ModelPreset("gemma-3-27b", "gemma-3-27b-it", num_layers=62, num_heads=32, num_kv_heads=16, head_dim=128, hidden_size=5376, intermediate_size=21504, vocab_size=262208, max_position=131072, num_params=27.4e9, sliding_window=1024, tie_word_embeddings=True, source="google/gemma-3-27b-it config.json (text_config: sliding_window 1024, sliding_window_pattern 6; verified); 27.4B with the vision tower"),
    ModelPreset("llama-4-scout", "Llama-4-Scout-17B-16E-Instruct", num_layers=48, num_heads=40, num_kv_heads=8, head_dim=128, hidden_size=5120, intermediate_size=8192, vocab_size=202048, max_position=10485760, num_params=109e9, active_params=17e9, num_experts=16, experts_per_token=1, source="meta-llama/Llama-4-Scout-17B-16E-Instruct config.json (text_config: attention_chunk_size 8192, every 4th layer NoPE full attention, max_position_embeddings 10485760; the base repo has 262144; verified); model card (109B / 17B active)"),
    ModelPreset("qwen3-next-80b-a3b", "Qwen3-Next-80B-A3B-Instruct", num_layers=48, num_heads=16, num_kv_heads=2, head_dim=256, hidden_size=2048, intermediate_size=5120, vocab_size=151936, max_position=262144, num_params=80e9, active_params=3e9, num_experts=512, experts_per_token=10, moe_intermediate_size=512, num_shared_experts=1, source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json (full_attention_interval 4, shared_expert_intermediate_size 512, no mamba_ssm_dtype; verified); model card (80B / 3B active)"),
    ModelPreset("qwen3.5-4b", "Qwen3.5-4B", num_layers=32, num_heads=16, num_kv_heads=4, head_dim=256, hidden_size=2560, intermediate_size=9216, vocab_size=248320, max_position=262144, num_params=4.66e9, tie_word_embeddings=True, source="Qwen/Qwen3.5-4B config.json (text_config: full_attention_interval 4, mamba_ssm_dtype float32; tie_word_embeddings true; verified); 4.66B is text 4.21B + vision tower 0.33B + MTP layer 0.12B counted from the same config"),
    ModelPreset("qwen3.5-27b", "Qwen3.5-27B", num_layers=64, num_heads=24, num_kv_heads=4, head_dim=256, hidden_size=5120, intermediate_size=17408, vocab_size=248320, max_position=262144, num_params=27.8e9, source="Qwen/Qwen3.5-27B config.json (text_config: full_attention_interval 4, mamba_ssm_dtype float32; verified); 27.8B is text 26.90B + vision tower 0.46B + MTP layer 0.43B counted from the same config"),
    ModelPreset("qwen3.5-0.8b", "Qwen3.5-0.8B", num_layers=24, num_heads=8, num_kv_heads=2, head_dim=256, hidden_size=1024, intermediate_size=3584, vocab_size=248320, max_position=262144, num_params=0.873e9, tie_word_embeddings=True, source="Qwen/Qwen3.5-0.8B config.json at revision 2fc06364 (text_config: layer_types 6 x [3 linear_attention, full_attention], 16 key / 16 value GDN heads of 128, kernel 4; vision_config depth 12, hidden 768), as transcribed in a public test fixture; mamba_ssm_dtype float32 as quoted with the same model's state layout in vLLM's benchmarks/kernels/bench_copy_mamba_state_block.py; 0.873B counted from that config (kvcore.model.hybrid_weights: text 0.75B + vision 0.10B + one MTP layer 0.02B)"),
    ModelPreset("qwen3.6-27b", "Qwen3.6-27B", num_layers=64, num_heads=24, num_kv_heads=4, head_dim=256, hidden_size=5120, intermediate_size=17408, vocab_size=248320, max_position=262144, num_params=27.8e9, source="Qwen/Qwen3.6-27B config.json (Qwen3_5ForConditionalGeneration, model_type qwen3_5: 64 layers = 48 Gated DeltaNet + 16 full attention, full_attention_interval 4, 24 / 4 heads of 256, 16 / 48 GDN heads, hidden 5120, 262,144 positions, as a public model card transcription quotes the family); the remaining text fields and the parameter count are Qwen3.5-27B's, whose architecture it reuses; its KV geometry reproduces club-3090 issues #294 / #295 (docs/validation.md)"),
    ModelPreset("qwen3.5-35b-a3b", "Qwen3.5-35B-A3B", num_layers=40, num_heads=16, num_kv_heads=2, head_dim=256, hidden_size=2048, intermediate_size=8192, vocab_size=248320, max_position=262144, num_params=35e9, active_params=3e9, num_experts=256, experts_per_token=8, moe_intermediate_size=512, num_shared_experts=1, source="Qwen/Qwen3.5-35B-A3B config.json (qwen3_5_moe: 40 layers, full_attention_interval 4, 16 / 2 heads of 256, 16 / 32 GDN heads of 128, 256 experts, 8 per token, moe and shared expert intermediate 512, hidden 2048), as a public Qwen3.5 configuration transcription gives them; its KV geometry reproduces the block size 2,096 vLLM prints with fp8 KV (kvsim issue 37) and club-3090 issues #612 / #652; 35B / 3B active from the model name (text counted: 34.66B)"),
    ModelPreset("nemotron-nano-9b-v2", "NVIDIA-Nemotron-Nano-9B-v2", num_layers=56, num_heads=40, num_kv_heads=8, head_dim=128, hidden_size=4480, intermediate_size=15680, vocab_size=131072, max_position=131072, num_params=8.89e9, source="nvidia/NVIDIA-Nemotron-Nano-9B-v2 config.json (hybrid_override_pattern: 27 M, 4 *, 25 -; n_groups 8, conv_kernel 4; verified; chunk_size 128 is the Nemotron-H family's, not found in a stored copy of this file); 8.89B as published and as kvcore.model.hybrid_weights counts it from the config (8,888,227,328)"),
    ModelPreset("qwen3-8b", "Qwen3-8B", num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, hidden_size=4096, intermediate_size=12288, vocab_size=151936, max_position=40960, num_params=8.19e9, source="Qwen/Qwen3-8B config.json (verified); model card (8.2B)"),
    ModelPreset("qwen3-32b", "Qwen3-32B", num_layers=64, num_heads=64, num_kv_heads=8, head_dim=128, hidden_size=5120, intermediate_size=25600, vocab_size=151936, max_position=40960, num_params=32.8e9, source="Qwen/Qwen3-32B config.json (verified); model card (32.8B)"),
    ModelPreset("llama-3.3-70b", "Llama-3.3-70B-Instruct", num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128, hidden_size=8192, intermediate_size=28672, vocab_size=128256, max_position=131072, num_params=70.55e9, source="meta-llama/Llama-3.3-70B-Instruct config.json (verified)"),
    ModelPreset("gemma-2-9b", "gemma-2-9b", num_layers=42, num_heads=16, num_kv_heads=8, head_dim=256, hidden_size=3584, intermediate_size=14336, vocab_size=256000, max_position=8192, num_params=9.24e9, sliding_window=4096, tie_word_embeddings=True, source="google/gemma-2-9b config.json (model_type gemma2: even layers sliding, odd layers full; verified)"),
    ModelPreset("ministral-8b", "Ministral-8B-Instruct-2410", num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, hidden_size=4096, intermediate_size=12288, vocab_size=131072, max_position=32768, num_params=8.02e9, sliding_window=32768, source="mistralai/Ministral-8B-Instruct-2410 config.json (verified; it gives one sliding_window 32768 for every layer); the 3 sliding : 1 full interleave is Mistral's params.json, run by vllm #9414 and #10591"),
]
MODELS.update({p.id: p for p in HYBRID_ERA_MODELS})
# Presets whose architecture `ModelPreset.count_params` does not describe (gated delta net and
# Mamba-2 layers, MLP-only layers, attention sinks and o_proj widths unlike hidden_size, vision
# towers, Llama 4's shared expert): their num_params is the published total, not a count, and
# a config.json round trip recounts them differently.
PUBLISHED_PARAMS_ONLY: frozenset[str] = frozenset({
    "gpt-oss-20b", "gpt-oss-120b", "gemma-3-27b", "llama-4-scout", "qwen3-next-80b-a3b",
    "qwen3.5-4b", "qwen3.5-27b", "nemotron-nano-9b-v2", "qwen3.5-0.8b", "qwen3.6-27b",
    "qwen3.5-35b-a3b"})

GPUS: dict[str, GpuPreset] = {g.id: g for g in [
    GpuPreset("a100-40gb", "A100-40GB SXM", mem_gb=40, bandwidth_tb_s=1.555, bf16_tflops=312, host_link_gb_s=32, source="NVIDIA A100 datasheet; PCIe Gen4 x16", reported_gib=39.50, mem_source="PyTorch OOM message on an A100 40GB: 'total capacity of 39.50 GiB' (github.com/TianheWu/CoSeR issue 10)"),
    GpuPreset("a100-80gb", "A100-80GB SXM", mem_gb=80, bandwidth_tb_s=2.039, bf16_tflops=312, host_link_gb_s=32, source="NVIDIA A100 datasheet; PCIe Gen4 x16", reported_gib=79.25, mem_source="PyTorch OOM message on an A100 80GB: '79.25 GiB total capacity' (github.com/levihsu/OOTDiffusion issue 235)"),
    GpuPreset("h100", "H100-SXM", mem_gb=80, bandwidth_tb_s=3.35, bf16_tflops=989, host_link_gb_s=64, source="NVIDIA H100 datasheet (dense bf16); PCIe Gen5 x16", reported_gib=79.11, mem_source="PyTorch OOM message on an H100 80GB under vLLM: 'total capacity of 79.11 GiB' (vllm-project/vllm issue 27508)"),
    GpuPreset("h200", "H200-SXM", mem_gb=141, bandwidth_tb_s=4.8, bf16_tflops=989, host_link_gb_s=64, source="NVIDIA H200 datasheet (dense bf16); PCIe Gen5 x16"),
    GpuPreset("gh200", "GH200 (H100 96 GB + Grace)", mem_gb=96, bandwidth_tb_s=4.0, bf16_tflops=989, host_link_gb_s=450, source="NVIDIA GH200 Grace Hopper datasheet (96 GB HBM3); NVLink-C2C 900 GB/s total, 450 GB/s each way"),
    GpuPreset("b200", "B200 (HGX)", mem_gb=180, bandwidth_tb_s=8.0, bf16_tflops=2250, host_link_gb_s=64, source="NVIDIA HGX B200 datasheet (dense bf16, 180 GB usable); PCIe Gen5 x16"),
    GpuPreset("l40s", "L40S", mem_gb=48, bandwidth_tb_s=0.864, bf16_tflops=362, host_link_gb_s=32, source="NVIDIA L40S datasheet (dense bf16); PCIe Gen4 x16"),
    GpuPreset("rtx-4090", "GeForce RTX 4090", mem_gb=24, bandwidth_tb_s=1.008, bf16_tflops=165.2, host_link_gb_s=32, source="NVIDIA Ada architecture whitepaper (bf16, fp32 accumulate); PCIe Gen4 x16", reported_gib=23.64, mem_source="PyTorch OOM message on an RTX 4090: 'total capacity of 23.64 GiB' (github.com/ali-vilab/VGen issue 104)"),
]}
# fmt: on

ALIASES: dict[str, str] = {
    "h100-sxm": "h100", "h100-80gb": "h100", "h200-sxm": "h200", "rtx4090": "rtx-4090",
    "4090": "rtx-4090", "mistral-7b-v0.1": "mistral-7b", "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "deepseek-v3-671b": "deepseek-v3",
}


def _lookup(table: dict, kind: str, name: str):
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in table:
        return table[key]
    raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")


def get_model(name: str) -> ModelPreset:
    """A model preset by id, case-insensitively (e.g. 'OPT-13B' -> opt-13b)."""
    return _lookup(MODELS, "model", name)


def get_gpu(name: str) -> GpuPreset:
    """A GPU preset by id, case-insensitively (alias: h100-sxm -> h100)."""
    return _lookup(GPUS, "gpu", name)
