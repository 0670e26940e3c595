"""`WorkloadSpec`: every knob of a workload in one dataclass.

The CLI maps its options onto these fields one to one (option `--rate-scale` is field
`rate_scale`), so keep names in step with the options. `None` means "the named workload's
default" (see `workloads.registry.list_workloads`).
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.traces.load import DEFAULT_MAX_CONTEXT_LEN

DEFAULT_WORKLOAD = "sharegpt"


@dataclass
class WorkloadSpec:
    """What to generate or load. `trace` (a file path) wins over `name`."""

    name: str = DEFAULT_WORKLOAD
    trace: str | None = None
    format: str = "auto"
    skip_bad_rows: bool = False
    # arrivals
    rate: float | None = None  # per second: requests, or prompt groups / sessions / trees
    arrival: str | None = None  # poisson | gamma | fixed | trace; None: trace if it has times
    cv: float = 1.0  # gamma only
    rate_scale: float = 1.0  # trace replay speed-up
    duration_s: float | None = None
    num_requests: int | None = None
    # output limits
    max_new_tokens: int | None = None
    max_context_len: int = DEFAULT_MAX_CONTEXT_LEN
    seed: int = 0
    # lengths (synthetic workloads)
    lengths: str | None = None  # sharegpt | alpaca | sharegpt-real | fixed | uniform | lognormal
    input_len: int = 512
    output_len: int = 128
    spread: float = 0.5  # uniform: mean * (1 -/+ spread)
    sigma: float = 1.0  # lognormal
    # prefix-sharing generators
    prefix_len: int = 1024  # kshot: shared prefix S
    question_len: int = 128  # kshot: question Q; tot: per-node instruction
    num_prefixes: int = 1  # kshot: distinct shared prefixes
    num_turns: int = 4  # chat
    turn_input_min: int = 256  # chat: new input per turn, uniform on [min, max]
    turn_input_max: int = 512
    think_time_s: float = 5.0  # chat: mean exponential think time
    system_len: int = 0  # chat: shared system prompt
    depth: int = 2  # tot: levels below the root
    branching: int = 3  # tot: children per node
    level_interval_s: float = 2.0  # tot: delay between levels
    num_samples: int = 4  # parallel sampling: outputs per prompt
