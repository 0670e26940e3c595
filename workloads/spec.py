"""`WorkloadSpec`: every knob of a workload in one frozen dataclass.

Each field is one command-line option and experiment-file key of kvsim's run commands
(`rate_scale` is `--rate-scale`; `name` is `--workload`), declared with its help, allowed
values and domain (kvcore.contract.fields.spec_field), and validated once, when the spec is built.
`None` means "the named workload's default" (see `workloads.registry.list_workloads`).

Two fields are not options of a composed run: `seed` and `max_context_len` come from the
run's `--seed` and its model's maximum context (experiments.options.run_options fills them in).

The built-in workload names belong to workloads.registry, which imports this module; it hands
its names over with `register_workload_names` instead of this module importing it back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvcore.contract.fields import MAX_I32, MAX_SEED, MAX_TOKENS, Domain, check_fields, spec_field
from workloads.errors import WorkloadError
from workloads.ladder import DEFAULT_GAP_S, LADDER_TYPES, parse_ladder
from workloads.traces.formats import TRACE_FORMATS
from workloads.traces.load import DEFAULT_MAX_CONTEXT_LEN

DEFAULT_WORKLOAD = "sharegpt"
ARRIVALS = ("poisson", "gamma", "fixed", "trace", "diurnal", "ladder", "burst")
LENGTH_MODELS = ("sharegpt", "alpaca", "sharegpt-real", "fixed", "uniform", "lognormal")

# options read by one arrival process only -> that process. Summary rows and the config hash
# carry them only for runs of that process (experiments.answers.runner.summary_row,
# RunOptions.config_hash), so the columns and hashes of every other run are what they were
# before the option existed: a resumed sweep does not re-run its cells, and recorded results
# keep their columns.
ARRIVAL_ONLY: dict[str, str] = {"peak_to_trough": "diurnal", "ladder": "ladder",
                                "ladder_type": "ladder", "ladder_gap_s": "ladder",
                                "ladder_drain": "ladder"}
# options read by one kind of generator only (workloads.registry's `generator` of a built-in
# workload) -> those kinds; kept out of every other run's row and hash the same way
GROUPED = ("shared-prefix", "generated-shared-prefix")  # workloads/prompt_groups.py
GENERATOR_ONLY: dict[str, tuple[str, ...]] = {
    name: GROUPED for name in ("gsp_num_groups", "gsp_prompts_per_group",
                               "gsp_system_prompt_len", "gsp_question_len", "gsp_output_len",
                               "ignore_eos")}


def unused_options(values: dict) -> list[str]:
    """The ARRIVAL_ONLY and GENERATOR_ONLY options among `values` (flat option name -> value)
    that the run's arrival process or workload generator does not read. The arrival process
    is `arrival`, else the built-in workload's default (a named ladder workload reads its
    ladder options without `--arrival ladder`)."""
    name = values.get("workload")
    trace = values.get("trace") is not None
    defaults = {} if trace else workload_defaults(name)
    arrival = values.get("arrival") or defaults.get("arrival")
    out = [k for k, kind in ARRIVAL_ONLY.items() if k in values and arrival != kind]
    generator = None if trace else defaults.get("generator")
    out += [k for k, kinds in GENERATOR_ONLY.items() if k in values and generator not in kinds]
    return out


_NAME_SOURCES: list[Callable[[], Iterable[str]]] = []
_DEFAULT_SOURCES: list[Callable[[str], dict]] = []


def register_workload_names(source: Callable[[], Iterable[str]]) -> None:
    """Called by workloads.registry at import: where the built-in names come from."""
    _NAME_SOURCES.append(source)


def register_workload_defaults(source: Callable[[str], dict]) -> None:
    """Called by workloads.registry at import: a built-in workload's defaults by name
    (`arrival`, `generator` and the options it sets)."""
    _DEFAULT_SOURCES.append(source)


def workload_defaults(name: str | None) -> dict:
    """What the built-in workload `name` sets when an option is left at None ({} for none)."""
    out: dict = {}
    for source in _DEFAULT_SOURCES:
        out.update(source(name or DEFAULT_WORKLOAD))
    return out


def workload_names() -> list[str]:
    """The built-in workloads (registered by workloads.registry, which every import of this
    package loads first: workloads/__init__.py imports it)."""
    return [n for source in _NAME_SOURCES for n in source()]


def _positive(hi: float) -> Domain:
    return Domain(1, hi)


_NONNEG = Domain(0)
_ABOVE_ZERO = Domain(0, lo_inclusive=False)


@dataclass(frozen=True)
class WorkloadSpec:
    """What to generate or load. `trace` (a file path) wins over `name`."""

    name: str = spec_field(DEFAULT_WORKLOAD, "built-in workload (see `kvsim workloads`)",
                           choices=workload_names, option="workload", axis=True)
    trace: str | None = spec_field(None, "trace file to replay (wins over --workload)",
                                   path=True)
    format: str = spec_field("auto", "trace format", choices=TRACE_FORMATS)
    skip_bad_rows: bool = spec_field(False, "skip malformed trace rows instead of failing")
    # arrivals
    # the rate of requests, groups, sessions or trees
    rate: float | None = spec_field(None, "arrival rate per second (default: the workload's)",
                                    domain=_ABOVE_ZERO, axis=True)
    arrival: str | None = spec_field(None, "arrival process (default: trace times if any, "
                                     "else poisson)", choices=ARRIVALS)
    cv: float = spec_field(1.0, "coefficient of variation of gamma arrivals",
                           domain=_ABOVE_ZERO)
    peak_to_trough: float = spec_field(
        3.0, "diurnal arrivals: the rate at its peak (12 h) over the rate at its trough "
        "(midnight); --rate is the day's mean", domain=Domain(1))
    rate_scale: float = spec_field(1.0, "trace replay speed-up", domain=_ABOVE_ZERO)
    duration_s: float | None = spec_field(
        None, "seconds of arrivals to generate; also ends the measurement window",
        domain=_ABOVE_ZERO)
    num_requests: int | None = spec_field(None, "number of requests (default: the "
                                          "workload's)", domain=_positive(MAX_I32))
    # output limits
    max_new_tokens: int | None = spec_field(None, "cap on output tokens per request",
                                            domain=_positive(MAX_TOKENS))
    max_context_len: int = spec_field(DEFAULT_MAX_CONTEXT_LEN, "max context length",
                                      domain=_positive(MAX_TOKENS), derived="max_context_len")
    seed: int = spec_field(0, "random seed", domain=Domain(0, MAX_SEED), derived="seed")
    # lengths (synthetic workloads)
    lengths: str | None = spec_field(None, "length model of synthetic workloads",
                                     choices=LENGTH_MODELS)
    input_len: int = spec_field(512, "mean prompt length (fixed/uniform/lognormal; tot root)",
                                domain=_positive(MAX_TOKENS))
    output_len: int = spec_field(128, "mean output length (fixed/uniform/lognormal)",
                                 domain=_positive(MAX_TOKENS))
    spread: float = spec_field(0.5, "uniform lengths: mean x (1 -/+ spread)",
                               domain=Domain(0, 1))
    sigma: float = spec_field(1.0, "lognormal lengths: sigma", domain=_NONNEG)
    # prefix-sharing generators
    prefix_len: int = spec_field(1024, "kshot: shared prefix length", domain=Domain(0, MAX_TOKENS))
    question_len: int = spec_field(128, "kshot: question length; tot: per-node instruction",
                                   domain=_positive(MAX_TOKENS))
    num_prefixes: int = spec_field(1, "kshot: distinct shared prefixes",
                                   domain=_positive(MAX_I32))
    num_turns: int = spec_field(4, "chat: turns per session", domain=_positive(MAX_I32))
    turn_input_min: int = spec_field(256, "chat: min new input per turn",
                                     domain=_positive(MAX_TOKENS))
    turn_input_max: int = spec_field(512, "chat: max new input per turn",
                                     domain=_positive(MAX_TOKENS))
    think_time_s: float = spec_field(5.0, "chat: mean think time (s)",
                                     domain=_NONNEG)
    system_len: int = spec_field(0, "chat: shared system prompt length",
                                 domain=Domain(0, MAX_TOKENS))
    depth: int = spec_field(2, "tot: levels below the root", domain=Domain(0, 64))
    branching: int = spec_field(3, "tot: children per node", domain=_positive(MAX_TOKENS))
    level_interval_s: float = spec_field(2.0, "tot: delay between levels (s)",
                                         domain=_NONNEG)
    num_samples: int = spec_field(4, "parallel-sampling: outputs per prompt",
                                  domain=_positive(MAX_I32))
    # the benchmarks' grouped shared-prefix datasets (workloads/prompt_groups.py), named
    # after SGLang's bench_serving flags; llm-d's shared_prefix has the same five
    gsp_num_groups: int | None = spec_field(
        None, "shared-prefix workloads: prompt groups, each with its own system prompt "
        "(default: the workload's)", domain=_positive(MAX_I32))
    gsp_prompts_per_group: int | None = spec_field(
        None, "shared-prefix workloads: prompts (questions) per group (default: the "
        "workload's)", domain=_positive(MAX_I32))
    gsp_system_prompt_len: int | None = spec_field(
        None, "shared-prefix workloads: system prompt tokens (default: the workload's)",
        domain=Domain(0, MAX_TOKENS))
    gsp_question_len: int | None = spec_field(
        None, "shared-prefix workloads: question tokens (default: the workload's)",
        domain=_positive(MAX_TOKENS))
    gsp_output_len: int | None = spec_field(
        None, "shared-prefix workloads: output tokens, the max_tokens each request sends "
        "(default: the workload's)", domain=_positive(MAX_TOKENS))
    ignore_eos: bool = spec_field(
        True, "shared-prefix workloads: every answer runs to its output length (off: true "
        "lengths from --lengths, capped there)")
    # QPS ladder arrivals (workloads/ladder.py)
    ladder: str | None = spec_field(
        None, "ladder arrivals: stages RATExSECONDS, comma separated, e.g. 15x50,3x20 "
        "(default: the workload's)")
    ladder_type: str | None = spec_field(
        None, "ladder arrivals: every stage's timer as inference-perf's load.type "
        "(default: the workload's, else poisson)", choices=LADDER_TYPES)
    ladder_gap_s: float | None = spec_field(
        None, f"ladder arrivals: seconds from a stage's last arrival to the next stage's "
        f"start (default {DEFAULT_GAP_S:g}: inference-perf's 1 s interval + 1 s lead)",
        domain=_NONNEG)
    ladder_drain: bool = spec_field(
        True, "ladder arrivals: a stage starts once every request before it has finished, "
        "as inference-perf's load generator waits (off: stages at their generated times)")

    def __post_init__(self) -> None:
        check_fields(self, error=WorkloadError)
        if self.turn_input_min > self.turn_input_max:
            raise WorkloadError(f"--turn-input-min {self.turn_input_min} is above "
                                f"--turn-input-max {self.turn_input_max}")
        if self.ladder is not None:
            parse_ladder(self.ladder)  # one line naming the bad stage
        if self.prompts_per_tree() > MAX_TOKENS:
            raise WorkloadError(f"--depth {self.depth} with --branching {self.branching} makes "
                                f"more than {MAX_TOKENS:,} prompts per tree")

    def prompts_per_tree(self) -> int:
        """tot: 1 + b + b^2 + ... + b^depth (stops counting once past MAX_TOKENS)."""
        nodes, level = 0, 1
        for _ in range(self.depth + 1):
            nodes += level
            level *= self.branching
            if nodes > MAX_TOKENS:
                break
        return nodes

