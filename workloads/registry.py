"""Built-in named workloads (no file needed) and `build_workload(spec)`.

Each entry has a one-line description (what `kvsim workloads` prints), its default rate and
default request count (used when neither `num_requests` nor `duration_s` is given), and a
builder. The default workload (`sharegpt`, 200 requests at 2 req/s) runs in seconds.
Bundled traces live in `workloads/data/` (licenses and attribution in its README), so nothing
outside the package is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
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
from workloads.lengths import (
    EmpiricalLengths,
    EmpiricalPairs,
    IndependentPairs,
    LengthDist,
    UniformLengths,
    length_model,
)
from workloads.request import Workload
from workloads.spec import DEFAULT_WORKLOAD, WorkloadSpec, register_workload_names
from workloads.traces.load import load_trace

DATA_DIR = Path(__file__).resolve().parent / "data"
MOONCAKE_FILE = DATA_DIR / "mooncake_conversation_trace.jsonl"
AZURE_FILE = DATA_DIR / "AzureLLMInferenceTrace_conv.csv"
SHAREGPT_FILE = DATA_DIR / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


@dataclass(frozen=True)
class _Entry:
    description: str
    rate: float | None
    num_requests: int | None
    unit: int | Callable[[WorkloadSpec], int]  # requests per arrival (group / session / tree)
    build: Callable[[WorkloadSpec, np.ndarray, int | None], Workload]
    lengths: str = "fixed"  # the length model without --lengths
    # where prompt lengths come from: the length model ("lengths"), --input-len itself
    # ("input_len": a tree's root), or the generator's own knobs ("own": k-shot, chat)
    prompts: str = "lengths"


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
    def build(spec: WorkloadSpec, t: np.ndarray, cap: int | None) -> Workload:
        return independent_requests(t, _lengths(spec, default), spec.seed, _limits(spec),
                                    name=spec.name)
    return build


def _kshot(spec: WorkloadSpec, t: np.ndarray, cap: int | None) -> Workload:
    return shared_prefix(t, spec.prefix_len, spec.question_len, _output_dist(spec, "fixed"),
                         spec.seed, spec.num_prefixes, _limits(spec), name=spec.name)


def _chat(spec: WorkloadSpec, t: np.ndarray, cap: int | None) -> Workload:
    turn_in = UniformLengths(spec.turn_input_min, spec.turn_input_max)
    return chat_sessions(t, spec.num_turns, turn_in, _output_dist(spec, "uniform"),
                         spec.think_time_s, spec.system_len, spec.seed, _limits(spec),
                         max_requests=cap, name=spec.name)


def _tot(spec: WorkloadSpec, t: np.ndarray, cap: int | None) -> Workload:
    return tree_of_thought(t, spec.depth, spec.branching, spec.input_len, spec.question_len,
                           _output_dist(spec, "fixed"), spec.level_interval_s, spec.seed,
                           _limits(spec), max_requests=cap, name=spec.name)


def _parallel(spec: WorkloadSpec, t: np.ndarray, cap: int | None) -> Workload:
    return parallel_sampling(t, spec.num_samples, _lengths(spec, "sharegpt"), spec.seed,
                             _limits(spec), max_requests=cap, name=spec.name)


def _tree_size(spec: WorkloadSpec) -> int:
    return sum(spec.branching**d for d in range(spec.depth + 1))


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
    the user's path (experiments.runner.simulate_options), not by `build_workload` itself, so
    a library caller may share one spec between generators."""
    timestamps = workload.meta.get("arrival") == "trace"
    is_trace = spec.trace is not None or spec.name in _TRACES
    what = f"--trace {spec.trace}" if spec.trace is not None else f"--workload {spec.name}"
    default = WorkloadSpec()

    def changed(name: str) -> bool:
        return getattr(spec, name) != getattr(default, name)

    ignored = [n for n, users in _KNOBS.items()
               if changed(n) and (is_trace or spec.name not in users)]
    if is_trace:
        ignored += [n for n in _LENGTH_KNOBS if changed(n)]
    else:  # a length knob is read by the length model in effect, for what it draws
        ignored += [n for n in _unread_length_knobs(spec) if changed(n)]
    if not timestamps and changed("rate_scale"):
        ignored.append("rate_scale")  # it speeds up recorded timestamps only
    if (spec.arrival or ("trace" if timestamps else "poisson")) != "gamma" and changed("cv"):
        ignored.append("cv")
    if spec.arrival != "diurnal" and changed("peak_to_trough"):
        ignored.append("peak_to_trough")
    if spec.trace is None and (changed("format") or changed("skip_bad_rows")):
        ignored += [n for n in ("format", "skip_bad_rows") if changed(n)]
    if ignored:
        raise WorkloadError(f"{', '.join(_flag(n) for n in ignored)}: not used by {what} "
                            "(it would be a silent no-op); drop it")


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
    kind = spec.arrival or "poisson"
    if kind == "trace":
        raise WorkloadError(
            f"workload {spec.name!r} has no timestamps: arrival 'trace' needs a trace"
        )
    rate = spec.rate if spec.rate is not None else entry.rate
    assert rate is not None
    unit = entry.unit(spec) if callable(entry.unit) else entry.unit
    num = spec.num_requests
    if num is None and spec.duration_s is None:
        num = entry.num_requests
    units = None if num is None else math.ceil(num / unit)
    rng = np.random.default_rng([spec.seed, 0xA7])
    starts = arrival_times(ArrivalConfig(kind, rate, spec.cv, spec.peak_to_trough), rng, units,
                           spec.duration_s)
    w = entry.build(replace(spec), starts, num)
    if num is not None and unit == 1:
        w.requests = w.requests[:num]
    w.name = spec.name
    w.description = entry.description
    w.meta.update(arrival=kind, rate=rate, cv=spec.cv, seed=spec.seed)
    if kind == "diurnal":
        w.meta["peak_to_trough"] = spec.peak_to_trough
    return w


__all__ = ["DEFAULT_WORKLOAD", "WorkloadSpec", "build_workload", "check_options_used",
           "default_lengths", "list_workloads"]
