"""A plain reference engine, written from the documented rules (docs/engine.md, docs/kvcore.md,
docs/policies.md, docs/latency.md), to compare the real engine with request by request.

Why it exists: the engine's differential fuzz (engine_fuzz.py) compares the engine with
itself (stepped vs fast-forwarded), so a rule both modes break the same way passes. This
module (and its memory, reference_memory.py) shares no code with simulator/ or kvcore/: one
iteration at a time, no fast-forward, no batched arrays, pages and blocks as Python lists, the
prefix caches as dicts keyed by token prefixes. Slow (quadratic in places) and only for small
workloads.

Independence, honestly stated: the rules come from the docs; where the docs were silent or
loose (the undo order, the re-prefill length, the watermark's comparison, the radix clock)
the engine's behaviour was read and the rule written into the docs first, so the two
implementations share those rules as text, not as code.

The subset it covers (anything else is a `ValueError`):

* policies `paged` (radix prefix cache, LRU), `paged-nocache`, `vllm` (hash-chained full
  blocks, the free queue as the LRU), no KV tier;
* the `vllm` admission rule (pages needed now against free + evictable pages, a 1 % watermark
  of whole pages), `fcfs`, `recompute` preemption of the most recent arrival;
* chunked prefill (or none) within the iteration's prefill budget;
* the `constant` latency model: 1e-4 s per prefill token, 0.02 s per iteration that decodes;
* open-loop requests only (no sessions), a max context length no request reaches.

Rules the engine documents and this file follows, by docs section:

* Request lifecycle / Admission: the cached prefix is matched on the prompt less its last
  token, page-aligned, counted at the first admission only; rejection at arrival when the
  final length or ceil((prompt + 1) / page) pages exceed the pool.
* Request lifecycle / Prefill: the prefill budget goes to continuing chunks first, then to
  admissions (first chunk min(chunk, what is left)); unchunked, a prefill larger than what is
  left waits unless it is the iteration's first.
* The engine loop: admissions from the queue head, one batched prefill (all-or-nothing; on
  failure undo the round's admissions latest first, then preempt continuing chunks latest
  first, retrying after each), then one batched decode of the requests running when the
  iteration began (out of memory: preempt the latest arrival, retry), then the clock moves,
  then first tokens / decoded tokens / finishes.
* Preemption: the victim goes to the queue front and later prefills prompt + the tokens it
  had generated but the last; only its first prefill offers its KV to the cache.
* The radix cache (docs/kvcore.md): LRU over whole nodes by a clock that ticks once per
  match, insert and touch; a match or insert ending inside a node splits it.
* vllm (docs/policies.md): blocks 1..N in one free queue, popped at the head (a hashed block
  popped loses its hash), freed tail-first to the tail; full blocks hashed when their ids are
  known; the lookup takes the oldest live holder of each block of prompt[:P - 1].
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.simulator.reference_memory import RadixPages, VLLMBlocks, cdiv
from workloads.request import Workload

PREFILL_TOKEN_S = 1e-4  # docs/latency.md, `constant`
DECODE_STEP_S = 0.02
VLLM_WATERMARK = 0.01  # docs/engine.md, `vllm` admission


# -- the engine -------------------------------------------------------------------------------
@dataclass
class RefRequest:
    """One request's state and, at the end, its results (the columns compared)."""

    rid: int
    arrival_s: float
    ids: tuple  # prompt + output ids
    prompt_len: int
    output_len: int
    status: str = "waiting"
    written: int = 0
    decoded: int = 0
    computed: int = 0
    target: int = 0
    admit_s: float = float("nan")
    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    cached_tokens: int = -1
    preemptions: int = 0
    recomputed_tokens: int = 0

    @property
    def final_len(self) -> int:
        return self.prompt_len + self.output_len - 1


@dataclass(frozen=True)
class RefConfig:
    """The subset of the engine's options the reference understands."""

    policy: str  # paged, paged-nocache, vllm
    page_size: int
    kv_tokens: int
    max_running_requests: int
    chunked_prefill_size: int = 0  # 0: no chunking
    max_prefill_tokens: int = 1 << 20


def preempt_victim(decoding: list[RefRequest]) -> RefRequest:
    """vLLM's rule (docs/engine.md, `vllm` admission): the most recent arrival."""
    return max(decoding, key=lambda r: (r.arrival_s, r.rid))


def simulate_reference(workload: Workload, cfg: RefConfig) -> dict[int, RefRequest]:
    """Run `workload` one iteration at a time; the requests by id, completed or rejected."""
    if cfg.policy not in ("paged", "paged-nocache", "vllm"):
        raise ValueError(f"reference engine: policy {cfg.policy!r} is not covered")
    if workload.sessions:
        raise ValueError("reference engine: sessions are not covered")
    ps = cfg.page_size
    pages = cfg.kv_tokens // ps
    mem: RadixPages | VLLMBlocks = (VLLMBlocks(pages, ps) if cfg.policy == "vllm"
                                    else RadixPages(pages, ps, cfg.policy == "paged"))
    watermark = int(VLLM_WATERMARK * pages)
    reqs = {r.request_id: RefRequest(r.request_id, r.arrival_s,
                                     tuple(int(x) for x in r.sequence_ids(r.prompt_len
                                                                          + r.output_len)),
                                     r.prompt_len, r.output_len)
            for r in workload.requests}
    pending = sorted(reqs.values(), key=lambda r: (r.arrival_s, r.rid))
    waiting: list[RefRequest] = []
    prefilling: list[RefRequest] = []
    running: list[RefRequest] = []
    chunk = cfg.chunked_prefill_size
    now = 0.0

    def done(r: RefRequest) -> None:
        mem.finish(r.rid, r.ids, r.written)
        r.status, r.finish_s = "completed", now

    def unadmit(r: RefRequest, first_time: set[int]) -> None:
        """Take back an admission of this round: the queue front again, and a first
        admission's statistics wait for the real one."""
        prefilling.remove(r)
        mem.release(r.rid)
        r.written = 0
        waiting.insert(0, r)
        if r.rid in first_time:
            r.cached_tokens, r.admit_s = -1, float("nan")

    def preempt(r: RefRequest) -> None:
        mem.release(r.rid)
        r.preemptions += 1
        r.computed = max(r.computed, r.written)
        r.written = 0
        r.target = r.prompt_len + r.decoded - 1 if r.decoded else r.prompt_len
        r.status = "waiting"
        waiting.insert(0, r)

    while True:
        while pending and pending[0].arrival_s <= now:
            r = pending.pop(0)
            if max(r.final_len, cdiv(r.prompt_len + 1, ps) * ps) > pages * ps:
                r.status = "rejected"
                continue
            r.target = r.prompt_len
            waiting.append(r)
        if not (waiting or prefilling or running):
            if not pending:
                break
            now = max(now, pending[0].arrival_s)
            continue
        # 1. the prefill plan: continuing chunks first (in admission order), then admissions
        # (fcfs, vllm's page rule), within the iteration's prefill budget
        budget = cfg.max_prefill_tokens
        plan: list[tuple[RefRequest, int]] = []
        for r in prefilling:
            if budget <= 0:
                break
            end = min(r.target, r.written + min(budget, chunk or budget))
            plan.append((r, end))
            budget -= end - r.written
        fresh: list[RefRequest] = []
        first_time: set[int] = set()
        charged = 0
        while waiting and budget > 0 and \
                len(running) + len(prefilling) < cfg.max_running_requests:
            r = waiting[0]
            key = r.ids[: r.target - 1]
            hit, evictable = mem.peek(key)
            need = cdiv(r.target + 1, ps) - hit // ps
            if (mem.available() - evictable) // ps - charged // ps - need < watermark:
                break
            cached = mem.admit(r.rid, r.ids[: r.target])
            waiting.pop(0)
            charged += cdiv(r.target + 1, ps) * ps - cached
            if r.cached_tokens < 0:
                r.cached_tokens, r.admit_s = cached, now
                first_time.add(r.rid)
            r.written = cached
            fresh.append(r)
            prefilling.append(r)
            end = min(r.target, r.written + min(budget, chunk or budget))
            if not chunk and end < r.target:
                if plan:  # unchunked, it waits for a round with room for all of it
                    unadmit(fresh.pop(), first_time)
                    break
                end = r.target  # the iteration's first prefill runs whole
            plan.append((r, end))
            budget -= end - r.written
        # 2. one batched prefill; short of memory: undo admissions latest first, then preempt
        # continuing chunks latest first, retrying after each
        if plan and not mem.extend([(r.rid, r.written, e) for r, e in plan]):
            while plan:
                if fresh:
                    r = fresh.pop()
                    plan = [(q, e) for q, e in plan if q is not r]
                    unadmit(r, first_time)
                else:
                    r = plan.pop()[0]
                    prefilling.remove(r)
                    preempt(r)
                if plan and mem.extend([(r.rid, r.written, e) for r, e in plan]):
                    break
        new_tokens = 0
        for r, e in plan:
            new_tokens += e - r.written
            if r.computed > r.written:
                r.recomputed_tokens += min(e, r.computed) - r.written
            r.written = e
        # 3. one batched decode; out of memory: preempt the latest arrival, retry
        decoding = list(running)
        while decoding and not mem.decode([(r.rid, r.written) for r in decoding]):
            victim = preempt_victim(decoding)
            decoding.remove(victim)
            running.remove(victim)
            preempt(victim)
        for r in decoding:
            r.written += 1
        if not plan and not decoding:
            if waiting and not running and not prefilling:
                waiting.pop(0).status = "rejected"
            continue
        # 4. the clock
        dt = 0.0 + PREFILL_TOKEN_S * new_tokens
        if decoding:
            dt += DECODE_STEP_S
        now += dt
        # 5. first tokens, decoded tokens, finishes
        for r, _ in plan:
            if r.written < r.target:
                continue  # more chunks to go
            prefilling.remove(r)
            if r.decoded == 0:
                r.decoded, r.first_token_s = 1, now
                mem.cache_prefix(r.rid, r.ids[: r.written], r.written)
            if r.decoded >= r.output_len:
                done(r)
            else:
                r.status = "running"
                running.append(r)
        for r in decoding:
            r.decoded += 1
            if r.decoded >= r.output_len:
                running.remove(r)
                done(r)
    return reqs
