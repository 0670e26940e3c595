"""Checks against closed forms: prefix-cache hit rates (k-shot and chat, the SGLang paper's
setting) and fragmentation and concurrency of identical requests. No paper number here: the
simulated value against a formula of the same quantity. They can fail (a wrong buddy
placement, page rounding or admission would show), so they test the simulator, but they are
no evidence about the paper and are counted apart.
"""

from __future__ import annotations

from collections.abc import Callable

from experiments.validation.rows import (
    CROSS_CHECK,
    EXACT,
    MAX_CONTEXT_LEN,
    ORCA,
    SLOTS,
    held_pct,
    make_row,
    run_summary,
    sharegpt_workload,
)
from workloads.registry import build_workload
from workloads.request import Workload
from workloads.reuse import ideal_reuse
from workloads.spec import WorkloadSpec


# -- prefix caching --------------------------------------------------------------------------
def _hit_rows(label: str, w: Workload, analytic: dict[int, float], cfg: dict,
              log: Callable[[str], None]) -> list[dict]:
    rows = []
    for ps in (1, 16, 64):
        s = run_summary(w, **cfg, page_size=ps)
        log(f"prefix: {label} page {ps}")
        v = s.prefix_hit_rate * 100
        a = analytic[ps] * 100
        note = "unbounded cache" if ps == 1 else (
            f"loss vs page 1: {analytic[1] * 100 - v:.2f} pts (page-aligned analytic "
            f"{a:.2f} %)")
        # the same count two ways (the engine's radix cache, the formula): equal up to float
        # rounding, so one page rounded the wrong way (0.05 pts at page 1) fails
        rows.append(make_row("Prefix caching", f"{label} hit rate, page {ps} (%)", a, v,
                             f"+/- {EXACT:g} pts", abs(v - a) <= EXACT, summary=s, note=note,
                             kind=CROSS_CHECK))
    return rows


def prefix_rows(quick: bool, notes: dict, log: Callable[[str], None]) -> list[dict]:
    n = 60 if quick else 400
    S, Q = 1000, 100
    kshot = build_workload(WorkloadSpec(name="kshot", prefix_len=S, question_len=Q,
                                        output_len=1, lengths="fixed", rate=1.0,
                                        num_requests=n, max_context_len=8192))
    kshot_a = {ps: (n - 1) * (S - S % ps) / (n * (S + Q)) for ps in (1, 16, 64)}
    sessions = 15 if quick else 100
    chat = build_workload(WorkloadSpec(name="chat", rate=0.5, num_requests=sessions * 4,
                                       output_len=384, spread=1 / 3, lengths="uniform",
                                       max_context_len=8192))
    chat_a = {ps: _chat_analytic(chat, ps) for ps in (1, 16, 64)}
    big = dict(model="llama-3.1-8b", gpu="h100", kv_dtype="bf16", max_context_len=8192,
               policy="paged", admission="sglang")
    rows = []
    for label, w, a in (("k-shot", kshot, kshot_a), ("chat", chat, chat_a)):
        total = _total_tokens(w)
        cfg = {**big, "kv_tokens": total + 8192}
        rows += _hit_rows(label, w, a, cfg, log)
        rows[-3]["note"] += f"; ideal_reuse() gives {ideal_reuse(w, 1) * 100:.2f} %"
    notes["Prefix caching"] = (
        f"k-shot: {n} requests, shared prefix S = {S}, question Q = {Q}, 1 output token, "
        f"1 req/s; analytic hit rate (n-1) S / (n (S+Q)), with S rounded down to the page at "
        f"page 16 / 64. chat: {sessions} closed-loop sessions of 4 turns, 256-512 new input "
        "tokens and 256-512 output tokens per turn; turn k+1 hits turn k's prompt + output - 1 "
        "(the last sampled token is never written), rounded down to the page. Llama-3.1-8B "
        "on one H100, `paged` with the radix cache, pool larger than the whole workload "
        "(nothing is evicted). The SGLang paper's 50-99 % hit-rate band is context only.")
    return rows


def _total_tokens(w: Workload) -> int:
    if w.sessions:
        return sum(t.new_input.length + t.output_len for s in w.sessions for t in s.turns)
    return sum(r.final_len for r in w.requests)


def _chat_analytic(w: Workload, ps: int) -> float:
    hits = prompts = 0
    for s in w.sessions:
        ctx = 0  # previous turn's prompt + output
        for k, t in enumerate(s.turns):
            prompt = ctx + t.new_input.length
            if k:
                h = min(ctx - 1, prompt - 1)
                hits += h - h % ps
            prompts += prompt
            ctx = prompt + t.output_len
    return hits / prompts


# -- closed-form cross-checks ------------------------------------------------------------------
# No paper number here: the simulated value against a closed form of the same quantity. They
# can fail (a wrong buddy placement, page rounding or admission would show), so they test the
# simulator, but they are no evidence about the paper and are counted apart.
def _fixed(n: int, prompt: int, output: int, rate: float) -> Workload:
    return build_workload(WorkloadSpec(name="sharegpt", lengths="fixed", input_len=prompt,
                                       output_len=output, rate=rate, num_requests=n,
                                       max_context_len=MAX_CONTEXT_LEN))


def analytic_rows(quick: bool, log: Callable[[str], None]) -> list[dict]:
    rows = []
    # contiguous-oracle + buddy: L = 100 + 201 - 1 = 300 slots in a 512-slot block
    w = _fixed(60 if quick else 300, 100, 201, 50.0)
    s = run_summary(w, **ORCA["Orca (Oracle)"])
    v = s.internal_rounding_pct / held_pct(s) * 100
    # every request holds the same 512-slot block at every instant: the ratio is exact
    rows.append(make_row("Fragmentation", "identical requests, oracle+buddy: slack / held (%)",
                         212 / 512 * 100, v, f"+/- {EXACT:g} pts",
                         abs(v - 212 / 512 * 100) <= EXACT,
                         summary=s, kind=CROSS_CHECK, note="L = 300 in a 512-slot buddy block: "
                         "212/512 of held memory is slack"))
    # paged, page 16, prompt-only requests: 100 tokens in 7 pages
    w = _fixed(60 if quick else 300, 100, 1, 20.0)
    s = run_summary(w, policy="paged-nocache", page_size=16, admission="sglang")
    v = s.internal_rounding_pct / held_pct(s) * 100
    rows.append(make_row("Fragmentation", "identical requests, paged 16: rounding / held (%)",
                         12 / 112 * 100, v, f"+/- {EXACT:g} pts",
                         abs(v - 12 / 112 * 100) <= EXACT,
                         summary=s, kind=CROSS_CHECK,
                         note="L = 100 in 7 pages of 16: 12/112 of held memory"))
    log("analytic: fragmentation")
    for slots in (SLOTS, 10_000):
        w = sharegpt_workload(2.0, 300 if quick else 1000)
        s = run_summary(w, **ORCA["Orca (Max)"], kv_tokens=slots)
        exp = slots // MAX_CONTEXT_LEN
        rows.append(make_row("Concurrency", f"contiguous-max concurrency, {slots:,} slots",
                             exp, s.peak_batch_size, "exact",
                             s.peak_batch_size == exp, rate=2.0, summary=s, kind=CROSS_CHECK,
                             note=f"floor({slots} / {MAX_CONTEXT_LEN}); peak batch of a saturated "
                             "run"))
    log("analytic: concurrency")
    return rows

