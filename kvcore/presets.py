"""Model and GPU presets: the one table that the KV pool, the latency model and the planner read.

Each preset is a frozen dataclass written on one line, so the table reads like a datasheet.
Derived quantities (KV bytes per token, weight bytes) are properties, never stored, so they
cannot drift from the architecture they come from. Sources are in docs/presets.md.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9  # vendors quote decimal gigabytes
GiB = 2**30

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def dtype_bytes(name: str) -> int:
    """Bytes per element of a KV / weight dtype name (bf16, fp16, fp8, fp32)."""
    key = name.lower()
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelPreset:
    """A decoder-only transformer, as far as KV memory and a roofline latency model care.

    `num_params` is the total resident parameter count (all MoE experts), `active_params` the
    count touched per token (equal for dense models). MLA models (DeepSeek-V3) cache one latent
    of `kv_lora_rank + qk_rope_head_dim` per token and layer instead of a K/V pair, and that
    latent is replicated on every tensor-parallel rank.
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

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def params_per_token(self) -> float:
        """Parameters whose weights each token multiplies (MoE: the active experts only)."""
        return self.active_params or self.num_params

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads on one tensor-parallel rank: split across ranks, at least one (replicated)."""
        if tp < 1:
            raise ValueError(f"tp must be a positive integer, got {tp}")
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_layer(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes one token's KV takes in one layer on one rank."""
        elem = dtype_bytes(kv_dtype)
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * elem
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * elem

    def kv_bytes_per_token(self, kv_dtype: str = "bf16", tp: int = 1) -> int:
        """Bytes one token's KV takes across all layers on one rank (the pool's unit of cost)."""
        return self.num_layers * self.kv_bytes_per_token_layer(kv_dtype, tp)

    def weight_bytes(self, tp: int = 1) -> float:
        """Resident weight bytes on one rank (all experts; weights split evenly over tp)."""
        return self.num_params * dtype_bytes(self.weight_dtype) / tp


@dataclass(frozen=True)
class GpuPreset:
    """One accelerator: memory (decimal GB, as vendors quote it), HBM bandwidth, dense bf16 FLOPs,
    and the host link used when preempted KV is swapped out."""

    id: str
    name: str
    mem_gb: float
    bandwidth_tb_s: float
    bf16_tflops: float
    host_link_gb_s: float = 32.0
    source: str = ""

    @property
    def mem_bytes(self) -> float:
        return self.mem_gb * GB

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_tb_s * 1e12

    @property
    def flops(self) -> float:
        return self.bf16_tflops * 1e12


# fmt: off
MODELS: dict[str, ModelPreset] = {p.id: p for p in [
    ModelPreset("opt-13b", "OPT-13B", num_layers=40, num_heads=40, num_kv_heads=40, head_dim=128, hidden_size=5120, intermediate_size=20480, vocab_size=50272, max_position=2048, num_params=12.85e9, weight_dtype="fp16", source="facebook/opt-13b config.json; vLLM paper Table 1"),
    ModelPreset("llama-3.1-8b", "Llama-3.1-8B", num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, hidden_size=4096, intermediate_size=14336, vocab_size=128256, max_position=131072, num_params=8.03e9, source="meta-llama/Llama-3.1-8B config.json"),
]}

GPUS: dict[str, GpuPreset] = {g.id: g for g in [
    GpuPreset("a100-40gb", "A100-40GB SXM", mem_gb=40, bandwidth_tb_s=1.555, bf16_tflops=312, host_link_gb_s=32, source="NVIDIA A100 datasheet"),
    GpuPreset("h100", "H100-SXM", mem_gb=80, bandwidth_tb_s=3.35, bf16_tflops=989, host_link_gb_s=64, source="NVIDIA H100 datasheet (dense bf16)"),
]}
# fmt: on


def _lookup(table: dict, kind: str, name: str):
    key = name.strip().lower()
    if key in table:
        return table[key]
    raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")


def get_model(name: str) -> ModelPreset:
    """A model preset by id, case-insensitively (e.g. 'OPT-13B' -> opt-13b)."""
    return _lookup(MODELS, "model", name)


def get_gpu(name: str) -> GpuPreset:
    """A GPU preset by id, case-insensitively."""
    return _lookup(GPUS, "gpu", name)
