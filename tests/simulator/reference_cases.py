"""Random small workloads run through the real engine (simulator.run.simulate) and through
the plain reference engine (reference_engine.py), compared request by request.

A case is drawn from its seed: a policy (paged, paged-nocache, vllm in turn), a page size of
1, 2, 4 or 16, 3-30 open-loop requests of which most share one of a few documents (so the
prefix cache matters, duplicates included), outputs up to 120 tokens, and a pool of about
1-3 times the largest request (so admission waits, the cache is evicted and decode steps run
out of memory and preempt). The engine runs the reference's subset: `vllm` admission, fcfs,
recompute, the constant latency model, LRU eviction, no tier; prefill chunks of 8 or 32
tokens or none, within budgets of 16, 64 or 2^20 tokens an iteration.

Compared per request: status, admit, first-token and finish times (1e-9 s: both sum the same
constants, but the engine's fast-forward accumulates a stretch's step ends its own way),
cached tokens, preemptions, recomputed tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.config import SimConfig
from simulator.run import simulate
from tests.simulator.reference_engine import RefConfig, simulate_reference
from workloads.request import SHARED_TAG, PromptSpec, Request, Workload, namespace_of, unique_prompt

REF_POLICIES = ("paged", "paged-nocache", "vllm")
REF_PAGE_SIZES = (1, 2, 4, 16)
TIME_TOL_S = 1e-9
#: the result columns compared, by the engine's requests-frame names
COMPARED = ("status", "admit_s", "first_token_s", "finish_s", "cached_tokens", "preemptions",
            "recomputed_tokens")


@dataclass(frozen=True)
class RefCase:
    seed: int
    workload: Workload
    ref: RefConfig

    def sim_config(self) -> SimConfig:
        """The engine with exactly the reference's rules switched on."""
        return SimConfig.of(
            policy=self.ref.policy, admission="vllm", schedule="fcfs", preempt="recompute",
            page_size=self.ref.page_size, kv_tokens=self.ref.kv_tokens, max_context_len=2048,
            latency="constant", max_running_requests=self.ref.max_running_requests,
            max_prefill_tokens=self.ref.max_prefill_tokens,
            chunked_prefill_size=self.ref.chunked_prefill_size, eviction="lru",
            check_invariants=True, check_every=1, max_stalled_preemptions=500)

    def describe(self) -> str:
        r = self.ref
        return (f"reference seed {self.seed}: {r.policy} page={r.page_size} "
                f"kv_tokens={r.kv_tokens} rows={r.max_running_requests} "
                f"prefill={r.max_prefill_tokens}/{r.chunked_prefill_size} "
                f"requests={self.workload.num_requests}")


def make_ref_case(seed: int) -> RefCase:
    rng = np.random.default_rng([seed, 0x2E4])
    policy = REF_POLICIES[seed % len(REF_POLICIES)]
    ps = int(rng.choice(REF_PAGE_SIZES))
    n = int(rng.integers(3, 31))
    docs = [int(rng.integers(4, 120)) for _ in range(int(rng.integers(1, 4)))]
    span = float(rng.choice((0.0, 0.05, 0.3, 1.5)))
    arrivals = np.sort(rng.uniform(0.0, span, n)) if span else np.zeros(n)
    reqs: list[Request] = []
    for rid, t in enumerate(arrivals.tolist()):
        if reqs and rng.random() < 0.15:
            prompt = reqs[int(rng.integers(len(reqs)))].prompt  # the same prompt again
        else:
            segs: tuple = ()
            if rng.random() < 0.75:
                d = int(rng.integers(len(docs)))
                segs = (("unique", namespace_of(seed, d, SHARED_TAG), docs[d], 0),)
            prompt = PromptSpec(segs + unique_prompt(seed, rid, int(rng.integers(1, 80))).segments)
        out = int(rng.integers(1, 121))
        reqs.append(Request(rid, float(t), prompt, out, out + int(rng.integers(0, 20)),
                            seed=seed))
    big = max(max(r.prompt_len + r.output_len - 1, (r.prompt_len // ps + 2) * ps)
              for r in reqs)
    kv_tokens = int(big * rng.uniform(1.0, 3.0)) + ps
    rows = int(rng.choice((2, 4, 8, 64)))
    # prefill chunks and budgets from a stream of their own (the draws above stay as they were)
    pre = np.random.default_rng([seed, 0xC4])
    chunk = int(pre.choice((0, 0, 8, 32)))
    budget = int(pre.choice((1 << 20, 64, 16)))
    return RefCase(seed, Workload("reference", reqs, seed=seed),
                   RefConfig(policy, ps, kv_tokens, rows, chunk, budget))


@dataclass(frozen=True)
class RefOutcome:
    seed: int
    requests: int
    preemptions: int
    cached_tokens: int
    differences: tuple[str, ...]


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        fa, fb = float(a), float(b)  # type: ignore[arg-type]
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        return abs(fa - fb) <= TIME_TOL_S
    return a == b


def compare_case(seed: int) -> RefOutcome:
    """Run case `seed` through both engines; every request's compared columns that differ."""
    case = make_ref_case(seed)
    res = simulate(case.workload, case.sim_config())
    ref = simulate_reference(case.workload, case.ref)
    diffs = []
    rows = {int(r.request_id): r for r in res.requests.itertuples()}
    if set(rows) != set(ref):
        diffs.append(f"requests reported: engine {sorted(rows)} vs reference {sorted(ref)}")
    for rid in sorted(set(rows) & set(ref)):
        got, want = rows[rid], ref[rid]
        cols = COMPARED if want.status == "completed" else ("status",)
        for col in cols:
            g, w = getattr(got, col), getattr(want, col)
            if not _same(g, w):
                diffs.append(f"request {rid} {col}: engine {g} vs reference {w}")
    done = [r for r in ref.values() if r.status == "completed"]
    return RefOutcome(seed, len(ref), sum(r.preemptions for r in done),
                      sum(r.cached_tokens for r in done), tuple(diffs))
