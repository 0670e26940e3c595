"""`RunOptions`: every user-facing option of `kvsim run / sweep / compare / plan`, in one place.

Each field is one command-line option (`page_size` is `--page-size`) and one key of an
experiment TOML file (`--config exp.toml`, keys spelled either way). The field's metadata holds
its help text, extra flag spellings and the allowed values, so the CLI generates its options
from this class and nothing else holds a name or a default.

`to_workload_spec()` and `to_sim_config()` translate to the packages' own config objects;
memory options are resolved here through `kvcore.planner.resolve_kv_tokens`:

* `--kv-tokens N` slots, `--num-pages N` (alias `--num-gpu-blocks-override`) pages of
  `--page-size`, or `--kv-mem-gib G` of KV for the whole tensor-parallel group; at most one;
* otherwise a budget rule `--budget {vllm,sglang,trtllm,lmdeploy}` with `--mem-fraction F`
  on the `--gpu` preset (or `--gpu-mem-gib`); with no memory option at all the `sglang` rule
  (mem_fraction_static picked by TP size, as SGLang does) is used: DEFAULT_BUDGET.
"""

from __future__ import annotations

import hashlib
import json
import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kvcore.planner import (
    BUDGET_RULES,
    DEFAULT_ACTIVATION_PEAK_GIB,
    DEFAULT_NON_TORCH_GIB,
    resolve_kv_tokens,
)
from kvcore.presets import DTYPE_BYTES, GPUS, MODELS, ModelPreset, get_model
from simulator.config import ADMISSION_MODES, PREEMPT_MODES, SCHEDULES, SimConfig
from workloads.spec import DEFAULT_WORKLOAD, WorkloadSpec

DEFAULT_BUDGET = "sglang"


def _policies() -> list[str]:
    from kvcore.policies import policy_names

    return list(policy_names())


def _placements() -> list[str]:
    from kvcore.policies.placement import placement_names

    return list(placement_names())


def _latencies() -> list[str]:
    from simulator.latency import LATENCY_MODELS

    return list(LATENCY_MODELS)


def _evictions() -> list[str]:
    from kvcore.radix_cache import EVICTION_PRIORITIES

    return list(EVICTION_PRIORITIES)


def _formats() -> list[str]:
    from workloads import TRACE_FORMATS

    return list(TRACE_FORMATS)


def _workloads() -> list[str]:
    from workloads import list_workloads

    return list(list_workloads())


def opt(default: Any, help: str, *, flags: tuple[str, ...] = (), choices: Any = None,
        group: str = "sim", sim: bool = True) -> Any:
    """A dataclass field with CLI metadata. `choices` is a tuple or a zero-argument callable
    (registries are read lazily); `sim=False` marks options that do not change the result
    (excluded from the config hash)."""
    meta = {"help": help, "flags": flags, "choices": choices, "group": group, "sim": sim}
    return field(default=default, metadata=meta)


@dataclass
class RunOptions:
    """Every option of one simulation (and of the planner); names are the CLI's."""

    # -- workload --------------------------------------------------------------------------
    workload: str = opt(DEFAULT_WORKLOAD, "built-in workload (see `kvsim workloads`)",
                        choices=_workloads, group="workload")
    trace: str | None = opt(None, "trace file to replay (wins over --workload)",
                            group="workload")
    format: str = opt("auto", "trace format", choices=_formats, group="workload")
    skip_bad_rows: bool = opt(False, "skip malformed trace rows instead of failing",
                              group="workload")
    rate: float | None = opt(None, "arrival rate per second (default: the workload's)",
                             group="workload")
    arrival: str | None = opt(None, "arrival process (default: trace times if any, else "
                              "poisson)", choices=("poisson", "gamma", "fixed", "trace"),
                              group="workload")
    cv: float = opt(1.0, "coefficient of variation of gamma arrivals", group="workload")
    rate_scale: float = opt(1.0, "trace replay speed-up", group="workload")
    duration: float | None = opt(None, "seconds of arrivals to generate; also ends the "
                                 "measurement window", group="workload")
    num_requests: int | None = opt(None, "number of requests (default: the workload's)",
                                   group="workload")
    max_new_tokens: int | None = opt(None, "cap on output tokens per request",
                                     group="workload")
    lengths: str | None = opt(None, "length model of synthetic workloads", choices=(
        "sharegpt", "alpaca", "sharegpt-real", "fixed", "uniform", "lognormal"),
        group="workload")
    input_len: int = opt(512, "mean prompt length (fixed/uniform/lognormal; tot root)",
                         group="workload")
    output_len: int = opt(128, "mean output length (fixed/uniform/lognormal)",
                          group="workload")
    spread: float = opt(0.5, "uniform lengths: mean x (1 -/+ spread)", group="workload")
    sigma: float = opt(1.0, "lognormal lengths: sigma", group="workload")
    prefix_len: int = opt(1024, "kshot: shared prefix length", group="workload")
    question_len: int = opt(128, "kshot: question length; tot: per-node instruction",
                            group="workload")
    num_prefixes: int = opt(1, "kshot: distinct shared prefixes", group="workload")
    num_turns: int = opt(4, "chat: turns per session", group="workload")
    turn_input_min: int = opt(256, "chat: min new input per turn", group="workload")
    turn_input_max: int = opt(512, "chat: max new input per turn", group="workload")
    think_time: float = opt(5.0, "chat: mean think time (s)", group="workload")
    system_len: int = opt(0, "chat: shared system prompt length", group="workload")
    depth: int = opt(2, "tot: levels below the root", group="workload")
    branching: int = opt(3, "tot: children per node", group="workload")
    level_interval: float = opt(2.0, "tot: delay between levels (s)", group="workload")
    num_samples: int = opt(4, "parallel-sampling: outputs per prompt", group="workload")
    # -- memory policy -----------------------------------------------------------------------
    policy: str = opt("paged", "KV allocation policy (see `kvsim policies`)",
                      choices=_policies)
    placement: str = opt("first-fit", "address-space placement of contiguous policies",
                         choices=_placements)
    eviction: str = opt("lru", "prefix-cache eviction order", choices=_evictions)
    page_size: int = opt(16, "tokens per page (block)")
    # -- model, hardware, memory ----------------------------------------------------------------
    model: str = opt("llama-3.1-8b", "model preset (see `kvsim models`)",
                     choices=lambda: sorted(MODELS))
    model_config: str | None = opt(None, "Hugging Face config.json to use instead of --model")
    gpu: str = opt("h100", "GPU preset (see `kvsim gpus`)", choices=lambda: sorted(GPUS))
    gpu_mem_gib: float | None = opt(None, "GPU memory in GiB (any GPU; overrides the preset's)")
    tp: int = opt(1, "tensor-parallel degree")
    kv_dtype: str = opt("bf16", "KV cache dtype", choices=lambda: sorted(DTYPE_BYTES))
    max_context_len: int | None = opt(None, "max context length (default: the model's "
                                      "maximum position)")
    kv_tokens: int | None = opt(None, "KV pool size in slots (tokens)")
    num_pages: int | None = opt(None, "KV pool size in pages of --page-size",
                                flags=("--num-gpu-blocks-override",))
    kv_mem_gib: float | None = opt(None, "KV memory of the TP group in GiB")
    budget: str | None = opt(None, f"budget rule sizing the KV pool (default "
                             f"{DEFAULT_BUDGET} when no size is given)",
                             choices=lambda: list(BUDGET_RULES))
    mem_fraction: float | None = opt(None, "the budget rule's fraction (default: the "
                                     "engine's)")
    activation_peak_gib: float = opt(DEFAULT_ACTIVATION_PEAK_GIB, "activation peak (GiB) "
                                     "for the vllm/trtllm rules")
    non_torch_gib: float = opt(DEFAULT_NON_TORCH_GIB, "non-torch memory (GiB) per GPU")
    # -- scheduler --------------------------------------------------------------------------------
    admission: str = opt("sglang", "admission / preemption mode", choices=ADMISSION_MODES)
    schedule: str = opt("fcfs", "queue order", choices=SCHEDULES)
    preempt: str = opt("recompute", "what a preempted request does", choices=PREEMPT_MODES)
    max_running_requests: int = opt(256, "max requests in a batch")
    max_prefill_tokens: int = opt(16384, "max prefill tokens per iteration")
    chunked_prefill_size: int = opt(8192, "prefill chunk size (0: no chunking)")
    latency: str = opt("roofline", "latency model", choices=_latencies)
    # -- measurement ----------------------------------------------------------------------------
    warmup: float = opt(0.0, "seconds after the first arrival excluded from averages")
    drain: bool = opt(True, "run until every request finished (--no-drain stops at the "
                      "window end)")
    timeline_interval: float = opt(0.0, "timeline sampling interval in s (0: per iteration)")
    seed: int = opt(0, "random seed (workload and engine)")
    device: str = opt("cpu", "torch device for the page tables", sim=False)
    check_invariants: bool = opt(False, "check every kvcore invariant after each iteration "
                                 "(slow)", sim=False)
    # -- output ---------------------------------------------------------------------------------
    out: str | None = opt(None, "output directory", group="output", sim=False)
    slo_ttft: float | None = opt(None, "TTFT p99 target (s) marked on the rate plot",
                                 group="output", sim=False)
    slo_tpot: float | None = opt(None, "TPOT p99 target (s) marked on the rate plot",
                                 group="output", sim=False)

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], base: RunOptions | None = None,
                     where: str = "option") -> RunOptions:
        """`base` (or the defaults) with `values` applied; keys may use dashes."""
        known = {f.name: f for f in fields(cls)}
        clean: dict[str, Any] = {}
        for key, value in values.items():
            name = key.replace("-", "_")
            if name == "num_gpu_blocks_override":
                name = "num_pages"
            if name not in known:
                raise ValueError(f"unknown {where} {key!r}; known: {', '.join(known)}")
            clean[name] = _coerce(known[name], value)
        return replace(base or cls(), **clean)

    def validate(self) -> RunOptions:
        """Raise ValueError naming the option and its allowed values."""
        for f in fields(self):
            value = getattr(self, f.name)
            choices = f.metadata.get("choices")
            if choices is None or value is None:
                continue
            allowed = list(choices() if callable(choices) else choices)
            v = value.lower() if isinstance(value, str) and f.name in ("model", "gpu") else value
            if f.name in ("model", "gpu"):
                from kvcore.presets import ALIASES

                v = ALIASES.get(v, v)
                if self.model_config and f.name == "model":
                    continue
            if v not in allowed:
                raise ValueError(f"{flag(f.name)} {value!r} is not one of: {', '.join(allowed)}")
        for name in ("page_size", "tp", "max_running_requests", "max_prefill_tokens"):
            _positive(name, getattr(self, name))
        for name in ("kv_tokens", "num_pages", "num_requests", "max_context_len",
                     "max_new_tokens"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        for name in ("rate", "duration", "kv_mem_gib"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"{flag(name)} must be a number > 0, got {v!r}")
        direct = [n for n in ("kv_tokens", "num_pages", "kv_mem_gib")
                  if getattr(self, n) is not None]
        if len(direct) > 1:
            raise ValueError(f"give at most one of --kv-tokens, --num-pages, --kv-mem-gib "
                             f"(got {', '.join(flag(n) for n in direct)})")
        if direct and (self.budget is not None or self.mem_fraction is not None):
            raise ValueError(f"{flag(direct[0])} sets the pool size directly; drop --budget / "
                             "--mem-fraction (allowed: one of --kv-tokens, --num-pages, "
                             "--kv-mem-gib, or --budget with --mem-fraction)")
        if self.mem_fraction is not None and not 0 < self.mem_fraction <= 1:
            raise ValueError(f"--mem-fraction must be in (0, 1], got {self.mem_fraction!r}")
        _check_ranges(self)
        return self

    # -- resolution -----------------------------------------------------------------------------
    def model_preset(self) -> ModelPreset:
        """The model; `--model-config` is loaded and registered in the preset table under its
        id (so SimConfig, which names models by id, finds it), in every process that asks."""
        if self.model_config:
            preset = ModelPreset.from_hf_config(self.model_config)
            key = preset.id
            if key in MODELS and MODELS[key] != preset:
                key = f"{key}-config"
                preset = replace(preset, id=key)
            MODELS[key] = preset
            return preset
        return get_model(self.model)

    def resolved_max_context_len(self) -> int:
        return self.max_context_len or self.model_preset().max_position

    def memory_rule(self) -> str:
        for name in ("kv_tokens", "num_pages", "kv_mem_gib"):
            if getattr(self, name) is not None:
                return name
        return self.budget or DEFAULT_BUDGET

    def resolved_kv_tokens(self) -> int:
        m = self.model_preset()
        return resolve_kv_tokens(
            m, self.gpu, self.tp, self.kv_dtype, page_size=self.page_size,
            rule=self.budget or DEFAULT_BUDGET, fraction=self.mem_fraction,
            kv_mem_gib=self.kv_mem_gib, kv_tokens=self.kv_tokens,
            num_gpu_blocks_override=self.num_pages, gpu_mem_gib=self.gpu_mem_gib,
            activation_peak_gib=self.activation_peak_gib, non_torch_gib=self.non_torch_gib)

    def to_workload_spec(self) -> WorkloadSpec:
        return WorkloadSpec(
            name=self.workload, trace=self.trace, format=self.format,
            skip_bad_rows=self.skip_bad_rows, rate=self.rate, arrival=self.arrival, cv=self.cv,
            rate_scale=self.rate_scale, duration_s=self.duration,
            num_requests=self.num_requests, max_new_tokens=self.max_new_tokens,
            max_context_len=self.resolved_max_context_len(), seed=self.seed,
            lengths=self.lengths, input_len=self.input_len, output_len=self.output_len,
            spread=self.spread, sigma=self.sigma, prefix_len=self.prefix_len,
            question_len=self.question_len, num_prefixes=self.num_prefixes,
            num_turns=self.num_turns, turn_input_min=self.turn_input_min,
            turn_input_max=self.turn_input_max, think_time_s=self.think_time,
            system_len=self.system_len, depth=self.depth, branching=self.branching,
            level_interval_s=self.level_interval, num_samples=self.num_samples,
        )

    def to_sim_config(self) -> SimConfig:
        self.validate()
        m = self.model_preset()
        return SimConfig(
            policy=self.policy, placement=self.placement, page_size=self.page_size,
            eviction=self.eviction, model=m.id, gpu=self.gpu, tp=self.tp,
            kv_dtype=self.kv_dtype, kv_tokens=self.resolved_kv_tokens(),
            max_context_len=self.resolved_max_context_len(), admission=self.admission,
            schedule=self.schedule, preempt=self.preempt,
            max_running_requests=self.max_running_requests,
            max_prefill_tokens=self.max_prefill_tokens,
            chunked_prefill_size=self.chunked_prefill_size, latency=self.latency,
            warmup_s=self.warmup, duration_s=self.duration or 0.0, drain=self.drain,
            seed=self.seed, device=self.device, check_invariants=self.check_invariants,
            timeline_interval_s=self.timeline_interval,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def resolved(self) -> dict[str, Any]:
        """Every option with memory, context length and model resolved: the columns that
        lead each summary row, and what config.json stores."""
        d = self.to_dict()
        d["model"] = self.model_preset().id
        d["max_context_len"] = self.resolved_max_context_len()
        d["memory_rule"] = self.memory_rule()
        d["kv_tokens"] = self.resolved_kv_tokens()
        return d

    def config_hash(self) -> str:
        """Hash of everything that changes the simulation (not output paths, plot targets,
        devices or checks): two runs with the same hash give the same numbers."""
        d = {k: v for k, v in self.resolved().items() if _is_sim(k) and k not in _MEMORY_INPUTS}
        if self.model_config:
            d["model_config"] = hashlib.sha256(Path(self.model_config).read_bytes()).hexdigest()
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


_FIELDS = {f.name: f for f in fields(RunOptions)}
# inputs that only size the pool: the hash keeps the resolved kv_tokens instead, so the same
# pool spelled two ways (--kv-tokens 4096, --num-pages 256 at page size 16) is one cell
_MEMORY_INPUTS = frozenset({"num_pages", "kv_mem_gib", "budget", "mem_fraction", "memory_rule",
                            "activation_peak_gib", "non_torch_gib", "gpu_mem_gib"})


def _is_sim(name: str) -> bool:
    f = _FIELDS.get(name)
    return f is None or bool(f.metadata.get("sim", True))


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{flag(name)} must be a positive integer, got {value!r}")


# Domains of the numeric options beyond "positive" (checked up front, so a bad value is one
# line naming its flag instead of an error deep in a generator): name -> (low, high, low is
# inclusive). Lengths stay within one synthetic token namespace (2^24 tokens); counts and slot
# numbers within int32 (the page table's dtype).
_MAX_LEN = 1 << 24
_MAX_I32 = (1 << 31) - 1
_RANGES: dict[str, tuple[float, float, bool]] = {
    "num_requests": (1, _MAX_I32, True), "max_new_tokens": (1, _MAX_LEN, True),
    "input_len": (1, _MAX_LEN, True), "output_len": (1, _MAX_LEN, True),
    "prefix_len": (0, _MAX_LEN, True), "question_len": (1, _MAX_LEN, True),
    "num_prefixes": (1, _MAX_I32, True), "num_turns": (1, _MAX_I32, True),
    "turn_input_min": (1, _MAX_LEN, True), "turn_input_max": (1, _MAX_LEN, True),
    "system_len": (0, _MAX_LEN, True), "depth": (0, 64, True), "branching": (1, _MAX_LEN, True),
    "num_samples": (1, _MAX_I32, True), "page_size": (1, _MAX_LEN, True),
    "tp": (1, 1 << 16, True), "max_context_len": (1, _MAX_LEN, True),
    "kv_tokens": (1, _MAX_I32, True), "num_pages": (1, _MAX_I32, True),
    "max_running_requests": (1, 1 << 20, True), "max_prefill_tokens": (1, _MAX_I32, True),
    "chunked_prefill_size": (0, _MAX_I32, True), "seed": (0, (1 << 63) - 1, True),
    "cv": (0, math.inf, False), "rate_scale": (0, math.inf, False), "spread": (0, 1, True),
    "sigma": (0, math.inf, True), "think_time": (0, math.inf, True),
    "level_interval": (0, math.inf, True), "gpu_mem_gib": (0, math.inf, False),
    "activation_peak_gib": (0, math.inf, True), "non_torch_gib": (0, math.inf, True),
    "warmup": (0, math.inf, True), "timeline_interval": (0, math.inf, True),
    "slo_ttft": (0, math.inf, False), "slo_tpot": (0, math.inf, False),
}


def _check_ranges(o: RunOptions) -> None:
    for name, (lo, hi, lo_in) in _RANGES.items():
        v = getattr(o, name)
        if v is None:
            continue
        ok = (v >= lo if lo_in else v > lo) and v <= hi and math.isfinite(v)
        if not ok:
            left = "[" if lo_in else "("
            top = "inf)" if hi == math.inf else f"{hi:,}]"
            raise ValueError(f"{flag(name)} must be in {left}{lo}, {top}, got {v!r}")
    if o.turn_input_min > o.turn_input_max:
        raise ValueError(f"--turn-input-min {o.turn_input_min} is above --turn-input-max "
                         f"{o.turn_input_max}")
    nodes, level = 0, 1
    for _ in range(o.depth + 1):  # prompts per tree (tot): 1 + b + b^2 + ... + b^depth
        nodes += level
        level *= o.branching
        if nodes > _MAX_LEN:
            raise ValueError(f"--depth {o.depth} with --branching {o.branching} makes more "
                             f"than {_MAX_LEN:,} prompts per tree")
    for name in ("trace", "model_config", "out"):
        if getattr(o, name) is not None and not str(getattr(o, name)).strip():
            raise ValueError(f"{flag(name)} is an empty path")
    if o.out is not None and Path(o.out).exists() and not Path(o.out).is_dir():
        raise ValueError(f"--out {o.out!r} exists and is not a directory")
    if o.num_pages is not None and o.num_pages * o.page_size > _MAX_I32:
        raise ValueError(f"--num-pages {o.num_pages} x --page-size {o.page_size} is more than "
                         f"{_MAX_I32:,} slots")
    _check_device(o.device)


def _check_device(device: str) -> None:
    """cpu, or cuda[:N] with such a device present (torch's own errors are not one line)."""
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


def field_type(name: str) -> type:
    """The plain type of an option (int, float, str, bool), None-ness stripped."""
    hint = typing.get_type_hints(RunOptions)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _coerce(f: Any, value: Any) -> Any:
    """A TOML / JSON value as the field's type, or ValueError naming the option."""
    if value is None:
        return None
    t = field_type(f.name)
    if t is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{flag(f.name)} must be true or false, got {value!r}")
    try:
        if t is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if t is float:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ValueError(f"{flag(f.name)} must be {t.__name__}, got {value!r}") from None


def field_default(name: str) -> Any:
    f = _FIELDS[name]
    return None if f.default is MISSING else f.default


def allowed_values(name: str) -> list[str] | None:
    choices = _FIELDS[name].metadata.get("choices")
    if choices is None:
        return None
    return list(choices() if callable(choices) else choices)


def load_toml(path: str | Path) -> dict[str, Any]:
    """An experiment file's keys (same names as the options)."""
    import tomllib

    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ValueError(f"--config {str(p)!r}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"--config {str(p)!r}: not valid TOML ({e})") from None


def cells(base: RunOptions, axes: Mapping[str, Iterable[Any]]) -> list[RunOptions]:
    """The cross product of `axes` (option name -> values) applied to `base`, in order."""
    import itertools

    names = list(axes)
    out = []
    for combo in itertools.product(*(list(axes[n]) for n in names)):
        out.append(RunOptions.from_mapping(dict(zip(names, combo, strict=True)), base))
    return out

