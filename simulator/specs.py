"""`PolicySpec` and `EngineSpec`: what a user chooses about the KV policy and the engine.

Two of the frozen specs a run is composed of (with kvcore.model.memory.MemorySpec,
workloads.spec.WorkloadSpec and experiments.options.run_options.OutputSpec). Every field is one
command-line option and experiment-file key, declared with its help, allowed values and domain
(kvcore.contract.fields.spec_field) and validated once, when the spec is built.

They live in the simulator because they are the engine's configuration: `SimConfig`
(simulator/config.py) is their composition with the resolved pool and the engine's constants.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcore.contract.fields import (
    MAX_I32,
    MAX_SEED,
    MAX_TOKENS,
    Domain,
    check_fields,
    flag,
    spec_field,
)
from simulator import scheduler
from simulator.admission import ADMISSIONS
from simulator.attention_backends import ENGINES, AttentionBackend, get_backend
from simulator.latency_profiles import (
    SIMULATOR_DEFAULT,
    load_profile,
    roofline_constants,
)

# the registered names (simulator/admission.py, simulator/scheduler.py)
ADMISSION_MODES = tuple(ADMISSIONS.names())
SCHEDULES = tuple(scheduler.SCHEDULES.names())
PREEMPT_MODES = tuple(scheduler.PREEMPTS.names())


def caching_policies() -> list[str]:
    """The policies that keep a prefix cache (declared where each is registered)."""
    from kvcore.policies import POLICIES

    return [name for name in POLICIES.names() if POLICIES.get(name).caches_prefix]


def _policies() -> list[str]:
    from kvcore.policies import policy_names

    return list(policy_names())


def _mamba_cache_modes() -> list[str]:
    from kvcore.contract.policy import MAMBA_CACHE_MODES

    return list(MAMBA_CACHE_MODES)


#: --kv-layout: a hybrid model's own layer kinds, or every layer stored as full attention
#: (the pre-hybrid baseline: what engines did before their hybrid managers)
KV_LAYOUTS = ("hybrid", "full-attention")


def _placements() -> list[str]:
    from kvcore.contiguous.placement import placement_names

    return list(placement_names())


def _evictions() -> list[str]:
    from kvcore.sglang.node import EVICTION_PRIORITIES

    return list(EVICTION_PRIORITIES)


def _backends() -> list[str]:
    from simulator.attention_backends import BACKENDS

    return list(BACKENDS)


def _latencies() -> list[str]:
    from simulator.latency import LATENCY_MODELS

    return list(LATENCY_MODELS)


@dataclass(frozen=True)
class PolicySpec:
    """The KV allocation policy and its knobs."""

    policy: str = spec_field("paged", "KV allocation policy (see `kvsim policies`)",
                             choices=_policies, axis=True)
    placement: str = spec_field("first-fit", "address-space placement of contiguous policies",
                                choices=_placements, axis=True)
    eviction: str = spec_field("lru", "prefix-cache eviction order", choices=_evictions)
    page_size: int = spec_field(16, "tokens per page (block)", domain=Domain(1, MAX_TOKENS),
                                axis=True)
    # vLLM's switch, mapped onto the policy (the policy, which is hashed, carries it)
    enable_prefix_caching: bool | None = spec_field(
        None, "vLLM's switch: off turns paged and vllm into paged-nocache (blocks without a "
        "prefix cache); on requires a caching policy (default: as --policy says)",
        hashed=False)
    # hybrid models (docs/hybrid.md); simulator/hybrid.py checks each applies to the run's
    # model and policy (an option that would be ignored is an error), and leaves them out of
    # the summary of a full-attention model, whose columns stay as they were
    kv_layout: str = spec_field(
        "hybrid", "hybrid models: their own layer kinds, or every layer stored as full "
        "attention (the pre-hybrid baseline, to show what the hybrid layout saves)",
        choices=KV_LAYOUTS)
    swa_full_tokens_ratio: float | None = spec_field(
        None, "paged on a sliding-window / chunked model: SWA pool tokens per full-attention "
        "pool token (SGLang's option; default 0.8)", domain=Domain(0, 1, lo_inclusive=False))
    mamba_full_memory_ratio: float | None = spec_field(
        None, "paged on a Mamba / linear-attention model: state pool bytes per full-attention "
        "KV byte (SGLang's option; default 0.9)", domain=Domain(0, 1e3, lo_inclusive=False))
    max_mamba_cache_size: int | None = spec_field(
        None, "paged on a Mamba / linear-attention model: state slots, instead of "
        "--mamba-full-memory-ratio (SGLang's option)", domain=Domain(1, MAX_I32))
    mamba_cache_mode: str | None = spec_field(
        None, "vllm on a Mamba / linear-attention model: which states the prefix cache keeps "
        "(vLLM's option; default align)", choices=_mamba_cache_modes)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.mamba_full_memory_ratio is not None and self.max_mamba_cache_size is not None:
            raise ValueError("give one of --mamba-full-memory-ratio and --max-mamba-cache-size "
                             "(both size the state pool)")
        caching = self.enable_prefix_caching
        if caching is None:
            return
        cachers = caching_policies()
        if caching is False and self.policy in cachers:
            # vLLM with caching off allocates blocks and frees them at finish, nothing hashed
            # or kept: what paged-nocache does (admission is its own option)
            object.__setattr__(self, "policy", "paged-nocache")
        elif caching is True and self.policy not in cachers:
            raise ValueError(f"--enable-prefix-caching needs a policy with a prefix cache "
                             f"({', '.join(cachers)}), got --policy {self.policy}")


@dataclass(frozen=True)
class EngineSpec:
    """Scheduler, batch limits, latency model, measurement window, seed and checks."""

    # a preset of other options (experiments/options/engines.py applies it; an explicit option
    # wins): not read by the engine, so it changes no number itself
    engine: str | None = spec_field(
        None, "take this engine's defaults for --policy, --admission, --budget and "
        "--latency-profile (each given option wins; default: kvsim's, which are SGLang's "
        "policy, admission and budget with the profile following --budget)",
        choices=ENGINES, hashed=False)
    admission: str = spec_field("sglang", "admission / preemption mode",
                                choices=ADMISSION_MODES)
    schedule: str = spec_field("fcfs", "queue order", choices=SCHEDULES)
    preempt: str = spec_field("recompute", "what a preempted request does",
                              choices=PREEMPT_MODES)
    max_running_requests: int = spec_field(256, "max requests in a batch",
                                           domain=Domain(1, 1 << 20))
    max_prefill_tokens: int = spec_field(16384, "max prefill tokens per iteration",
                                         domain=Domain(1, MAX_I32))
    chunked_prefill_size: int = spec_field(8192, "prefill chunk size (0: no chunking)",
                                           domain=Domain(0, MAX_I32))
    latency: str = spec_field("roofline", "latency model", choices=_latencies)
    # which calibration of the roofline (simulator/latency_profiles.py, docs/latency.md)
    latency_profile: str | None = spec_field(
        None, "roofline calibration: vllm-paper-2023, vllm-hopper, sglang-hopper or a profile "
        "file from `kvsim calibrate` (default: by --budget: vllm -> vllm-hopper, others -> "
        "sglang-hopper)")
    attention_backend: str | None = spec_field(
        None, "attention kernel: its page cost and the page sizes it runs (default: the "
        "profile's)", choices=_backends)
    # overrides of the profile's constants (docs/latency.md, "Calibrating to your GPU")
    page_head_overhead_s: float | None = spec_field(
        None, "roofline: attention cost per KV page touched, per KV head on a rank, per layer "
        "(s; default: the backend's)", domain=Domain(0, 1e-3))
    iteration_overhead_s: float | None = spec_field(
        None, "roofline: fixed cost of every iteration (s): scheduling, kernel launches, host "
        "sync (default: the profile's)", domain=Domain(0, 10.0))
    # the closed-loop load of `vllm bench serve --max-concurrency` / sglang.bench_serving
    max_concurrency: int = spec_field(
        0, "most requests in flight (0: no bound): a request arriving beyond it waits for one "
        "to finish, as the engines' benchmark clients do", domain=Domain(0, MAX_I32))
    # measurement window (its end is the workload's --duration-s, when given)
    warmup_s: float = spec_field(0.0, "seconds after the first arrival excluded from averages",
                                 domain=Domain(0))
    drain: bool = spec_field(True, "run until every request finished (--no-drain stops at "
                             "the window end)")
    timeline_interval_s: float = spec_field(
        0.0, "timeline sampling interval in s (0: per iteration)",
        domain=Domain(0))
    seed: int = spec_field(0, "random seed (workload and engine)", domain=Domain(0, MAX_SEED),
                           axis=True)
    device: str = spec_field("cpu", "torch device for the page tables", hashed=False)
    check_invariants: bool = spec_field(False, "check every kvcore invariant after each "
                                        "iteration (slow)", hashed=False)

    def __post_init__(self) -> None:
        check_fields(self)
        check_device(self.device)
        if self.latency != "roofline":
            for name in ("latency_profile", "attention_backend", "page_head_overhead_s",
                         "iteration_overhead_s"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{flag(name)} is an option of --latency roofline, not "
                                     f"of --latency {self.latency}")
        elif self.latency_profile is not None:
            load_profile(self.latency_profile)  # an unknown name or a bad file fails here

    @property
    def profile_name(self) -> str:
        """The profile this spec runs (a bare spec, which knows no budget rule: the
        simulator's default)."""
        return self.latency_profile or SIMULATOR_DEFAULT

    def latency_constants(self, page_size: int) -> dict[str, float]:
        """The latency model's constants: the profile's with the backend's page cost, then the
        overrides given; ValueError when the backend cannot run `page_size`."""
        if self.latency != "roofline":
            return {}
        out = roofline_constants(load_profile(self.profile_name), self.attention_backend,
                                 page_size)
        for name in ("page_head_overhead_s", "iteration_overhead_s"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def page_rules(self) -> tuple[str, AttentionBackend] | None:
        """The engine whose page-size rules apply and the attention backend (None for a
        latency model without one)."""
        if self.latency != "roofline":
            return None
        return load_profile(self.profile_name).engine, get_backend(self.resolved_backend())

    def resolved_backend(self) -> str:
        """The attention backend this spec runs ("" for a latency model without one)."""
        if self.latency != "roofline":
            return ""
        return self.attention_backend or load_profile(self.profile_name).attention_backend


PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
LOAD_MODES = ("overlap", "block")


def _write_policies() -> list[str]:
    from kvcore.contract.tiers import WRITE_POLICIES

    return list(WRITE_POLICIES)


@dataclass(frozen=True)
class TierSpec:
    """Lower KV tiers behind the device pool (SGLang HiCache: host DRAM, then storage) and what
    moving KV between them costs. All sizes 0 (the default): no tier, today's results."""

    hicache_size: float = spec_field(
        0.0, "host KV tier in GiB per tensor-parallel rank (0: none; or --hicache-ratio)",
        domain=Domain(0, 1 << 16))
    hicache_ratio: float = spec_field(
        0.0, "host KV tier as a multiple of the device pool (0: none; or --hicache-size)",
        domain=Domain(0, 1 << 12), axis=True)
    storage_size: float = spec_field(
        0.0, "storage KV tier in GiB per rank behind the host tier (0: none)",
        domain=Domain(0, 1 << 20))
    hicache_write_policy: str = spec_field(
        "write_through", "when device KV is backed up to the host tier", choices=_write_policies)
    hicache_prefetch_policy: str = spec_field(
        "best_effort", "how long admission waits for a storage prefetch",
        choices=PREFETCH_POLICIES)
    hicache_prefetch_timeout_s: float = spec_field(
        1.0, "the `timeout` prefetch policy's wait in s", domain=Domain(0, 1e6))
    hicache_load: str = spec_field(
        "overlap", "host-to-device loads overlap compute layer by layer, or block",
        choices=LOAD_MODES)
    host_link_gbps: float = spec_field(
        0.0, "host<->device link in GB/s (0: the GPU preset's, PCIe or NVLink-C2C)",
        domain=Domain(0, 1e6))
    storage_gbps: float = spec_field(10.0, "storage tier read/write bandwidth in GB/s",
                                     domain=Domain(0, 1e6, lo_inclusive=False))
    storage_latency_us: float = spec_field(100.0, "storage tier latency per operation in us",
                                           domain=Domain(0, 1e9))
    shared_tier_size: float = spec_field(
        0.0, "a KV tier in GiB per rank shared by every replica of a fleet (Mooncake Store / "
        "LMCache server style), in place of --storage-size below each host tier (0: none; "
        "docs/fleet.md)", domain=Domain(0, 1 << 20))
    shared_tier_gbps: float = spec_field(
        25.0, "each replica's link to the shared tier in GB/s (default: one 200 Gb/s RDMA "
        "NIC)", domain=Domain(0, 1e6, lo_inclusive=False))
    shared_tier_latency_us: float = spec_field(
        100.0, "shared tier latency per operation in us", domain=Domain(0, 1e9))

    def __post_init__(self) -> None:
        check_fields(self)
        if self.hicache_size and self.hicache_ratio:
            raise ValueError(f"give one of --hicache-size ({self.hicache_size}) and "
                             f"--hicache-ratio ({self.hicache_ratio})")
        if self.storage_size and not (self.hicache_size or self.hicache_ratio):
            raise ValueError(f"--storage-size {self.storage_size} needs a host tier "
                             "(--hicache-size or --hicache-ratio)")
        if self.shared_tier_size and not self.enabled:
            raise ValueError(f"--shared-tier-size {self.shared_tier_size} needs a host tier "
                             "on each replica (--hicache-size or --hicache-ratio): its reads "
                             "go through the host")
        if self.shared_tier_size and self.storage_size:
            raise ValueError(f"give one of --storage-size ({self.storage_size}) and "
                             f"--shared-tier-size ({self.shared_tier_size}): the shared tier "
                             "is the level below each host tier")

    @property
    def enabled(self) -> bool:
        return bool(self.hicache_size or self.hicache_ratio)


def check_device(device: str) -> None:
    """cpu, or cuda[:N] with such a device present (torch's own errors are not one line)."""
    if device == "cpu":  # the default: no need to load torch to know it
        return
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        d = None
    if d is None or d.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r} is not one of: cpu, cuda, cuda:N")
    if d.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0 or (d.index is not None and d.index >= n):
            raise ValueError(f"--device {device!r}: no such CUDA device here ({n} found)")


__all__ = ["ADMISSION_MODES", "KV_LAYOUTS", "LOAD_MODES", "PREEMPT_MODES",
           "PREFETCH_POLICIES", "SCHEDULES", "EngineSpec", "PolicySpec", "TierSpec",
           "caching_policies", "check_device"]
