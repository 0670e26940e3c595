"""`RunOptions`: the options of one simulation, composed of one frozen spec per concern.

| attribute  | spec           | defined in             | holds                                     |
|------------|----------------|------------------------|-------------------------------------------|
| `workload` | `WorkloadSpec` | workloads/spec.py      | trace or generator, arrivals, lengths     |
| `policy`   | `PolicySpec`   | simulator/specs.py     | policy, placement, eviction, page size    |
| `memory`   | `MemorySpec`   | kvcore/model/memory.py | model, GPU, TP, KV dtype, pool size/rule  |
| `engine`   | `EngineSpec`   | simulator/specs.py     | admission, batches, latency, window, seed |
| `tier`     | `TierSpec`     | simulator/specs.py     | host / storage KV tiers and their links   |
| `fleet`    | `FleetSpec`    | simulator/fleet/       | replicas, router, its settings, KV events |
| `output`   | `OutputSpec`   | here                   | output directory, SLO marks               |

Every field declared with `kvcore.contract.fields.spec_field` is an option. `OPTIONS` lists them, in
the order summary.csv shows them, under their one name: the command-line flag (`page_size` is
`--page-size`), the experiment-file key (`page_size` or `page-size`) and the summary column.
The CLI generates its options from `OPTIONS`; each spec validates its own fields when it is
built; nothing else holds a name, a default or a check. Extra spellings declared on a field
(old names such as `--think-time`, vLLM's `--num-gpu-blocks-override`) are accepted wherever
the name is.

`sim_config()` composes the engine's `SimConfig` from the policy and engine specs as they are
and the pool the memory spec resolves to (no field is copied by hand); `workload_spec()` is
the workload with its two derived fields (seed, maximum context) filled in.
Memory is resolved by `kvcore.model.planner.resolve_kv_tokens`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from experiments.options.engines import ENGINE_OPTION, apply_engine
from experiments.options.spellings import IMPLIES, SPELLINGS, check_spellings, list_flag
from experiments.options.spellings import key as spelling_key
from kvcore.contract.fields import (
    MAX_I32,
    Domain,
    allowed_values,
    check_fields,
    field_types,
    flag,
    is_option,
    option_name,
    spec_field,
)
from kvcore.model.memory import HYBRID_MEMORY_OPTIONS, MemorySpec
from kvcore.model.planner import resolve_kv_bytes, resolve_kv_tokens
from kvcore.model.vllm_rules import DEFAULT_VLLM_VERSION
from simulator.config import PoolSpec, SimConfig
from simulator.fleet.spec import FleetSpec
from simulator.hybrid import HYBRID_OPTIONS, RunLayout, resolve_layout, resolved_hybrid_options
from simulator.latency_profiles import is_profile_file, profile_for_rule
from simulator.shared_tier import SHARED_OPTIONS, check_shared_tier
from simulator.specs import EngineSpec, PolicySpec, TierSpec, caching_policies
from workloads.spec import WorkloadSpec, unused_options


@dataclass(frozen=True)
class OutputSpec:
    """Where results go and what the figures mark; nothing here changes the numbers."""

    out: str | None = spec_field(None, "output directory", path=True, hashed=False)
    # SLO targets (experiments/answers/slo.py): `--slo-ttft-p99 2` is `--slo-ttft 2 --slo-percentile
    # 99` (experiments/options/spellings.py); a run meets its SLO when at least that share of its
    # requests meets every target given (DistServe's goodput attainment, arXiv 2401.09670 section 2)
    slo_ttft: float | None = spec_field(
        None, "TTFT target (s): the SLO columns of summary.csv, capacity's goodput search, "
        "the rate plot's mark", domain=Domain(0, lo_inclusive=False), hashed=False)
    slo_tpot: float | None = spec_field(
        None, "TPOT target (s), as --slo-ttft", domain=Domain(0, lo_inclusive=False),
        hashed=False)
    slo_percentile: float = spec_field(
        99.0, "share of requests (%) that must meet every SLO target",
        domain=Domain(0, 100, lo_inclusive=False), hashed=False)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.out is not None and Path(self.out).exists() and not Path(self.out).is_dir():
            raise ValueError(f"--out {self.out!r} exists and is not a directory")


# RunOptions attribute -> its spec class, in the order of the options (and summary columns)
SPECS: dict[str, type] = {"workload": WorkloadSpec, "policy": PolicySpec, "memory": MemorySpec,
                          "engine": EngineSpec, "tier": TierSpec, "fleet": FleetSpec,
                          "output": OutputSpec}
# the help panel each spec's options are listed under (one per spec)
PANELS = {"workload": "Workload", "policy": "Policy", "memory": "Memory and model",
          "engine": "Engine", "tier": "Host KV tier", "fleet": "Fleet", "output": "Output"}


@dataclass(frozen=True)
class Option:
    """One option: its name, the RunOptions attribute (spec) holding it, and that field."""

    name: str
    spec: str
    field: Field

    @property
    def type(self) -> type:
        """int, float, str or bool."""
        return field_types(SPECS[self.spec])[self.field.name][0]

    @property
    def default(self) -> Any:
        return self.field.default

    @property
    def help(self) -> str:
        return self.field.metadata["help"]

    @property
    def flags(self) -> tuple[str, ...]:
        """Extra command-line spellings (experiments/options/spellings.py)."""
        return SPELLINGS.get(self.name, ())

    @property
    def axis(self) -> bool:
        """A grid of runs may vary it (a sweep takes a list of its values)."""
        return bool(self.field.metadata.get("axis"))

    @property
    def list_flag(self) -> str:
        """The flag of its comma list in a grid (`--page-sizes`)."""
        return list_flag(self.name)

    @property
    def hashed(self) -> bool:
        return self.field.metadata["hashed"]

    @property
    def panel(self) -> str:
        return PANELS[self.spec]

    @property
    def flag(self) -> str:
        return flag(self.name)

    def allowed(self) -> list[str] | None:
        return allowed_values(self.field)


OPTIONS: dict[str, Option] = {
    option_name(f): Option(option_name(f), attr, f)
    for attr, cls in SPECS.items() for f in fields(cls) if is_option(f)
}
check_spellings(set(OPTIONS))
# another spelling (an extra flag without its dashes, underscored) -> the option's name
ALIASES: dict[str, str] = {spelling_key(a): o.name for o in OPTIONS.values() for a in o.flags}
# an engine's own spelling -> the other options it sets (its engine's rule)
IMPLIED: dict[str, dict[str, Any]] = {
    spelling_key(a): dict(IMPLIES[a]) for o in OPTIONS.values() for a in o.flags if a in IMPLIES}


def option_key(key: str) -> str | None:
    """The option a file key or parameter name means (dashes or underscores, aliases), or
    None."""
    name = key.replace("-", "_")
    name = ALIASES.get(name, name)
    return name if name in OPTIONS else None


def coerce(option: Option, value: Any) -> Any:
    """A TOML / JSON value as the option's type, or ValueError naming the option."""
    if value is None:
        return None
    t = option.type
    if t is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{option.flag} must be true or false, got {value!r}")
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
        raise ValueError(f"{option.flag} must be {t.__name__}, got {value!r}") from None


def normalize(values: Mapping[str, Any], where: str = "option") -> dict[str, Any]:
    """Keys as option names, values as the options' types; ValueError for an unknown key, for
    one option given under two spellings, and for an engine spelling whose implied value
    (`--gpu-memory-utilization` -> `--budget vllm`) contradicts one given."""
    clean: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    implied: dict[str, tuple[str, Any]] = {}
    for key, value in values.items():
        name = option_key(key)
        if name is None:
            raise ValueError(f"unknown {where} {key!r}; known: {', '.join(OPTIONS)}")
        if name in spelled:
            raise ValueError(f"{flag(spelled[name])} and {flag(key)} are the same option "
                             f"({OPTIONS[name].flag}); give it once")
        spelled[name] = key.replace("-", "_")
        clean[name] = coerce(OPTIONS[name], value)
        for other, v in IMPLIED.get(key.replace("-", "_"), {}).items():
            implied[other] = (key, name, v)
    for other, (key, name, v) in implied.items():
        if clean.get(other, v) != v:
            raise ValueError(f"{flag(key)} is {v}'s own name and implies {OPTIONS[other].flag} "
                             f"{v}; got {OPTIONS[other].flag} {clean[other]} (use "
                             f"{OPTIONS[name].flag} with {OPTIONS[other].flag} for another)")
        clean[other] = v
    return clean


@dataclass(frozen=True)
class RunOptions:
    """Every option of one simulation (and of the planner), one spec per concern."""

    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    policy: PolicySpec = field(default_factory=PolicySpec)
    memory: MemorySpec = field(default_factory=MemorySpec)
    engine: EngineSpec = field(default_factory=EngineSpec)
    tier: TierSpec = field(default_factory=TierSpec)
    fleet: FleetSpec = field(default_factory=FleetSpec)
    output: OutputSpec = field(default_factory=OutputSpec)

    def __post_init__(self) -> None:
        """The one rule across specs: a page count must stay a slot count the page table
        can address."""
        pages, ps = self.memory.num_pages, self.policy.page_size
        if pages is not None and pages * ps > MAX_I32:
            raise ValueError(f"--num-pages {pages} x --page-size {ps} is more than "
                             f"{MAX_I32:,} slots")
        # the attention backend must run the page size (a sweep builds every cell's options
        # before any cell runs, so a bad cell stops the sweep up front)
        self.engine_spec()

    def engine_spec(self) -> EngineSpec:
        """The engine spec resolved: the latency profile from the budget rule when none is
        given (vllm -> vllm-hopper, others -> sglang-hopper; docs/latency.md) and the
        constants that options override at the values in effect; ValueError when the
        attention backend cannot run the page size."""
        e = self.engine
        if e.latency != "roofline":
            return e
        if e.latency_profile is None:  # a budget given with a direct size names the engine
            e = replace(e, latency_profile=profile_for_rule(self.memory.budget
                                                            or self.memory.rule))
        consts = e.latency_constants(self.policy.page_size)
        return replace(e, attention_backend=e.resolved_backend(),
                       page_head_overhead_s=consts["page_head_overhead_s"],
                       iteration_overhead_s=consts["iteration_overhead_s"])

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], base: RunOptions | None = None,
                     where: str = "option") -> RunOptions:
        """`base` (or the defaults) with `values` (option names or aliases, dashes or
        underscores) applied; each spec that changes is rebuilt, and so validated."""
        base = base or cls()
        changed: dict[str, dict[str, Any]] = {}
        for name, value in apply_engine([normalize(values, where)]).items():
            o = OPTIONS[name]
            changed.setdefault(o.spec, {})[o.field.name] = value
        if not changed:
            return base
        return replace(base, **{attr: replace(getattr(base, attr), **vals)
                                for attr, vals in changed.items()})

    def get(self, name: str) -> Any:
        """An option's value by its name."""
        o = OPTIONS[name]
        return getattr(getattr(self, o.spec), o.field.name)

    def to_dict(self) -> dict[str, Any]:
        """The options as given, flat, by name (config.json's `options`, a sweep cell)."""
        return {name: self.get(name) for name in OPTIONS}

    # -- resolution ------------------------------------------------------------------------
    def resolved_kv_tokens(self) -> int:
        return resolve_kv_tokens(self.memory, self.policy.page_size)

    def resolved(self) -> dict[str, Any]:
        """Every option with memory, context length and model resolved: the columns that
        lead each summary row, and what config.json stores. The hybrid options
        (simulator/hybrid.py) appear, at the values in effect, for a hybrid model only, so a
        full-attention model's columns and config hash are what they were."""
        d = self.to_dict()
        m = self.memory
        model = m.model_preset().id
        for name in (*HYBRID_OPTIONS, *HYBRID_MEMORY_OPTIONS):
            del d[name]
        if not self.tier.shared_tier_size:  # no shared tier: none of its columns
            for name in SHARED_OPTIONS:
                del d[name]
        fleet = self.fleet.resolved()  # one replica: none of the fleet's columns
        for name in ("replicas", "router", "router_args", "kv_event_delay_s"):
            if name in fleet:
                d[name] = fleet[name]
            else:
                del d[name]
        # a column only under --engine (experiments/options/engines.py)
        if d[ENGINE_OPTION] is None:
            del d[ENGINE_OPTION]
        if d.get("kv_cache_memory_bytes") is None:  # a column only when given
            del d["kv_cache_memory_bytes"]
        layout = self.run_layout.model
        if layout is not None:
            d.update(resolved_hybrid_options(self.policy, self.run_layout))
            d["vllm_version"] = m.vllm_version or DEFAULT_VLLM_VERSION
            states = layout.state_groups()
            d["mamba_cache_dtype"] = states[0].conv_dtype if states else m.mamba_cache_dtype
            d["mamba_ssm_cache_dtype"] = (states[0].state_dtype if states
                                          else m.mamba_ssm_cache_dtype)
        d["model"] = model
        d["max_context_len"] = self.memory.resolved_max_context_len()
        d["memory_rule"] = self.memory.rule
        d["kv_tokens"] = self.resolved_kv_tokens()
        e = self.engine_spec()
        d["latency_profile"] = e.latency_profile
        for name in ("attention_backend", "page_head_overhead_s", "iteration_overhead_s"):
            d[name] = getattr(e, name)  # the values in effect
        return d

    @cached_property
    def run_layout(self) -> RunLayout:
        """The layout the model and the options resolve to (simulator/hybrid.py), once: the
        summary's columns read it and `sim_config` hands it to the engine's config."""
        m = self.memory
        return resolve_layout(self.policy, m.model_preset().id,
                              m.vllm_version or DEFAULT_VLLM_VERSION, m.mamba_cache_dtype,
                              m.mamba_ssm_cache_dtype)

    def workload_spec(self) -> WorkloadSpec:
        """The workload to build: the spec with the fields a run derives filled in."""
        return replace(self.workload, seed=self.engine.seed,
                       max_context_len=self.memory.resolved_max_context_len())

    def sim_config(self) -> SimConfig:
        """The engine's configuration: the policy and engine specs as given, the pool the
        memory spec resolves to, the window's end from the workload (no --duration-s: the
        window ends at the last arrival); the engines' constants at their defaults."""
        m = self.memory
        model = m.model_preset().id
        hybrid = self.run_layout.layout is not None
        self.fleet.check(self.policy.policy, caching_policies(), model if hybrid else None)
        check_shared_tier(self.tier, self.fleet.replicas)
        pool = PoolSpec(model=model, gpu=m.gpu, tp=m.tp, kv_dtype=m.kv_dtype,
                        kv_tokens=self.resolved_kv_tokens(),
                        max_context_len=m.resolved_max_context_len(),
                        kv_bytes=resolve_kv_bytes(m, self.policy.page_size) if hybrid else 0,
                        vllm_version=m.vllm_version or DEFAULT_VLLM_VERSION,
                        mamba_cache_dtype=m.mamba_cache_dtype,
                        mamba_ssm_cache_dtype=m.mamba_ssm_cache_dtype)
        return SimConfig(policy=self.policy, pool=pool, engine=self.engine_spec(), tier=self.tier,
                         duration_s=self.workload.duration_s or 0.0, layout=self.run_layout)

    def config_hash(self) -> str:
        """Hash of everything that changes the simulation (not output paths, plot targets,
        devices, checks, or the memory inputs whose resolved kv_tokens is hashed instead): two
        runs with the same hash give the same numbers."""
        d = {k: v for k, v in self.resolved().items() if k in OPTIONS and OPTIONS[k].hashed}
        for k in unused_options(d):  # an option this run's arrivals or generator never read
            del d[k]
        if self.memory.model_config:
            d["model_config"] = hashlib.sha256(
                Path(self.memory.model_config).read_bytes()).hexdigest()
        profile = self.engine.latency_profile
        if profile is not None and is_profile_file(profile):  # its constants, not its path
            d["latency_profile"] = hashlib.sha256(Path(profile).read_bytes()).hexdigest()
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def option_reference() -> str:
    """docs/cli.md's option tables, one per help panel, from the same metadata as `--help`
    (docs/cli.md is generated whole: experiments/console/cli_reference.py)."""
    lines: list[str] = []
    for panel in PANELS.values():
        lines += [f"#### {panel}", "", "| option | default | meaning |", "|---|---|---|"]
        for o in OPTIONS.values():
            if o.panel != panel:
                continue
            names = (f"`{o.flag}` / `--no-{o.flag[2:]}`" if o.type is bool
                     else ", ".join(f"`{f}`" for f in (o.flag, *o.flags)))
            default = "-" if o.default is None else f"`{o.default}`"
            meaning = o.help
            allowed = o.allowed()
            if allowed:
                meaning += ": " + ", ".join(f"`{a}`" for a in allowed)
            if o.axis:
                meaning += f" (a grid axis: `{o.list_flag}`)"
            lines.append(f"| {names} | {default} | {meaning} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["ALIASES", "IMPLIED", "OPTIONS", "SPECS", "Option", "OutputSpec", "RunOptions", "coerce",
           "normalize", "option_key", "option_reference"]
