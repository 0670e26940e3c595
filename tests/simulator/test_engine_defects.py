"""Regression tests for engine defects found by new users and by the differential fuzz: each
case hung, corrupted a request, aborted the run or made the fast-forward differ from stepping
before its fix. Every simulation is bounded in CPU time, so a hang fails instead of hanging.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.config import SimConfig
from simulator.run import SimResult, simulate
from tests.simulator.engine_fuzz import _differences, time_limit
from tests.simulator.helpers import assert_same_results
from workloads.request import (
    SHARED_TAG,
    PromptSpec,
    Request,
    Workload,
    namespace_of,
    unique_prompt,
)


def _workload(specs: list[tuple], seed: int = 1) -> Workload:
    """(id, arrival s, prompt, output[, max_new_tokens]) with unique prompts, in arrival order."""
    reqs = [Request(i, t, unique_prompt(seed, i, p), o, rest[0] if rest else o, seed=seed)
            for i, t, p, o, *rest in specs]
    return Workload("defect", sorted(reqs, key=lambda r: (r.arrival_s, r.request_id)),
                    seed=seed)


def _bounded(w: Workload, cfg: SimConfig, seconds: float = 30.0) -> SimResult:
    with time_limit(seconds):
        return simulate(w, cfg)


def _stepped(cfg: SimConfig) -> SimConfig:
    return cfg.replace(max_steps_per_stretch=1)


# -- 1. the head's own cached prefix counted twice -> endless preemption ----------------------
@pytest.mark.parametrize("admission", ["sglang", "vllm"])
def test_admission_leaves_out_the_heads_evictable_prefix(admission: str) -> None:
    """A preempted request's prompt is in the cache, unlocked. Counting it as free memory and
    as prefix already there admitted it, then preempted it, forever."""
    w = _workload([(2, 0.0, 257, 194), (0, 0.1, 229, 178), (1, 0.1, 44, 191),
                   (3, 0.5, 218, 244)])
    cfg = SimConfig.of(policy="paged", page_size=1, kv_tokens=800, max_context_len=512,
                    latency="constant", admission=admission, check_invariants=True)
    res = _bounded(w, cfg)
    assert res.summary["requests_completed"] == 4
    assert res.summary["preemptions"] <= 8


def test_livelock_guard_names_the_requests(monkeypatch) -> None:
    """With the double count put back, the engine stops with an error naming the victims and
    the memory state instead of looping."""
    from kvcore.contract.policy import PrefixPeek
    from kvcore.sglang.policy import SGLangPolicy
    from simulator.guard import LivelockError

    monkeypatch.setattr(SGLangPolicy, "peek_admission",
                        lambda self, ids: PrefixPeek(self.peek_prefix(ids), 0))
    w = _workload([(2, 0.0, 257, 194), (0, 0.1, 229, 178), (1, 0.1, 44, 191),
                   (3, 0.5, 218, 244)])
    cfg = SimConfig.of(policy="paged", page_size=1, kv_tokens=800, max_context_len=512,
                    latency="constant", max_stalled_preemptions=50)
    with pytest.raises(LivelockError, match=r"livelock .* request \d+ \(prompt .*capacity 800"):
        _bounded(w, cfg)


# -- 2. swap preemption in the middle of a chunked prefill ------------------------------------
def _swap_workload(seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, 15))
    times = np.sort(rng.uniform(0, 0.6, n))
    outs = rng.integers(1, 150, n)
    reqs = [Request(i, float(t), unique_prompt(seed, i, int(rng.integers(20, 200))), int(o),
                    int(o), seed=seed) for i, (t, o) in enumerate(zip(times, outs, strict=True))]
    return Workload("swap", reqs, seed=seed)


@pytest.mark.parametrize("seed", [21, 28, 38, 39])
def test_swap_of_a_prefilling_request_copies_back_only_what_it_computed(seed: int) -> None:
    """A victim with no token yet swaps out what it computed, prefills the rest after the copy
    back and still samples its first token then (it wrote final + 1 tokens before, and its
    TTFT equalled its end-to-end latency)."""
    cfg = SimConfig.of(policy="paged-nocache", page_size=1, kv_tokens=500, max_context_len=512,
                    latency="constant", preempt="swap", chunked_prefill_size=32,
                    max_prefill_tokens=64, check_invariants=True)
    res = _bounded(_swap_workload(seed), cfg)  # check_invariants: no request over-writes
    rq = res.requests
    assert (rq.status == "completed").all()
    assert res.summary["swapped_tokens"] > 0
    multi = rq[rq.output_len > 1]
    assert (multi.first_token_s < multi.finish_s).all()
    assert res.summary["generated_tokens"] == int(rq.output_len.sum())
    assert_same_results(res, _bounded(_swap_workload(seed), _stepped(cfg)))


# -- 3. the fast-forward under LPM when decode steps evict cache ------------------------------
def _lpm_workload(seed: int) -> tuple[Workload, int]:
    """Three cached documents (each warmed by a one-token request), a long-running request,
    then requests on the documents: decode steps evict documents while they wait."""
    rng = np.random.default_rng(seed)
    docs = [int(rng.integers(5, 150)) for _ in range(3)]
    reqs: list[Request] = []
    t = 0.0
    for d, length in enumerate(docs):
        segs = (("unique", namespace_of(seed, d, SHARED_TAG), length, 0),)
        own = unique_prompt(seed, len(reqs), int(rng.integers(1, 20)))
        reqs.append(Request(len(reqs), t, PromptSpec(segs + own.segments), 1, 1, seed=seed))
        t += 0.05
    reqs.append(Request(len(reqs), t, unique_prompt(seed, len(reqs), int(rng.integers(10, 100))),
                        int(rng.integers(50, 300)), 300, seed=seed))
    t += 0.05
    for _ in range(int(rng.integers(2, 6))):
        d = int(rng.integers(3))
        segs = (("unique", namespace_of(seed, d, SHARED_TAG), docs[d], 0),)
        o = int(rng.integers(1, 200))
        own = unique_prompt(seed, len(reqs), int(rng.integers(1, 250)))
        reqs.append(Request(len(reqs), t + float(rng.uniform(0, 0.2)),
                            PromptSpec(segs + own.segments), o, o + 10, seed=seed))
    reqs.sort(key=lambda r: (r.arrival_s, r.request_id))
    return Workload("lpm", reqs, seed=seed), int(rng.integers(250, 600))


@pytest.mark.parametrize("policy", ["paged", "vllm"])
@pytest.mark.parametrize("seed", [25, 54, 68, 197])
def test_lpm_fast_forward_stops_at_an_eviction(policy: str, seed: int) -> None:
    """An eviction changes the prefix hits LPM sorts by; stepping re-sorts after it, so the
    stretch must end there (before: another request was admitted seconds later)."""
    w, kv_tokens = _lpm_workload(seed)
    cfg = SimConfig.of(policy=policy, schedule="lpm", page_size=1, kv_tokens=kv_tokens,
                    max_context_len=1024, latency="constant", check_invariants=True)
    assert_same_results(_bounded(w, cfg), _bounded(w, _stepped(cfg)))


# -- 4. the admission horizon of a retracted head ---------------------------------------------
def test_horizon_uses_the_heads_remaining_output() -> None:
    """A retracted head has decoded tokens: the fast-forward's horizon must charge its
    remaining max_new_tokens, as the budget check does (it charged all of them, so the
    stretch ran past the step where stepping admits it)."""
    w = _workload([(0, 0.001, 77, 380, 1035), (1, 0.022, 78, 1107, 1363),
                   (2, 0.029, 28, 1412, 4276), (3, 0.077, 29, 1040, 2307),
                   (4, 0.227, 10, 1155, 1532)], seed=156)
    cfg = SimConfig.of(policy="paged-nocache", page_size=1, kv_tokens=3155, max_context_len=4096,
                    latency="constant")
    a, b = _bounded(w, cfg), _bounded(w, _stepped(cfg))
    assert a.summary["preemptions"] > 0
    assert _differences(a, b) == ""


# -- 6. a request longer than the context --------------------------------------------------------
@pytest.mark.parametrize("policy,admission", [("paged", "sglang"), ("vllm", "vllm"),
                                              ("contiguous-max", "reserve"),
                                              ("contiguous-pow2", "reserve"),
                                              ("contiguous-oracle", "reserve")])
def test_overlong_request_is_rejected_and_the_run_goes_on(policy: str, admission: str) -> None:
    """It arrives at an idle engine: recording the idle time asked the policy about it and
    aborted the whole run (`final_len must be <= max_context_len`) for vllm and contiguous-*."""
    w = _workload([(0, 0.0, 100, 50), (1, 5.0, 600, 20), (2, 5.05, 80, 40), (3, 5.1, 505, 20)])
    cfg = SimConfig.of(policy=policy, admission=admission, page_size=16, kv_tokens=4096,
                    max_context_len=512, latency="constant", check_invariants=True)
    res = _bounded(w, cfg)
    rq = res.requests.set_index("request_id")
    assert res.summary["requests_rejected"] == 1
    assert rq.loc[1, "status"] == "rejected"
    assert "max context length 512" in rq.loc[1, "reject_reason"]
    assert res.summary["requests_completed"] == 3
