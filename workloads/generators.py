"""Synthetic request streams, from plain independent prompts to the prefix-sharing patterns
the radix cache was built for (shared system prompt / k-shot, multi-turn chat, tree of
thought, parallel sampling).

Each generator takes its arrival times (units: requests, prompt groups, sessions or trees, as
documented per function) and a seed, and names its content through `namespace_of`, so the
same arguments always give the same token ids and different roles never collide:
`(seed, request_id, PROMPT_TAG)` for a request's own text, `(seed, group, SHARED_TAG)` for a
shared prefix, `(seed, request_id, TURN_TAG)` for a turn's new input, `(seed, request_id,
STEP_TAG)` for a tree node's instruction, and `(seed, group, PROMPT_TAG, 1)` for a parallel
sampling prompt. Output ids come from `(seed, request_id, OUTPUT_TAG)` (see request.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workloads.columns import GeneratedRequests
from workloads.errors import WorkloadError
from workloads.lengths import LengthDist, LengthModel
from workloads.request import (
    OUTPUT_TAG,
    PROMPT_TAG,
    SHARED_TAG,
    STEP_TAG,
    TURN_TAG,
    PromptSpec,
    Request,
    Session,
    Turn,
    Workload,
    namespace_of,
)
from workloads.traces.load import DEFAULT_MAX_CONTEXT_LEN, resolve_max_new_tokens


@dataclass(frozen=True)
class OutputLimits:
    """How `max_new_tokens` is set for synthetic requests (same rule as trace loading)."""

    max_new_tokens: int | None = None
    max_context_len: int = DEFAULT_MAX_CONTEXT_LEN

    def apply(self, prompt_len: int, output_len: int) -> tuple[int, int]:
        return resolve_max_new_tokens(
            prompt_len, int(output_len), None, self.max_new_tokens, self.max_context_len
        )


def _check_count(name: str, value: int, minimum: int = 1) -> None:
    if not isinstance(value, (int, np.integer)) or value < minimum:
        raise WorkloadError(f"{name} must be an integer >= {minimum}, got {value!r}")


def independent_requests(
    arrivals: np.ndarray,
    lengths: LengthModel,
    seed: int = 0,
    limits: OutputLimits = OutputLimits(),
    name: str = "synthetic",
) -> Workload:
    """One request per arrival, unique prompt content, (input, output) from `lengths`: the
    vLLM paper's setting (ShareGPT / Alpaca lengths, Poisson arrivals, no sharing)."""
    rng = np.random.default_rng([seed, 0x1E])
    inp, out = lengths.sample_pairs(rng, len(arrivals))
    n = len(arrivals)
    plens, outs, mnts = (np.empty(n, dtype=np.int64) for _ in range(3))
    for i, (p, o) in enumerate(zip(inp.tolist(), out.tolist(), strict=True)):
        mnts[i], outs[i] = limits.apply(p, o)
        plens[i] = p
    # held as columns, each Request built as the engine reaches it (workloads/columns.py)
    return Workload(name, GeneratedRequests(np.asarray(arrivals, dtype=np.float64), plens,
                                            outs, mnts, seed), seed=seed)


def shared_prefix(
    arrivals: np.ndarray,
    prefix_len: int,
    question_len: int,
    output: LengthDist,
    seed: int = 0,
    num_prefixes: int = 1,
    limits: OutputLimits = OutputLimits(),
    name: str = "kshot",
) -> Workload:
    """System prompt / k-shot: every request is one of `num_prefixes` shared prefixes of
    `prefix_len` tokens (round robin) followed by its own `question_len`-token question. The
    vLLM paper's 1-shot / 5-shot translation prefixes were 80 / 341 tokens."""
    _check_count("prefix_len", prefix_len, 0)
    _check_count("question_len", question_len)
    _check_count("num_prefixes", num_prefixes)
    rng = np.random.default_rng([seed, 0x5E])
    outs = output.sample(rng, len(arrivals))
    reqs = []
    for rid, (t, o) in enumerate(zip(arrivals.tolist(), outs.tolist(), strict=True)):
        g = rid % num_prefixes
        segs = (("unique", namespace_of(seed, g, SHARED_TAG), prefix_len, 0),) if prefix_len else ()
        segs += (("unique", namespace_of(seed, rid, PROMPT_TAG), question_len, 0),)
        prompt = PromptSpec(segs)
        mnt, o2 = limits.apply(prompt.length, o)
        reqs.append(Request(rid, t, prompt, o2, mnt, seed=seed, meta={"prefix": g}))
    return Workload(name, reqs, seed=seed)


def chat_sessions(
    starts: np.ndarray,
    num_turns: int,
    turn_input: LengthDist,
    output: LengthDist,
    think_time_s: float = 5.0,
    system_len: int = 0,
    seed: int = 0,
    limits: OutputLimits = OutputLimits(),
    max_requests: int | None = None,
    name: str = "chat",
) -> Workload:
    """Closed-loop multi-turn chat: one `Session` per start time, `num_turns` turns each
    (the SGLang paper: 4 turns of 256-512 new tokens). Turn k+1 is released an exponential
    think time (mean `think_time_s`; 0 = immediately) after turn k finishes, and its prompt is
    turn k's prompt + turn k's output ids + the new input. An optional `system_len`-token
    system prompt, shared by all sessions, starts turn 0. Request ids are consecutive per
    session; `max_requests` cuts the last session short so the total is exact."""
    _check_count("num_turns", num_turns)
    _check_count("system_len", system_len, 0)
    if not think_time_s >= 0:
        raise WorkloadError(f"think_time_s must be >= 0, got {think_time_s!r}")
    rng = np.random.default_rng([seed, 0xC4])
    sessions: list[Session] = []
    rid = 0
    total = len(starts) * num_turns if max_requests is None else max_requests
    system = namespace_of(seed, 0, SHARED_TAG)
    for sid, t0 in enumerate(starts.tolist()):
        n = min(num_turns, total - rid)
        if n <= 0:
            break
        ins = turn_input.sample(rng, n).tolist()
        outs = output.sample(rng, n).tolist()
        thinks = rng.exponential(think_time_s, n).tolist() if think_time_s > 0 else [0.0] * n
        turns: list[Turn] = []
        ids = list(range(rid, rid + n))
        prompt_len = 0
        for k in range(n):
            segs: tuple = ()
            if k == 0 and system_len:
                segs = (("unique", system, system_len, 0),)
            segs += (("unique", namespace_of(seed, ids[k], TURN_TAG), ins[k], 0),)
            prompt_len += (system_len if k == 0 else 0) + ins[k]
            mnt, o2 = limits.apply(prompt_len, outs[k])
            turns.append(Turn(PromptSpec(segs), o2, mnt, think_time_s=0.0 if k == 0 else thinks[k]))
            prompt_len += o2
        sessions.append(Session(sid, float(t0), turns, ids, seed=seed))
        rid += n
    return Workload(name, [], sessions=sessions, seed=seed)


def tree_of_thought(
    starts: np.ndarray,
    depth: int,
    branching: int,
    root_len: int,
    step_len: int,
    output: LengthDist,
    level_interval_s: float = 1.0,
    seed: int = 0,
    limits: OutputLimits = OutputLimits(),
    max_requests: int | None = None,
    name: str = "tot",
) -> Workload:
    """Tree-of-thought branching: a root prompt (`root_len` tokens) at each start time, and
    `branching` children per node down to `depth` levels below the root. A child's prompt is
    its parent's prompt + the parent's output ids + a `step_len`-token instruction, so
    siblings share everything their ancestors wrote. Open-loop approximation: level d is
    released `d * level_interval_s` after the root (the simulator does not wait for the
    parent; if the parent is not done yet, the child simply finds less cached)."""
    _check_count("depth", depth, 0)
    _check_count("branching", branching)
    _check_count("root_len", root_len)
    _check_count("step_len", step_len)
    rng = np.random.default_rng([seed, 0x70])
    per_tree = sum(branching**d for d in range(depth + 1))
    total = len(starts) * per_tree if max_requests is None else max_requests
    reqs: list[Request] = []
    rid = 0
    for tree, t0 in enumerate(starts.tolist()):
        if rid >= total:
            break
        outs = output.sample(rng, per_tree).tolist()
        level: list[Request] = []
        k = 0
        for d in range(depth + 1):
            nxt: list[Request] = []
            parents = [None] if d == 0 else [p for p in level for _ in range(branching)]
            for parent in parents:
                if rid >= total:
                    break
                if parent is None:
                    segs: tuple = (("unique", namespace_of(seed, rid, PROMPT_TAG), root_len, 0),)
                else:
                    pout = namespace_of(seed, parent.request_id, OUTPUT_TAG)
                    segs = (*parent.prompt.segments, ("unique", pout, parent.output_len, 0),
                            ("unique", namespace_of(seed, rid, STEP_TAG), step_len, 0))
                prompt = PromptSpec(segs)
                mnt, o2 = limits.apply(prompt.length, outs[k])
                k += 1
                r = Request(rid, t0 + d * level_interval_s, prompt, o2, mnt, seed=seed,
                            meta={"tree": tree, "depth": d,
                                  "parent": None if parent is None else parent.request_id})
                nxt.append(r)
                reqs.append(r)
                rid += 1
            level = nxt
    reqs.sort(key=lambda r: (r.arrival_s, r.request_id))
    return Workload(name, reqs, seed=seed)


def parallel_sampling(
    starts: np.ndarray,
    num_samples: int,
    lengths: LengthModel,
    seed: int = 0,
    limits: OutputLimits = OutputLimits(),
    max_requests: int | None = None,
    name: str = "parallel-sampling",
) -> Workload:
    """Parallel sampling (n outputs of one prompt): at each start time, `num_samples` requests
    with the same prompt arrive together, each with its own output (own ids, own length). The
    prompt length is the first of the group's sampled pairs; each sample's output length is
    its own pair's output."""
    _check_count("num_samples", num_samples)
    rng = np.random.default_rng([seed, 0x9A])
    inp, out = lengths.sample_pairs(rng, len(starts) * num_samples)
    total = len(starts) * num_samples if max_requests is None else max_requests
    reqs: list[Request] = []
    for g, t in enumerate(starts.tolist()):
        p = int(inp[g * num_samples])
        prompt = PromptSpec((("unique", namespace_of(seed, g, PROMPT_TAG, 1), p, 0),))
        for j in range(num_samples):
            rid = len(reqs)
            if rid >= total:
                break
            mnt, o2 = limits.apply(p, int(out[g * num_samples + j]))
            reqs.append(Request(rid, t, prompt, o2, mnt, seed=seed, meta={"group": g}))
    return Workload(name, reqs, seed=seed)
