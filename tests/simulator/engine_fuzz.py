"""Differential fuzzing of the engine: small random workloads, each simulated twice (with the
multi-step fast-forward and one step per iteration), invariants checked every iteration,
each run bounded so that a livelock fails instead of hanging.

Why differential: the fast-forward (decode stretches) claims to equal stepping bit for bit,
so any difference in the summary or the request frame is a bug in one of the two, found
without an oracle. The small pools (300-900 slots) and short contexts make admission,
preemption, eviction and chunked prefill collide within a handful of requests: the cases
that hang or corrupt a request in practice.

Used by tests/simulator/test_engine_fuzz.py (a fast slice in the suite) and by
benchmarks/fuzz_engine.py (the full sweep, thousands of cases). Case `i` takes its
(policy, admission, schedule, preempt) combination from `COMBOS[i % len(COMBOS)]`, so any
run of len(COMBOS) consecutive seeds covers every combination once.

Hybrid cases (seeds from HYBRID_SEED0 on): the same draws on a small hybrid model
(HYBRID_MODELS: sliding-window layers whose window slides within these contexts, or Mamba-2
layers with a tiny state, beside full attention) under the policies with a hybrid form,
cycling through HYBRID_COMBOS; no host tier (hybrid pools have none). A hybrid policy that
takes no decode stretch is still compared stepped against fast-forwarded: the engine's own
paths around it (admission, chunking, preemption) must agree, invariants every iteration.
"""

from __future__ import annotations

import dataclasses
import itertools
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from kvcore.contract.tiers import WRITE_POLICIES
from kvcore.model.hybrid_presets import CONFIG_LAYOUTS
from kvcore.model.layers import FULL, MAMBA, SLIDING, HybridLayout, LayerGroup
from kvcore.model.presets import MODELS, ModelPreset
from simulator.config import SimConfig
from simulator.guard import LivelockError
from simulator.run import SimResult, simulate
from simulator.specs import (
    ADMISSION_MODES,
    LOAD_MODES,
    PREEMPT_MODES,
    PREFETCH_POLICIES,
    SCHEDULES,
)
from workloads.generators import chat_sessions
from workloads.lengths import UniformLengths
from workloads.request import (
    SHARED_TAG,
    PromptSpec,
    Request,
    Workload,
    namespace_of,
    unique_prompt,
)

POLICIES = ("paged", "paged-nocache", "vllm", "contiguous-max", "contiguous-pow2",
            "contiguous-oracle")
COMBOS = tuple(itertools.product(POLICIES, ADMISSION_MODES, SCHEDULES, PREEMPT_MODES))
#: policies with lower KV tiers: about a third of their cases get a host (and storage) tier
TIERED = ("paged", "vllm")
PAGE_SIZES = (1, 4, 16)
#: the small hybrid models of the hybrid cases: 4 layers of 1 KV head x 8 (32 B per token and
#: layer in bf16); a window of 48 tokens, or Mamba-2 states of 96 B per layer (vLLM's block
#: rule then gives 16-token blocks)
HYBRID_MODELS: dict[str, HybridLayout] = {
    "fuzz-swa": HybridLayout((LayerGroup(SLIDING, 2, kv_heads=1, head_dim=8, window=48),
                              LayerGroup(FULL, 2, kv_heads=1, head_dim=8))),
    # a Mamba-2 model declares its SSD chunk (config chunk_size); vLLM runs such a model in
    # mamba cache mode "all" with blocks a multiple of it, so 16 keeps 16-token blocks
    "fuzz-mamba": HybridLayout((LayerGroup(MAMBA, 3, num_v_heads=2, v_head_dim=4,
                                           k_head_dim=4, n_groups=1, conv_kernel=2,
                                           mamba_chunk_size=16),
                                LayerGroup(FULL, 1, kv_heads=1, head_dim=8))),
}
HYBRID_POLICIES = ("paged", "paged-nocache", "vllm")
HYBRID_COMBOS = tuple(itertools.product(HYBRID_POLICIES, HYBRID_MODELS, ADMISSION_MODES,
                                        SCHEDULES, PREEMPT_MODES))
HYBRID_SEED0 = 1_000_000


def register_hybrid_models() -> None:
    """Register the fuzz's hybrid models as presets with their layouts (idempotent)."""
    for name, layout in HYBRID_MODELS.items():
        MODELS.setdefault(name, ModelPreset(
            name, name, num_layers=layout.num_layers, num_heads=2, num_kv_heads=1,
            head_dim=8, hidden_size=16, intermediate_size=32, vocab_size=1000,
            max_position=4096, num_params=1e6, source="tests/simulator/engine_fuzz.py"))
        CONFIG_LAYOUTS.setdefault(name, layout)


# preemptions in a row without progress before the engine calls it a livelock (small
# workloads: a real run needs a handful)
STALL_LIMIT = 500


@dataclass(frozen=True)
class FuzzOutcome:
    seed: int
    kind: str  # "ok", "hang", "livelock", "invariant", "differ", "error"
    detail: str = ""
    requests: int = 0
    #: decode stretches (k >= 2 steps at once) the fast-forwarded run took: with none, the
    #: case compared one code path with itself
    stretches: int = 0
    #: prefill stretches (a reserving policy's chunked-prefill iterations taken at once,
    #: simulator/prefill_stretch.py) the fast-forwarded run took
    prefill_stretches: int = 0

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


class _Timeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise _Timeout after `seconds` of this process's CPU time (main thread, POSIX): the
    bound that turns a hang the engine's own guard misses into a failure. CPU time, not wall
    time: a livelock burns CPU, while a shared, loaded machine only stretches wall time, so
    the bound neither flakes under load nor lets a spinning engine through."""
    def on_alarm(signum, frame):
        raise _Timeout

    old = signal.signal(signal.SIGPROF, on_alarm)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def make_case(seed: int) -> tuple[Workload, SimConfig]:
    """The workload and engine of case `seed`: 2-14 requests (some in closed-loop chat
    sessions) with shared prefixes, duplicates and bursts; a 300-900 slot pool; for the
    policies with lower tiers, sometimes a host tier (and storage behind it). Seeds from
    HYBRID_SEED0 on: a hybrid model (see the module notes)."""
    if seed >= HYBRID_SEED0:
        register_hybrid_models()
        policy, model, admission, schedule, preempt = HYBRID_COMBOS[
            (seed - HYBRID_SEED0) % len(HYBRID_COMBOS)]
        w, cfg = _case(seed, policy, admission, schedule, preempt, tiers=False)
        # SGLang's Mamba radix cache runs page size 1 (v0.5); vLLM raises its own block size
        ps = 1 if policy != "vllm" and model == "fuzz-mamba" else cfg.policy.page_size
        return w, cfg.replace(model=model, page_size=ps, placement="first-fit")
    return _case(seed, *COMBOS[seed % len(COMBOS)], tiers=True)


def _case(seed: int, policy: str, admission: str, schedule: str, preempt: str,
          tiers: bool) -> tuple[Workload, SimConfig]:
    rng = np.random.default_rng([seed, 0xF022])
    ps = int(rng.choice(PAGE_SIZES))
    kv_tokens = int(rng.integers(300, 901))
    max_ctx = int(rng.choice((128, 256, 512, 1024)))
    n = int(rng.integers(2, 15))  # requests in all: warm-up + open-loop + session turns
    sessions = int(rng.integers(1, 3)) if rng.random() < 0.25 and n >= 6 else 0
    docs = [int(rng.integers(8, 300)) for _ in range(int(rng.integers(0, 4)))]
    reqs: list[Request] = []
    if docs and n - 2 * sessions > len(docs) and rng.random() < 0.4:
        # warm the cache first: each document once, one output token
        for d, length in enumerate(docs):
            segs = (("unique", namespace_of(seed, d, SHARED_TAG), length, 0),)
            own = unique_prompt(seed, len(reqs), int(rng.integers(1, 10)))
            reqs.append(Request(len(reqs), 0.0, PromptSpec(segs + own.segments), 1, 1,
                                seed=seed))
    n_open = n - 2 * sessions - len(reqs)
    span = float(rng.choice((0.0, 0.1, 0.6, 3.0)))
    start = 0.05 if reqs else 0.0
    arrivals = start + (np.sort(rng.uniform(0.0, span, n_open)) if span else np.zeros(n_open))
    if n_open > 2 and rng.random() < 0.3:  # a burst: several requests at one instant
        arrivals[1:3] = arrivals[1]
    for t in arrivals.tolist():
        rid = len(reqs)
        segs: tuple = ()
        if docs and rng.random() < 0.6:
            d = int(rng.integers(len(docs)))
            segs = (("unique", namespace_of(seed, d, SHARED_TAG), docs[d], 0),)
        if reqs and rng.random() < 0.1:
            prompt = reqs[int(rng.integers(len(reqs)))].prompt  # the same prompt again
        else:
            own = unique_prompt(seed, rid, int(rng.integers(1, 200)))
            prompt = PromptSpec(segs + own.segments)
        out = int(rng.integers(1, 300))
        mnt = out + int(rng.integers(0, 50)) if rng.random() < 0.8 else max(1, out // 2)
        reqs.append(Request(rid, float(t), prompt, out, mnt, seed=seed))
    w = Workload("fuzz", reqs, seed=seed)
    if sessions:
        chat = chat_sessions(np.sort(rng.uniform(0.0, max(span, 0.1), sessions)), 2,
                             UniformLengths(4, 80), UniformLengths(1, 120),
                             think_time_s=float(rng.choice((0.0, 0.05))),
                             system_len=int(rng.choice((0, 32))), seed=seed)
        shift = len(reqs)  # session request ids follow the open-loop ones
        moved = [dataclasses.replace(s, request_ids=[i + shift for i in s.request_ids])
                 for s in chat.sessions]
        w = Workload("fuzz", reqs, sessions=moved, seed=seed)
    chunk = int(rng.choice((0, 8, 32, 256)))
    tier: dict[str, object] = {}
    if tiers and policy in TIERED and rng.random() < 0.35:  # a host tier, maybe storage
        tier = {"hicache_ratio": float(rng.choice((0.5, 1.0, 4.0))),
                "hicache_write_policy": str(rng.choice(WRITE_POLICIES)),
                "hicache_load": str(rng.choice(LOAD_MODES))}
        if rng.random() < 0.4:  # GiB of Llama-3.1-8B's KV: about 40 and 400 slots
            tier.update(storage_size=float(rng.choice((0.005, 0.05))),
                        hicache_prefetch_policy=str(rng.choice(PREFETCH_POLICIES)))
    cfg = SimConfig.of(
        policy=policy, admission=admission, schedule=schedule, preempt=preempt,
        page_size=ps, kv_tokens=kv_tokens, max_context_len=max_ctx, latency="constant",
        placement=str(rng.choice(("first-fit", "best-fit", "buddy"))),
        eviction=str(rng.choice(("lru", "lfu", "fifo"))),
        max_running_requests=int(rng.choice((1, 2, 4, 16, 256))),
        max_prefill_tokens=int(rng.choice((16, 64, 512, 4096))),
        chunked_prefill_size=chunk, check_invariants=True, check_every=1,
        max_stalled_preemptions=STALL_LIMIT, **tier,
    )
    return w, cfg


def _differences(a: SimResult, b: SimResult) -> str:
    skip = {"sim_wall_s", "max_steps_per_stretch"}
    diff = [k for k in a.summary if k not in skip and not _same(a.summary[k], b.summary[k])]
    ra, rb = a.requests.reset_index(drop=True), b.requests.reset_index(drop=True)
    if not ra.equals(rb):
        cols = [c for c in ra.columns if not ra[c].equals(rb[c])] if ra.shape == rb.shape \
            else ["shape"]
        diff.append(f"requests[{','.join(cols)}]")
    return ", ".join(diff)


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float) and np.isnan(x) and np.isnan(y):
        return True
    return x == y


def run_case(seed: int, time_limit_s: float = 30.0) -> FuzzOutcome:
    """Simulate case `seed` stepped and fast-forwarded; classify what happened."""
    from kvcore.contract.validation import InvariantError

    w, cfg = make_case(seed)
    stepped_cfg = cfg.replace(max_steps_per_stretch=1)
    results = []
    stretches = [0, 0]  # decode stretches, prefill stretches (those hand their chunks)

    def count(t0: float, t1: float, chunks: object, rids: object, steps: int) -> None:
        stretches[bool(chunks)] += steps >= 2

    try:
        for c, sink in ((cfg, count), (stepped_cfg, None)):
            with time_limit(time_limit_s):
                results.append(simulate(w, c, event_sink=sink))
    except _Timeout:
        return FuzzOutcome(seed, "hang", f"no result within {time_limit_s:g} s of CPU time",
                           w.num_requests)
    except LivelockError as e:
        return FuzzOutcome(seed, "livelock", str(e), w.num_requests)
    except InvariantError as e:
        return FuzzOutcome(seed, "invariant", str(e), w.num_requests)
    except Exception as e:  # any other crash is a finding too
        return FuzzOutcome(seed, "error", f"{type(e).__name__}: {e}", w.num_requests)
    diff = _differences(*results)
    if diff:
        return FuzzOutcome(seed, "differ", diff, w.num_requests, *stretches)
    missing = _unaccounted(w, results[0])
    if missing:
        return FuzzOutcome(seed, "error", missing, w.num_requests, *stretches)
    return FuzzOutcome(seed, "ok", "", w.num_requests, *stretches)


def _unaccounted(w: Workload, res: SimResult) -> str:
    """Every open-loop request once, completed or rejected; each session's turns once, in
    order, up to its first rejected turn (a rejected turn ends the conversation)."""
    rq = res.requests
    if not rq.status.isin(["completed", "rejected"]).all():
        return "a request is unfinished"
    if rq.request_id.duplicated().any():
        return "a request is reported twice"
    seen = set(rq.request_id.tolist())
    if not {r.request_id for r in w.requests} <= seen:
        return "an open-loop request is missing"
    status = dict(zip(rq.request_id.tolist(), rq.status.tolist(), strict=True))
    for s in w.sessions:
        for k, rid in enumerate(s.request_ids):
            if rid not in status:
                prev = s.request_ids[k - 1] if k else None
                if prev is None or status.get(prev) != "rejected":
                    return f"session {s.session_id} turn {k} is missing"
                break
    return ""


def describe(seed: int) -> str:
    """A one-line description of case `seed` for failure messages."""
    w, config = make_case(seed)
    cfg = config.to_dict()
    return (f"seed {seed}: {cfg['policy']} model={cfg['model']} admission={cfg['admission']} "
            f"schedule={cfg['schedule']} preempt={cfg['preempt']} page={cfg['page_size']} "
            f"kv_tokens={cfg['kv_tokens']} max_ctx={cfg['max_context_len']} "
            f"rows={cfg['max_running_requests']} "
            f"prefill={cfg['max_prefill_tokens']}/{cfg['chunked_prefill_size']} "
            f"requests={w.num_requests}")
