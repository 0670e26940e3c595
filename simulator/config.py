"""`SimConfig`: what one simulation needs besides its workload, composed of one frozen spec
per concern, each validated once, where it is defined:

* `policy`  (`PolicySpec`, simulator/specs.py): the KV policy, placement, eviction, page size;
* `pool`    (`PoolSpec`, here): the KV pool resolved from the memory options (model, GPU, TP,
  KV dtype, slots, maximum context);
* `engine`  (`EngineSpec`, simulator/specs.py): scheduler, batch limits, latency model,
  measurement window, seed, device, checks;
* `admission_params` (`AdmissionParams`, simulator/admission.py): constants of the engines
  imitated that no option exposes (SGLang's new-token ratio, vLLM's watermark);
* `tuning`  (`EngineTuning`, here): the simulator's own bounds (checks, timeline, stretches,
  the livelock guard);
* `tier`    (`TierSpec`, simulator/specs.py): lower KV tiers (host, storage) and their links;
* `duration_s`: the workload's span of arrivals, which also ends the measurement window;
* `layout` (`RunLayout`, simulator/hybrid.py): the hybrid layout those options resolve to,
  resolved once (or handed over already resolved from the same options) and read by the
  policy's config, the latency model and the summary; not an option.

The experiments layer hands over the user's specs as they are (no field is copied);
`SimConfig.of(**flat)` builds one from flat keyword arguments (tests, benchmarks, the
validation suite) and `to_dict()` is the flat form a summary carries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kvcore.model.vllm_rules import DEFAULT_VLLM_VERSION, check_vllm_version
from simulator.admission import AdmissionParams
from simulator.hybrid import UNRESOLVED, RunLayout, check_hybrid_options, resolve_layout
from simulator.specs import EngineSpec, PolicySpec, TierSpec


def _positive(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{type(owner).__name__}.{name} must be a positive integer, "
                             f"got {value!r}")


@dataclass(frozen=True)
class PoolSpec:
    """The KV pool a run simulates: whose KV (model, TP degree, dtype; the GPU for the latency
    model) and how much of it. `kv_tokens` is resolved from the memory options (a direct size
    or a budget rule, kvcore.model.planner.resolve_kv_tokens); `max_context_len` 0 means the
    model's maximum position. `kv_bytes` is the KV budget of one rank in bytes, which a
    hybrid model's pools are sized from (kvcore.model.hybrid_plan; the planner's
    kv_budget_bytes_per_rank); 0 means `kv_tokens` slots of every layer as full attention.
    A hybrid model also reads the vLLM version whose rules the `vllm` policy follows and the
    state dtype options (None: the engine's defaults; kvcore.model.state_dtypes)."""

    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tp: int = 1
    kv_dtype: str = "bf16"
    kv_tokens: int = 65536
    max_context_len: int = 0
    kv_bytes: int = 0
    vllm_version: str = DEFAULT_VLLM_VERSION
    mamba_cache_dtype: str | None = None
    mamba_ssm_cache_dtype: str | None = None

    def __post_init__(self) -> None:
        _positive(self, "tp", "kv_tokens")
        check_vllm_version(self.vllm_version)
        if isinstance(self.kv_bytes, bool) or not isinstance(self.kv_bytes, int) \
                or self.kv_bytes < 0:
            raise ValueError(f"PoolSpec.kv_bytes must be an integer >= 0, got "
                             f"{self.kv_bytes!r}")
        if isinstance(self.max_context_len, bool) or self.max_context_len < 0:
            raise ValueError(f"PoolSpec.max_context_len must be >= 0, got "
                             f"{self.max_context_len!r}")


@dataclass(frozen=True)
class EngineTuning:
    """Bounds of the simulator itself that no option exposes."""

    check_every: int = 1  # with check_invariants: check every N-th iteration / decode stretch
    max_timeline_rows: int = 20000
    max_steps_per_stretch: int = 4096  # 1: step one iteration at a time (the reference)
    # livelock guard: this many preemptions in a row with no request making progress is a bug
    max_stalled_preemptions: int = 10_000

    def __post_init__(self) -> None:
        _positive(self, "check_every", "max_timeline_rows", "max_steps_per_stretch",
                  "max_stalled_preemptions")


_PARTS = {"policy": PolicySpec, "pool": PoolSpec, "engine": EngineSpec,
          "admission_params": AdmissionParams, "tuning": EngineTuning, "tier": TierSpec}


@dataclass(frozen=True)
class SimConfig:
    """One engine over one workload: the six specs, the window's end and the layout they
    resolve to."""

    policy: PolicySpec = field(default_factory=PolicySpec)
    pool: PoolSpec = field(default_factory=PoolSpec)
    engine: EngineSpec = field(default_factory=EngineSpec)
    admission_params: AdmissionParams = field(default_factory=AdmissionParams)
    tuning: EngineTuning = field(default_factory=EngineTuning)
    tier: TierSpec = field(default_factory=TierSpec)
    duration_s: float = 0.0  # 0: the window ends at the last arrival
    # the layout the policy and pool options resolve to (simulator/hybrid.py), resolved here
    # once (or handed over by whoever resolved it from the same options) and read by every
    # part of the run; not an option, so no part of the config's equality or flat form
    layout: RunLayout = field(default=UNRESOLVED, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.duration_s >= 0:
            raise ValueError(f"--duration-s must be >= 0, got {self.duration_s!r}")
        # the hybrid options against the model and policy (simulator/hybrid.py)
        check_hybrid_options(self.policy, self.pool.model, self.tier.enabled,
                             self.pool.vllm_version)
        pool = self.pool
        object.__setattr__(self, "layout", resolve_layout(
            self.policy, pool.model, pool.vllm_version, pool.mamba_cache_dtype,
            pool.mamba_ssm_cache_dtype, known=self.layout))

    @classmethod
    def of(cls, **flat: Any) -> SimConfig:
        """A SimConfig from flat keyword arguments, each routed to the spec that has a field
        of that name (an unknown name is an error naming the known ones)."""
        parts: dict[str, dict[str, Any]] = {name: {} for name in _PARTS}
        top: dict[str, Any] = {}
        for key, value in flat.items():
            owner = _OWNER.get(key)
            if owner is None:
                raise ValueError(f"unknown SimConfig field {key!r}; known: "
                                 f"{', '.join(_OWNER)}")
            if owner == "":
                top[key] = value
            else:
                parts[owner][key] = value
        return cls(**{name: _PARTS[name](**vals) for name, vals in parts.items()}, **top)

    def replace(self, **flat: Any) -> SimConfig:
        """This config with some flat fields changed."""
        return SimConfig.of(**{**self.to_dict(), **flat})

    def to_dict(self) -> dict[str, Any]:
        """Every field, flat (the keys a summary carries)."""
        out: dict[str, Any] = {}
        for name in _PARTS:
            out.update(asdict(getattr(self, name)))
        out["duration_s"] = self.duration_s
        return out


# flat field name -> the part that owns it ("" for SimConfig's own)
_OWNER: dict[str, str] = {f.name: part for part, cls in _PARTS.items() for f in fields(cls)}
_OWNER["duration_s"] = ""
assert len(_OWNER) == sum(len(fields(c)) for c in _PARTS.values()) + 1, "a field name is shared"

#: every flat field name a summary row echoes from its config
FLAT_FIELDS: frozenset[str] = frozenset(_OWNER)
