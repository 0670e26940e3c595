"""Small workloads and comparison helpers shared by the simulator tests.

Everything here runs with the `constant` latency model (1e-4 s per prefill token, 0.02 s per
decode step) and pools of a few thousand slots, so one simulation takes tens of milliseconds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.config import SimConfig
from simulator.run import SimResult, simulate
from workloads.arrivals import fixed_arrivals
from workloads.generators import chat_sessions, shared_prefix
from workloads.lengths import UniformLengths
from workloads.request import Request, Workload, unique_prompt

PAGED_POLICIES = ("paged", "paged-nocache", "vllm")
CONTIGUOUS_POLICIES = ("contiguous-max", "contiguous-pow2", "contiguous-oracle")
ADMISSIONS = ("sglang", "vllm", "reserve")

# summary keys that are not simulation results
NON_DETERMINISTIC_KEYS = ("sim_wall_s",)


def config(**kw) -> SimConfig:
    """A small engine: constant latency, a 2048-slot pool, 512-token max context."""
    base = dict(latency="constant", kv_tokens=2048, max_context_len=512, page_size=16,
                max_running_requests=32, max_prefill_tokens=1024, chunked_prefill_size=256,
                check_invariants=True)
    base.update(kw)
    return SimConfig.of(**base)


def run(workload: Workload, **kw) -> SimResult:
    return simulate(workload, config(**kw))


def kshot(n: int = 40, rate: float = 8.0, prefix: int = 120, question: int = 24,
          out=UniformLengths(4, 60), seed: int = 3, num_prefixes: int = 2) -> Workload:
    """Shared-prefix requests arriving at a fixed rate, with varied output lengths."""
    return shared_prefix(fixed_arrivals(rate, n), prefix, question, out, seed=seed,
                         num_prefixes=num_prefixes)


def chat(sessions: int = 4, turns: int = 3, spacing_s: float = 0.5, seed: int = 5,
         think_time_s: float = 0.2, system_len: int = 40) -> Workload:
    """Closed-loop multi-turn chat sessions with short turns."""
    starts = np.arange(sessions, dtype=float) * spacing_s
    return chat_sessions(starts, turns, UniformLengths(10, 40), UniformLengths(5, 30),
                         think_time_s=think_time_s, system_len=system_len, seed=seed)


def identical(n: int, prompt_len: int, output_len: int, spacing_s: float = 0.0,
              seed: int = 11, max_new_tokens: int | None = None) -> Workload:
    """`n` requests with unique prompts of the same length and the same output length."""
    mnt = output_len if max_new_tokens is None else max_new_tokens
    reqs = [Request(i, i * spacing_s, unique_prompt(seed, i, prompt_len), output_len, mnt,
                    seed=seed) for i in range(n)]
    return Workload("identical", reqs, seed=seed)


def with_misfits(base: Workload, max_context_len: int, pool_slots: int = 0) -> Workload:
    """`base` plus requests that can never run: a prompt longer than the max context length,
    a prompt that fills it (no room to generate) and, when `pool_slots` is set (a pool smaller
    than the max context length), a request whose prompt + output exceed the pool."""
    seed = base.seed
    t = base.requests[len(base.requests) // 2].arrival_s if base.requests else 0.0
    ids = [r.request_id for r in base.requests] + [i for s in base.sessions
                                                   for i in s.request_ids]
    nid = max(ids, default=-1) + 1
    extra = [
        Request(nid, t, unique_prompt(seed, nid, max_context_len + 5), 10, 10, seed=seed),
        Request(nid + 1, t, unique_prompt(seed, nid + 1, max_context_len), 4, 4, seed=seed),
    ]
    if pool_slots:
        assert pool_slots + 10 < max_context_len
        extra.append(Request(nid + 2, t, unique_prompt(seed, nid + 2, pool_slots + 10), 40, 40,
                             seed=seed))
    reqs = sorted(base.requests + extra, key=lambda r: (r.arrival_s, r.request_id))
    return Workload(base.name + "+misfits", reqs, sessions=list(base.sessions), seed=seed)


def assert_same_results(a: SimResult, b: SimResult) -> None:
    """Identical summaries (but wall-clock time), request frames and timelines."""
    sa = {k: v for k, v in a.summary.items() if k not in NON_DETERMINISTIC_KEYS}
    sb = {k: v for k, v in b.summary.items() if k not in NON_DETERMINISTIC_KEYS}
    sa.pop("max_steps_per_stretch", None)
    sb.pop("max_steps_per_stretch", None)
    assert sa.keys() == sb.keys()
    diff = {k: (sa[k], sb[k]) for k in sa if not _same(sa[k], sb[k])}
    assert not diff, f"summaries differ: {diff}"
    pd.testing.assert_frame_equal(a.requests.reset_index(drop=True),
                                  b.requests.reset_index(drop=True), check_exact=True)
    assert a.timeline_rows == b.timeline_rows, "timelines differ"


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float) and np.isnan(x) and np.isnan(y):
        return True
    return x == y


def replace(cfg: SimConfig, **kw) -> SimConfig:
    return cfg.replace(**kw)


def mixed(seed: int = 7, n_open: int = 24, sessions: int = 3) -> Workload:
    """Open-loop requests (shared-prefix and private prompts, varied lengths, bursts) mixed
    with closed-loop chat sessions: one stream that exercises queueing, prefix hits, chunked
    prefill, preemption and session releases together."""
    base = chat(sessions=sessions, turns=3, spacing_s=0.4, seed=seed)
    rng = np.random.default_rng(seed)
    first = sum(len(s.turns) for s in base.sessions)
    shared = kshot(n=n_open, rate=20.0, prefix=96, question=16, seed=seed)
    reqs = []
    for i, r in enumerate(shared.requests):
        rid = first + i
        # every third request has a private prompt of random length
        prompt = unique_prompt(seed, rid, int(rng.integers(20, 300))) if i % 3 == 2 else r.prompt
        out = int(rng.integers(1, 120))
        arrival = r.arrival_s if i % 4 else max(r.arrival_s - 0.04, 0.0)
        reqs.append(Request(rid, arrival, prompt, out, out + int(rng.integers(0, 40)),
                            seed=seed))
    reqs.sort(key=lambda r: (r.arrival_s, r.request_id))
    return Workload("mixed", reqs, sessions=base.sessions, seed=seed)
