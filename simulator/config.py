"""SimConfig: every knob of one simulated engine, with the defaults engines ship with."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from simulator.admission import ADMISSIONS

ADMISSION_MODES = tuple(ADMISSIONS)  # registered strategies (simulator/admission.py)
SCHEDULES = ("fcfs", "lpm")
PREEMPT_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class SimConfig:
    """One engine: memory policy, scheduler, latency model and measurement window.

    `kv_tokens` is the pool size in slots (the CLI resolves it from --kv-tokens, --num-pages,
    --kv-mem-gib or a budget rule). `max_context_len` 0 means the model's maximum position.
    """

    policy: str = "paged"
    placement: str = "first-fit"
    page_size: int = 16
    eviction: str = "lru"
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = 1
    kv_dtype: str = "bf16"
    kv_tokens: int = 65536
    max_context_len: int = 0
    admission: str = "sglang"
    schedule: str = "fcfs"
    preempt: str = "recompute"
    max_running_requests: int = 256
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int = 8192
    latency: str = "roofline"
    warmup_s: float = 0.0
    duration_s: float = 0.0  # 0: the window ends at the last arrival
    drain: bool = True
    seed: int = 0
    device: str = "cpu"
    check_invariants: bool = False
    check_every: int = 1  # with check_invariants: check every N-th iteration / decode stretch
    timeline_interval_s: float = 0.0  # 0: one sample per engine iteration (bounded)
    max_timeline_rows: int = 20000
    new_token_ratio_init: float = 0.7
    new_token_ratio_min: float = 0.1
    new_token_ratio_decay: float = 0.001
    vllm_watermark: float = 0.01
    max_steps_per_stretch: int = 4096
    # livelock guard: this many preemptions in a row with no request making progress is a bug
    max_stalled_preemptions: int = 10_000

    def __post_init__(self) -> None:
        checks = {
            "admission": (self.admission, ADMISSION_MODES),
            "schedule": (self.schedule, SCHEDULES),
            "preempt": (self.preempt, PREEMPT_MODES),
        }
        for name, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"--{name} {value!r} is not one of: {', '.join(allowed)}")
        for name in ("page_size", "tp", "kv_tokens", "max_running_requests",
                     "max_prefill_tokens", "check_every", "max_stalled_preemptions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, "
                                 f"got {value!r}")
        if self.chunked_prefill_size < 0 or self.max_context_len < 0:
            raise ValueError("--chunked-prefill-size and --max-context-len must be >= 0")
        if self.warmup_s < 0 or self.duration_s < 0:
            raise ValueError("--warmup and --duration must be >= 0")

    def to_dict(self) -> dict:
        return asdict(self)
