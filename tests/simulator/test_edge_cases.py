"""Edge cases of the engine: each run ends with conservation holding (every request completed
or rejected with a reason, invariants checked after every iteration), and the requests that
complete are exactly those that can fit.

Run across `paged` (SGLang admission), `vllm` (vLLM admission) and `contiguous-oracle`
(reserve admission). Whether a request can ever run depends on the admission mode:

* sglang: SGLang caps max_new_tokens at min(context, pool) - prompt, so any prompt shorter
  than the pool runs (its output cut to fit) and a prompt of the pool's size or more never does;
* vllm: vLLM needs ceil((prompt + 1) / page) pages to admit and the whole final length to
  finish, with no output cap from the pool;
* reserve (contiguous-oracle): one contiguous range of final length, rounded up to pages.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.config import SimConfig
from simulator.run import SimResult, simulate
from workloads.request import Request, Workload, unique_prompt

ADMISSION = {"paged": "sglang", "vllm": "vllm", "contiguous-oracle": "reserve"}
POLICIES = tuple(ADMISSION)
SEED = 3
MAX_CTX = 4096


def config(policy: str, **kw) -> SimConfig:
    base = dict(policy=policy, admission=ADMISSION[policy], latency="constant",
                kv_tokens=1024, max_context_len=MAX_CTX, page_size=16,
                max_running_requests=64, max_prefill_tokens=2048, chunked_prefill_size=512,
                check_invariants=True, check_every=1)
    base.update(kw)
    return SimConfig.of(**base)


def workload(specs: list[tuple], name: str = "edge") -> Workload:
    """Requests from (arrival_s, prompt spec, output_len, max_new_tokens), ids in order."""
    reqs = [Request(i, t, p, o, m, seed=SEED) for i, (t, p, o, m) in enumerate(specs)]
    return Workload(name, reqs, seed=SEED)


def can_run(policy: str, r: Request, capacity: int, page_size: int) -> bool:
    """Whether `r` can ever complete in an empty engine with a pool of `capacity` slots."""
    final = r.prompt_len + max(min(r.output_len, r.max_new_tokens), 1) - 1
    if ADMISSION[policy] == "sglang":
        return r.prompt_len < capacity
    if ADMISSION[policy] == "vllm":
        return final <= capacity and r.prompt_len + 1 <= capacity
    pages = -(-final // page_size)
    return pages * page_size <= capacity


def assert_conserved(res: SimResult, wl: Workload) -> None:
    """Every request exactly once, completed or rejected with a reason; counts agree."""
    assert res.config.engine.check_invariants and res.config.tuning.check_every == 1
    rq = res.requests
    assert len(rq) == wl.num_requests
    assert set(rq.request_id) == {r.request_id for r in wl.requests}
    assert set(rq.status) <= {"completed", "rejected"}
    rejected = rq[rq.status == "rejected"]
    assert (rejected.reject_reason.str.len() > 0).all()
    s = res.summary
    assert s["requests_completed"] + s["requests_rejected"] == wl.num_requests
    assert s["requests_completed"] == int((rq.status == "completed").sum())
    done = rq[rq.status == "completed"]
    assert (done.first_token_s >= done.arrival_s).all()
    assert (done.finish_s >= done.first_token_s).all()
    assert (done.reject_reason == "").all()


def assert_fits_decide(res: SimResult, wl: Workload, policy: str) -> None:
    """Completed exactly the requests that can fit; the rest rejected."""
    cfg = res.config
    capacity = res.summary["capacity_slots"]
    expect = {r.request_id for r in wl.requests
              if can_run(policy, r, capacity, cfg.policy.page_size)}
    rq = res.requests
    assert set(rq[rq.status == "completed"].request_id) == expect
    # a request that cannot fit is refused up front with what it needs, not by the catch-all
    assert not rq.reject_reason.str.contains("does not fit even").any()


def small(n: int, t0: float = 0.0, gap: float = 0.01, start_id: int = 0) -> list[tuple]:
    return [(t0 + i * gap, unique_prompt(SEED, start_id + i, 40 + 7 * i), 10 + i, 20 + i)
            for i in range(n)]


@pytest.mark.parametrize("policy", POLICIES)
def test_request_larger_than_pool(policy):
    """A prompt longer than the pool, and a prompt that fits with an output that does not:
    rejected with a reason (or, under SGLang admission, the output is cut to fit the pool),
    while the requests around them complete. Alone in the engine it does not hang either."""
    specs = small(4)
    specs.insert(2, (0.015, unique_prompt(SEED, 100, 2000), 20, 20))  # prompt > pool
    specs.insert(3, (0.016, unique_prompt(SEED, 101, 900), 300, 300))  # final > pool
    wl = workload(specs)
    res = simulate(wl, config(policy))
    assert_conserved(res, wl)
    assert_fits_decide(res, wl, policy)
    rq = res.requests.set_index("request_id")
    assert rq.loc[2, "status"] == "rejected"
    assert "the pool has 1024" in rq.loc[2, "reject_reason"]
    if policy == "paged":
        assert rq.loc[3, "status"] == "completed"
        assert rq.loc[3, "final_len"] <= 1024
    else:
        assert rq.loc[3, "status"] == "rejected"
    alone = workload([(0.0, unique_prompt(SEED, 7, 3000), 8, 8)])
    res = simulate(alone, config(policy))
    assert_conserved(res, alone)
    assert res.summary["requests_rejected"] == 1
    assert "the pool has 1024" in res.requests.reject_reason.iloc[0]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_same_prompt(policy):
    """60 requests with one prompt (20 at once, then a stream): all complete, and the
    prefix-caching policies serve later ones from the cache."""
    same = unique_prompt(SEED, 99, 200)
    wl = workload([(0.0 if i < 20 else 0.01 * i, same, 5 + i % 7, 30) for i in range(60)])
    res = simulate(wl, config(policy))
    assert_conserved(res, wl)
    assert res.summary["requests_completed"] == 60
    hits = int(res.requests.cached_tokens.sum())
    if policy == "contiguous-oracle":
        assert hits == 0
    else:
        assert hits >= 40 * 192  # a whole-page prefix of 192 of the 200 tokens, at least
    # the same again with no output at all, all at one instant: each finishes at prefill
    wl0 = workload([(0.0, same, 0, 0) for _ in range(20)])
    res = simulate(wl0, config(policy))
    assert_conserved(res, wl0)
    assert res.summary["requests_completed"] == 20


@pytest.mark.parametrize("policy", POLICIES)
def test_outputs_of_length_zero_and_one(policy):
    """Output 0 (prefill only) and 1 (the first token ends it): no decode step, final length =
    prompt, no time per output token; with max_new_tokens 0, 1 or more."""
    specs = [(0.005 * i, unique_prompt(SEED, i, 30 + i), i % 2, (0, 1, 5)[i % 3])
             for i in range(30)]
    wl = workload(specs)
    res = simulate(wl, config(policy))
    assert_conserved(res, wl)
    rq = res.requests
    assert (rq.status == "completed").all()
    assert (rq.final_len == rq.prompt_len).all()
    assert set(rq.output_len) == {0, 1}
    assert rq.tpot_s.isna().all()  # no time per output token: left out, not 0
    assert np.isnan(res.summary["tpot_p50_s"]) and np.isnan(res.summary["tpot_p99_s"])
    assert res.summary["generated_tokens"] == int((rq.output_len == 1).sum())


@pytest.mark.parametrize("policy", POLICIES)
def test_burst_of_10000_simultaneous_arrivals(policy):
    """10,000 requests arriving at the same instant into a pool that holds a few hundred:
    the queue drains, everything completes, nothing is admitted past the running cap."""
    wl = workload([(0.0, unique_prompt(SEED, i, 4 + i % 5), 1 + i % 3, 4)
                   for i in range(10_000)])
    res = simulate(wl, config(policy, kv_tokens=4096, max_running_requests=256))
    assert_conserved(res, wl)
    assert res.summary["requests_completed"] == 10_000
    assert res.timeline.running.max() <= 256
    rq = res.requests
    assert (rq.arrival_s == 0.0).all()
    assert rq.finish_s.max() > 0


MIXED = [(0.01 * i, unique_prompt(SEED, i, 20 + 9 * i), 5 + i, 5 + i) for i in range(30)]


@pytest.mark.parametrize("policy", POLICIES)
def test_page_size_equal_to_capacity(policy):
    """One 256-slot page is the whole pool: requests run one at a time and those that fit it
    complete (none wrongly refused when the page's rounding meets a token budget)."""
    wl = workload(MIXED)
    res = simulate(wl, config(policy, kv_tokens=256, page_size=256))
    assert_conserved(res, wl)
    assert_fits_decide(res, wl, policy)
    assert res.summary["capacity_slots"] == 256
    assert res.timeline.running.max() <= 1
    assert res.summary["requests_completed"] >= 24


TINY = [(0.01 * i, unique_prompt(SEED, i, 1 + (7 * i) % 20), i % 9, 8) for i in range(40)]


@pytest.mark.parametrize("page_size,kv_tokens", [(1, 1), (16, 16), (16, 31)],
                         ids=["1-slot", "page16", "page16-partial"])
@pytest.mark.parametrize("policy", POLICIES)
def test_pool_of_one_page(policy, page_size, kv_tokens):
    """A pool of one page (a second, partial page is not usable): what fits completes, the
    rest is rejected with a reason, one request at a time."""
    wl = workload(TINY)
    res = simulate(wl, config(policy, kv_tokens=kv_tokens, page_size=page_size))
    assert_conserved(res, wl)
    assert res.summary["capacity_slots"] == page_size
    assert_fits_decide(res, wl, policy)
    if page_size == 16:
        assert 0 < res.summary["requests_completed"] < len(TINY)
    # nothing falls through to the catch-all: the reason names what does not fit
    rejected = res.requests[res.requests.status == "rejected"]
    assert rejected.reject_reason.str.contains(f"the pool has {page_size}").all()


@pytest.mark.parametrize("admission", ["vllm", "sglang"])
def test_decode_out_of_memory_preempts_by_the_engines_rule(admission: str) -> None:
    """Three requests whose final lengths (3 x 699 slots) overflow a 2,048-slot pool: the
    decode step that runs out of memory preempts exactly one, chosen by the engine's rule
    (simulator/scheduler.py). vLLM v1 preempts the most recently arrived running request;
    SGLang retracts the one with the fewest decoded tokens, which here is the one admitted
    last (its admission waited for the budget). The earlier two run through untouched.
    Costs about 0.3 s."""
    from tests.simulator.helpers import run

    reqs = [Request(i, i * 0.001, unique_prompt(7, i, 400), 300, 300, seed=7)
            for i in range(3)]
    r = run(Workload("overflow", reqs, seed=7), policy="paged-nocache", admission=admission,
            kv_tokens=2048, max_context_len=1024, max_prefill_tokens=4096,
            chunked_prefill_size=0)
    q = r.requests.set_index("request_id").sort_index()
    assert (q.status == "completed").all()
    assert q.preemptions.tolist() == [0, 0, 1]
    if admission == "vllm":  # the victim is the latest arrival, not the latest admission
        assert q.admit_s[1] == q.admit_s[2]


@pytest.mark.parametrize("admission", ["sglang", "vllm"])
def test_one_admission_round_charges_every_request_it_takes(admission: str) -> None:
    """Three simultaneous requests of 400 prompt + 300 new tokens on an idle 2,048-slot pool.
    SGLang's round budget (simulator/admission.py) charges each admitted request its prompt
    plus its remaining new tokens: 700 + 700 fit, a third 700 would need 2,100, so the third
    waits for a later round. vLLM admits on the prompt's blocks alone: all three at once.
    Costs about 0.3 s."""
    from tests.simulator.helpers import run

    reqs = [Request(i, 0.0, unique_prompt(7, i, 400), 300, 300, seed=7) for i in range(3)]
    r = run(Workload("round", reqs, seed=7), policy="paged-nocache", admission=admission,
            kv_tokens=2048, max_context_len=1024, max_prefill_tokens=4096,
            chunked_prefill_size=0)
    admit = r.requests.set_index("request_id").sort_index().admit_s.tolist()
    assert admit[0] == admit[1] == 0.0
    assert (admit[2] > 0.0) if admission == "sglang" else (admit[2] == 0.0)
