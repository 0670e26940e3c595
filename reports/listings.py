"""The one-line listings of `kvsim models`, `gpus`, `workloads` and `policies`."""

from __future__ import annotations


def model_lines() -> list[str]:
    """Model presets, one line each (hybrids: their layer mix)."""
    from kvcore.hybrid_presets import LAYOUTS
    from kvcore.presets import MODELS

    lines = []
    for m in MODELS.values():
        extra = " MLA" if m.is_mla else ""
        extra += f" MoE {m.num_experts}x" if m.is_moe else ""
        extra += f"  [{LAYOUTS[m.id].mix}]" if m.id in LAYOUTS else ""
        lines.append(f"{m.id:<19} {m.num_params / 1e9:7.1f}B  {m.num_layers:3d} layers  "
                     f"{m.num_kv_heads:3d} KV heads x {m.head_dim}  "
                     f"{m.kv_bytes_per_token():>9,} B/token KV  max ctx {m.max_position:,}"
                     f"{extra}")
    return lines


def gpu_lines() -> list[str]:
    """GPU presets, one line each."""
    from kvcore.presets import GPUS

    return [f"{g.id:<10} {g.name:<18} {g.mem_gb:5.0f} GB ({g.mem_gib:6.2f} GiB to CUDA)  "
            f"{g.bandwidth_tb_s:5.2f} TB/s  {g.bf16_tflops:6.0f} TFLOPS bf16"
            for g in GPUS.values()]


def workload_lines() -> list[str]:
    """Built-in workloads and bundled traces, one line each."""
    from workloads import list_workloads

    return [f"{name:<18} {desc}" for name, desc in list_workloads().items()]


def policy_lines() -> list[str]:
    """The policies and when to pick each, then the placements of the contiguous ones."""
    from kvcore.policies import policy_help
    from kvcore.policies.placement import placement_names

    return [*(f"{name:<18} {when}" for name, when in policy_help().items()),
            f"(placements for contiguous-*: {', '.join(placement_names())})"]


__all__ = ["gpu_lines", "model_lines", "policy_lines", "workload_lines"]
