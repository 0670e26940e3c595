"""Built-in named workloads (no file needed) and `build_workload(spec)`.

Each entry has a one-line description (what `kvsim workloads` prints), its default rate and
default request count (used when neither `num_requests` nor `duration_s` is given), and a
builder. The default workload (`sharegpt`, 200 requests at 2 req/s) runs in seconds.
Bundled traces live in `workloads/data/` (licenses and attribution in its README), so nothing
outside the package is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from workloads.arrivals import ArrivalConfig, arrival_times
from workloads.errors import WorkloadError
from workloads.generators import (
    OutputLimits,
    chat_sessions,
    independent_requests,
    parallel_sampling,
    shared_prefix,
    tree_of_thought,
)
from workloads.ladder import DEFAULT_GAP_S, Ladder, LadderSchedule
from workloads.lengths import (
    EmpiricalLengths,
    EmpiricalPairs,
    IndependentPairs,
    LengthDist,
    UniformLengths,
    length_model,
)
from workloads.prompt_groups import PromptGroups, grouped_requests
from workloads.request import Workload
from workloads.spec import (
    DEFAULT_WORKLOAD,
    GENERATOR_ONLY,
    WorkloadSpec,
    register_workload_defaults,
    register_workload_names,
)
from workloads.traces.load import load_trace

DATA_DIR = Path(__file__).resolve().parent / "data"
MOONCAKE_FILE = DATA_DIR / "mooncake_conversation_trace.jsonl"
AZURE_FILE = DATA_DIR / "AzureLLMInferenceTrace_conv.csv"
SHAREGPT_FILE = DATA_DIR / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


@dataclass(frozen=True)
class _Entry:
    description: str
    rate: float | None
    num_requests: int | Callable[[WorkloadSpec], int] | None
    unit: int | Callable[[WorkloadSpec], int]  # requests per arrival (group / session / tree)
    build: Callable[[WorkloadSpec, np.ndarray, int | None, LadderSchedule | None], Workload]
    lengths: str = "fixed"  # the length model without --lengths
    # where prompt lengths come from: the length model ("lengths"), --input-len itself
    # ("input_len": a tree's root), or the generator's own knobs ("own": k-shot, chat, the
    # grouped prompts)
    prompts: str = "lengths"
    generator: str | None = None  # the kind GENERATOR_ONLY options name (workloads/spec.py)
    # options this workload sets when they are left at None (its own defaults)
    defaults: Mapping[str, object] = field(default_factory=dict)


def _limits(spec: WorkloadSpec) -> OutputLimits:
    return OutputLimits(spec.max_new_tokens, spec.max_context_len)


def _lengths(spec: WorkloadSpec, default: str):
    return length_model(spec.lengths or default, spec.input_len, spec.output_len,
                        spec.spread, spec.sigma)


def _output_dist(spec: WorkloadSpec, default: str) -> LengthDist:
    model = _lengths(spec, default)
    if isinstance(model, IndependentPairs):
        return model.output
    assert isinstance(model, EmpiricalPairs)
    return EmpiricalLengths(model.outputs)


def _independent(default: str):
    def build(spec: WorkloadSpec, t: np.ndarray, cap: int | None,
              ladder: LadderSchedule | None) -> Workload:
        return independent_requests(t, _lengths(spec, default), spec.seed, _limits(spec),
                                    name=spec.name)
    return build


def _kshot(spec: WorkloadSpec, t: np.ndarray, cap: int | None,
           ladder: LadderSchedule | None) -> Workload:
    return shared_prefix(t, spec.prefix_len, spec.question_len, _output_dist(spec, "fixed"),
                         spec.seed, spec.num_prefixes, _limits(spec), name=spec.name)


def _chat(spec: WorkloadSpec, t: np.ndarray, cap: int | None,
          ladder: LadderSchedule | None) -> Workload:
    turn_in = UniformLengths(spec.turn_input_min, spec.turn_input_max)
    return chat_sessions(t, spec.num_turns, turn_in, _output_dist(spec, "uniform"),
                         spec.think_time_s, spec.system_len, spec.seed, _limits(spec),
                         max_requests=cap, name=spec.name)


def _tot(spec: WorkloadSpec, t: np.ndarray, cap: int | None,
         ladder: LadderSchedule | None) -> Workload:
    return tree_of_thought(t, spec.depth, spec.branching, spec.input_len, spec.question_len,
                           _output_dist(spec, "fixed"), spec.level_interval_s, spec.seed,
                           _limits(spec), max_requests=cap, name=spec.name)


def _parallel(spec: WorkloadSpec, t: np.ndarray, cap: int | None,
              ladder: LadderSchedule | None) -> Workload:
    return parallel_sampling(t, spec.num_samples, _lengths(spec, "sharegpt"), spec.seed,
                             _limits(spec), max_requests=cap, name=spec.name)


def _tree_size(spec: WorkloadSpec) -> int:
    return sum(spec.branching**d for d in range(spec.depth + 1))


def prompt_groups_of(spec: WorkloadSpec) -> PromptGroups:
    """The grouped dataset a resolved spec describes (its gsp_* options and ignore-eos)."""
    values = [spec.gsp_num_groups, spec.gsp_prompts_per_group, spec.gsp_system_prompt_len,
              spec.gsp_question_len, spec.gsp_output_len]
    assert None not in values, "resolve the workload's defaults first"
    return PromptGroups(*values, ignore_eos=spec.ignore_eos)  # type: ignore[arg-type]


def _grouped(order: str):
    """A builder of workloads/prompt_groups.py: `order` is the harness's request order."""
    def build(spec: WorkloadSpec, t: np.ndarray, cap: int | None,
              ladder: LadderSchedule | None) -> Workload:
        local = None
        if ladder is not None:  # each request's index within its stage
            firsts = np.array([s.first for s in ladder.stages], dtype=np.int64)
            idx = np.arange(len(t))
            local = idx - firsts[ladder.stage_of(idx)]
        eos = None if spec.ignore_eos else _output_dist(spec, "sharegpt")
        return grouped_requests(t, prompt_groups_of(spec), order, spec.seed, local, eos,
                                _limits(spec), name=spec.name)
    return build


def _set_size(spec: WorkloadSpec) -> int:
    """One full set of the grouped dataset: G x P requests."""
    return prompt_groups_of(spec).num_prompts


# inference-perf's SharedPrefix defaults (config.py at aa3fd7f): 10 x 10, 100 / 50 / 50
INFERENCE_PERF_DEFAULTS = dict(gsp_num_groups=10, gsp_prompts_per_group=10,
                               gsp_system_prompt_len=100, gsp_question_len=50,
                               gsp_output_len=50)
# sglang bench_serving's --gen-* defaults in v0.4.0 (the v0.4 blog ran them unchanged)
SGLANG_V04_GSP = dict(gsp_num_groups=64, gsp_prompts_per_group=16, gsp_system_prompt_len=2048,
                      gsp_question_len=128, gsp_output_len=256)
# llm-d kv-cache-manager benchmarking/73-capacity/README.md (commit d070ea6, 2025-09-21):
# the shared_prefix data block and the Poisson stages of its workload profile
LLMD_73_CAPACITY = dict(
    gsp_num_groups=150, gsp_prompts_per_group=5, gsp_system_prompt_len=6000,
    gsp_question_len=1200, gsp_output_len=1000, arrival="ladder", ladder_type="poisson",
    ladder="15x50,3x20,10x20,15x20,20x38,22x34,25x30,30x25,35x21,40x38,43x36,46x33,49x30,"
           "52x29,55x27,57x26,60x25")
# llm-d kv-cache-manager benchmarking/37-capacity/README.md (commit d070ea6): constant stages
LLMD_37_CAPACITY = dict(
    gsp_num_groups=83, gsp_prompts_per_group=3, gsp_system_prompt_len=8000,
    gsp_question_len=1000, gsp_output_len=1000, arrival="ladder", ladder_type="constant",
    ladder="9x30,3x210,4x180,5x120,6x120,8x90,10x70,12x60,15x50,20x50")


_SYNTHETIC: dict[str, _Entry] = {
    "sharegpt": _Entry(
        "ShareGPT lengths rescaled to the vLLM paper's means (in 161.3 / out 338.0), "
        "Poisson 2 req/s, 200 requests (the default)", 2.0, 200, 1, _independent("sharegpt"),
        "sharegpt"),
    "alpaca": _Entry(
        "Alpaca-like lognormal lengths at the vLLM paper's means (in 19.3 / out 58.5), "
        "Poisson 30 req/s, 200 requests", 30.0, 200, 1, _independent("alpaca"), "alpaca"),
    "kshot": _Entry(
        "shared k-shot prefix (S=1024) + unique question (Q=128), 128 output tokens, "
        "Poisson 4 req/s, 200 requests", 4.0, 200, 1, _kshot, "fixed", "own"),
    "chat": _Entry(
        "closed-loop multi-turn chat: 4 turns of 256-512 new tokens, ~128 output, 5 s think "
        "time, 0.5 sessions/s, 200 requests", 0.5, 200, lambda s: s.num_turns, _chat,
        "uniform", "own"),
    "tot": _Entry(
        "tree of thought: depth 2, branching 3 (13 prompts per tree sharing ancestors), "
        "0.5 trees/s, 208 requests", 0.5, 208, _tree_size, _tot, "fixed", "input_len"),
    "parallel-sampling": _Entry(
        "parallel sampling: 4 outputs per prompt (ShareGPT-paper lengths), 1 prompt/s, "
        "200 requests", 1.0, 200, lambda s: s.num_samples, _parallel, "sharegpt"),
    "shared-prefix": _Entry(
        "llm-d's shared_prefix (inference-perf): 10 groups x 10 prompts, system 100 / "
        "question 50 / output 50 tokens, ignore-eos, the shuffled prompt list replayed in "
        "every load stage; Poisson 10 req/s, one set (100 requests)", 10.0, _set_size, 1,
        _grouped("cycle-per-stage"), "sharegpt", "own",
        generator="shared-prefix",
        defaults=INFERENCE_PERF_DEFAULTS),
    "generated-shared-prefix": _Entry(
        "SGLang bench_serving's generated-shared-prefix (v0.4.0 defaults): 64 groups x 16 "
        "prompts, system 2,048 / question 128 / output 256 tokens, ignore-eos, each prompt "
        "once in shuffled order, all sent at t = 0 (request rate inf)", None, _set_size, 1,
        _grouped("once"), "sharegpt", "own",
        generator="generated-shared-prefix",
        defaults={**SGLANG_V04_GSP, "arrival": "burst"}),
    "llmd-73-capacity": _Entry(
        "llm-d 73-capacity report (8 x Qwen3-32B, 307,328 KV tokens per pod): shared_prefix "
        "150 groups x 5 prompts, system 6,000 / question 1,200 / output 1,000, ignore-eos; "
        "Poisson ladder 3-60 QPS after a 15 QPS x 50 s warm-up (17 stages, 17,084 requests)",
        None, None, 1, _grouped("cycle-per-stage"), "sharegpt", "own",
        generator="shared-prefix",
        defaults=LLMD_73_CAPACITY),
    "llmd-37-capacity": _Entry(
        "llm-d 37-capacity report (4 x Llama-3.1-70B TP4, 461,376 KV tokens per pod): "
        "shared_prefix 83 groups x 3 prompts, system 8,000 / question 1,000 / output 1,000, "
        "ignore-eos; constant ladder 3-20 QPS after a 9 QPS x 30 s warm-up",
        None, None, 1, _grouped("cycle-per-stage"), "sharegpt", "own",
        generator="shared-prefix",
        defaults=LLMD_37_CAPACITY),
    "sglang-v04-router": _Entry(
        "SGLang v0.4 blog's cache-aware router run (8 x A100, Llama-3.1-8B, dp 8): "
        "generated-shared-prefix at bench_serving v0.4.0's defaults, 64 x 16 prompts, "
        "2,048 / 128 / 256 tokens, all 1,024 sent at t = 0", None, _set_size, 1,
        _grouped("once"), "sharegpt", "own",
        generator="generated-shared-prefix",
        defaults={**SGLANG_V04_GSP, "arrival": "burst"}),
}

_TRACES: dict[str, tuple[str, Path, float | None, int | None]] = {
    "azure-conv": ("bundled Azure LLM inference trace 2023, conversation (19,366 requests, "
                   "1 h, no prefix info), replayed at its timestamps", AZURE_FILE, None, None),
    "mooncake-conv": ("bundled Mooncake FAST'25 conversation trace (12,031 requests, 1 h, "
                      "512-token prefix hash blocks), replayed at its timestamps",
                      MOONCAKE_FILE, None, None),
    "sharegpt-real": ("real ShareGPT lengths (mean in 2,340 / out 439, file order), "
                      "Poisson 2 req/s, 1,000 requests", SHAREGPT_FILE, 2.0, 1000),
}


def list_workloads() -> dict[str, str]:
    """Name -> one-line description of every built-in workload."""
    out = {name: e.description for name, e in _SYNTHETIC.items()}
    out.update({name: t[0] for name, t in _TRACES.items()})
    return out


register_workload_names(list_workloads)  # WorkloadSpec validates --workload against them


def _defaults_of(name: str) -> dict:
    """A built-in workload's defaults (the options it sets, its generator kind), or {}."""
    entry = _SYNTHETIC.get(name)
    if entry is None:
        return {"arrival": "trace"} if name in _TRACES else {}
    return {**entry.defaults, "generator": entry.generator}


register_workload_defaults(_defaults_of)  # unused_options reads the default arrival


def resolve_defaults(spec: WorkloadSpec) -> WorkloadSpec:
    """`spec` with the options left at None filled from its built-in workload's defaults (a
    trace or a workload without them: unchanged)."""
    if spec.trace is not None or spec.name not in _SYNTHETIC:
        return spec
    defaults = _SYNTHETIC[spec.name].defaults
    fill = {k: v for k, v in defaults.items() if getattr(spec, k) is None}
    return replace(spec, **fill) if fill else spec


def _trace_options(spec: WorkloadSpec, rate: float | None, num: int | None) -> dict:
    bounded = spec.num_requests is not None or spec.duration_s is not None
    return dict(
        format=spec.format, skip_bad_rows=spec.skip_bad_rows, seed=spec.seed,
        arrival=spec.arrival, rate=spec.rate if spec.rate is not None else rate, cv=spec.cv,
        peak_to_trough=spec.peak_to_trough,
        rate_scale=spec.rate_scale, duration_s=spec.duration_s,
        num_requests=spec.num_requests if bounded else num,
        max_new_tokens=spec.max_new_tokens, max_context_len=spec.max_context_len,
    )


# generator knobs, by the built-in workloads that read them (every other workload ignores
# them; `--lengths` and its parameters are read by every generator but by no trace)
_KNOBS: dict[str, tuple[str, ...]] = {
    "prefix_len": ("kshot",), "num_prefixes": ("kshot",), "question_len": ("kshot", "tot"),
    "num_turns": ("chat",), "turn_input_min": ("chat",), "turn_input_max": ("chat",),
    "think_time_s": ("chat",), "system_len": ("chat",),
    "depth": ("tot",), "branching": ("tot",), "level_interval_s": ("tot",),
    "num_samples": ("parallel-sampling",),
}
_LENGTH_KNOBS = ("lengths", "input_len", "output_len", "spread", "sigma")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_options_used(spec: WorkloadSpec, workload: Workload) -> None:
    """WorkloadError for an option set away from its default that the workload `spec` built
    would ignore: a silent no-op reads as an answer to a question nobody simulated. Called on
    the user's path (experiments.answers.runner.simulate_options), not by `build_workload` itself,
    so a library caller may share one spec between generators."""
    timestamps = workload.meta.get("arrival") == "trace"
    is_trace = spec.trace is not None or spec.name in _TRACES
    what = f"--trace {spec.trace}" if spec.trace is not None else f"--workload {spec.name}"
    default = WorkloadSpec()
    entry = None if is_trace else _SYNTHETIC.get(spec.name)
    generator = None if entry is None else entry.generator
    arrival = workload.meta.get("arrival")

    def changed(name: str) -> bool:
        return getattr(spec, name) != getattr(default, name)

    ignored = [n for n, users in _KNOBS.items()
               if changed(n) and (is_trace or spec.name not in users)]
    if is_trace or (generator is not None and spec.ignore_eos):
        ignored += [n for n in _LENGTH_KNOBS if changed(n)]  # ignore-eos: lengths are fixed
    else:  # a length knob is read by the length model in effect, for what it draws
        ignored += [n for n in _unread_length_knobs(spec) if changed(n)]
    ignored += [n for n, kinds in GENERATOR_ONLY.items()
                if changed(n) and generator not in kinds]
    if not timestamps and changed("rate_scale"):
        ignored.append("rate_scale")  # it speeds up recorded timestamps only
    if (spec.arrival or ("trace" if timestamps else "poisson")) != "gamma" and changed("cv"):
        ignored.append("cv")
    if spec.arrival != "diurnal" and changed("peak_to_trough"):
        ignored.append("peak_to_trough")
    if arrival != "ladder":
        ignored += [n for n in ("ladder", "ladder_type", "ladder_gap_s", "ladder_drain")
                    if changed(n)]
    ladder = workload.meta.get("ladder")
    if arrival == "ladder" and ladder is not None and len(ladder.stages) < 2 and changed(
            "ladder_gap_s"):
        ignored.append("ladder_gap_s")  # the run ends inside the first stage: no gap reached
    if arrival in ("ladder", "burst") and changed("rate"):
        ignored.append("rate")  # the ladder's stages, or all at once, set the rate
    if spec.trace is None and (changed("format") or changed("skip_bad_rows")):
        ignored += [n for n in ("format", "skip_bad_rows") if changed(n)]
    if ignored:
        raise WorkloadError(f"{', '.join(_flag(n) for n in ignored)}: not used by {what} "
                            "(it would be a silent no-op); drop it")


# the generators that draw whatever the length model: chat's turn inputs (uniform), the
# grouped prompts' shuffled order (workloads/prompt_groups.py)
_ALWAYS_DRAW = ("chat", "shared-prefix", "generated-shared-prefix", "llmd-73-capacity",
                "llmd-37-capacity", "sglang-v04-router")
# the arrival processes that draw nothing (all at t = 0, evenly spaced, a constant ladder)
_FIXED_ARRIVALS = ("burst", "fixed")


def draws_at_random(spec: WorkloadSpec) -> bool:
    """Whether the workload `spec` builds reads its seed for anything but names: a random
    arrival process, a length model that draws, or a generator that draws or shuffles. A
    trace is counted as drawing (its reader may sample rows)."""
    if spec.trace is not None or spec.name not in _SYNTHETIC:
        return True
    if spec.name in _ALWAYS_DRAW:
        return True
    spec = resolve_defaults(spec)
    arrival = spec.arrival or "poisson"
    if arrival == "ladder":
        fixed_arrivals = spec.ladder_type == "constant"
    else:
        fixed_arrivals = arrival in _FIXED_ARRIVALS
    return not fixed_arrivals or (spec.lengths or _SYNTHETIC[spec.name].lengths) != "fixed"


def default_lengths(name: str) -> str | None:
    """The length model a built-in generator draws without --lengths (None: a trace)."""
    entry = _SYNTHETIC.get(name)
    return None if entry is None else entry.lengths


def _unread_length_knobs(spec: WorkloadSpec) -> list[str]:
    """The length knobs a generator does not read: the empirical models (sharegpt, alpaca,
    sharegpt-real) take no mean, `--spread` is uniform's and `--sigma` lognormal's, and a
    generator whose prompts are its own (k-shot, chat) draws only outputs."""
    entry = _SYNTHETIC[spec.name]
    model = spec.lengths or entry.lengths
    parametric = model in ("fixed", "uniform", "lognormal")
    reads = {"output_len": parametric, "spread": model == "uniform",
             "sigma": model == "lognormal",
             "input_len": entry.prompts == "input_len" or (entry.prompts == "lengths"
                                                           and parametric)}
    return [n for n, read in reads.items() if not read]


def build_workload(spec: WorkloadSpec | None = None) -> Workload:
    """The workload a spec describes: a trace file, a bundled trace, or a generator."""
    spec = spec or WorkloadSpec()
    if spec.trace is not None:
        return load_trace(spec.trace, **_trace_options(spec, None, None))
    if spec.name in _TRACES:
        desc, path, rate, num = _TRACES[spec.name]
        opts = _trace_options(spec, rate, num)
        if spec.name != "sharegpt-real":
            opts["format"] = "auto"
        w = load_trace(path, name=spec.name, **opts)
        w.description = desc
        w.meta["source"] = f"bundled:{path.name}"
        return w
    entry = _SYNTHETIC[spec.name]  # a known name: WorkloadSpec checked it
    spec = resolve_defaults(spec)
    kind = spec.arrival or "poisson"
    if kind == "trace":
        raise WorkloadError(
            f"workload {spec.name!r} has no timestamps: arrival 'trace' needs a trace"
        )
    unit = entry.unit(spec) if callable(entry.unit) else entry.unit
    num = spec.num_requests
    if num is None and spec.duration_s is None and kind != "ladder":
        num = entry.num_requests(spec) if callable(entry.num_requests) else entry.num_requests
    rng = np.random.default_rng([spec.seed, 0xA7])
    schedule = None
    rate: float | None = None
    if kind == "ladder":
        starts, schedule = _ladder(spec, unit).generate(rng, num, spec.duration_s)
    else:
        rate = spec.rate if spec.rate is not None else entry.rate
        if rate is None and kind != "burst":
            raise WorkloadError(f"--arrival {kind} with --workload {spec.name} needs --rate "
                                "(the workload sends all at once by default)")
        if num is None and spec.duration_s is None:
            raise WorkloadError(f"--workload {spec.name} needs --num-requests or --duration-s")
        units = None if num is None else math.ceil(num / unit)
        starts = arrival_times(ArrivalConfig(kind, rate or 1.0, spec.cv, spec.peak_to_trough),
                               rng, units, spec.duration_s)
    w = entry.build(replace(spec), starts, num, schedule)
    if num is not None and unit == 1:
        w.requests = w.requests[:num]
    w.name = spec.name
    w.description = entry.description
    w.meta.update(arrival=kind, rate=rate, cv=spec.cv, seed=spec.seed)
    if kind == "diurnal":
        w.meta["peak_to_trough"] = spec.peak_to_trough
    if schedule is not None:
        w.meta["ladder"] = schedule
    return w


def _ladder(spec: WorkloadSpec, unit: int) -> Ladder:
    """The ladder a resolved spec asks for; one-line errors for what it cannot do."""
    if spec.ladder is None:
        raise WorkloadError(f"--arrival ladder with --workload {spec.name} needs --ladder "
                            "(stages RATExSECONDS, e.g. 15x50,3x20)")
    if unit != 1:
        raise WorkloadError(f"--arrival ladder needs a workload of single requests; "
                            f"--workload {spec.name} sends {unit} per arrival")
    return Ladder.parse(spec.ladder, spec.ladder_type or "poisson",
                        DEFAULT_GAP_S if spec.ladder_gap_s is None else spec.ladder_gap_s,
                        spec.ladder_drain)


__all__ = ["DEFAULT_WORKLOAD", "INFERENCE_PERF_DEFAULTS", "LLMD_37_CAPACITY", "LLMD_73_CAPACITY",
           "SGLANG_V04_GSP", "WorkloadSpec", "build_workload", "check_options_used",
           "default_lengths", "list_workloads", "prompt_groups_of", "resolve_defaults"]
