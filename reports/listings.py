"""The one-line listings of `kvsim models`, `gpus`, `workloads` and `policies`."""

from __future__ import annotations


def model_lines() -> list[str]:
    """Model presets, one line each, bf16 KV on one GPU. A hybrid shows the KV bytes per
    token of its attention layers only (a Mamba / linear-attention or MLP-only layer holds
    none), its state bytes per request (in current vLLM's state dtypes, kvcore.model.state_dtypes)
    and its layer mix."""
    from kvcore.model.hybrid_presets import LAYOUTS
    from kvcore.model.presets import MODELS
    from kvcore.model.state_dtypes import resolve_state_dtypes
    from kvcore.model.vllm_rules import vllm_rules

    rules = vllm_rules()
    lines = []
    for m in MODELS.values():
        extra = " MLA" if m.is_mla else ""
        extra += f" MoE {m.num_experts}x" if m.is_moe else ""
        layout = LAYOUTS.get(m.id)
        kv = m.kv_bytes_per_token()
        if layout is not None and layout.is_hybrid:
            layout = resolve_state_dtypes(layout, "vllm", rules)
            kv = layout.kv_bytes_per_token()
            state = layout.state_bytes_per_request()
            if state:
                extra += f"  + {state / 2**20:,.1f} MiB state/request"
            extra += f"  [{layout.mix}]"
        lines.append(f"{m.id:<19} {m.num_params / 1e9:7.1f}B  {m.num_layers:3d} layers  "
                     f"{m.num_kv_heads:3d} KV heads x {m.head_dim}  "
                     f"{kv:>9,} B/token KV  max ctx {m.max_position:,}{extra}")
    # the state figure depends on the engine and its version: say which one the list uses
    lines.append(f"(KV in bf16 on one GPU; state per request as vLLM v{rules.version} stores "
                 "it: `kvsim plan --budget sglang` for SGLang's, e.g. its fp32 recurrent "
                 "state)")
    return lines


def gpu_lines() -> list[str]:
    """GPU presets, one line each."""
    from kvcore.model.presets import GPUS

    return [f"{g.id:<10} {g.name:<18} {g.mem_gb:5.0f} GB ({g.mem_gib:6.2f} GiB to CUDA)  "
            f"{g.bandwidth_tb_s:5.2f} TB/s  {g.bf16_tflops:6.0f} TFLOPS bf16"
            for g in GPUS.values()]


def workload_lines() -> list[str]:
    """Built-in workloads and bundled traces, one line each."""
    from workloads import list_workloads

    return [f"{name:<18} {desc}" for name, desc in list_workloads().items()]


def policy_lines() -> list[str]:
    """The policies and when to pick each, then the placements of the contiguous ones."""
    from kvcore.contiguous.placement import placement_names
    from kvcore.policies import policy_help

    return [*(f"{name:<18} {when}" for name, when in policy_help().items()),
            f"(placements for contiguous-*: {', '.join(placement_names())})"]


__all__ = ["gpu_lines", "model_lines", "policy_lines", "workload_lines"]
