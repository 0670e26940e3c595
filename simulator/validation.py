"""Validation: kvsim's numbers next to published ones (vLLM paper, SGLang paper, analytics).

`run_validation()` runs every check and returns one DataFrame row per check;
`write_validation_report(df, path)` renders it (plus the method notes the run produced) as
Markdown. Nothing in the report is typed by hand: every kvsim number comes from a run here.

Published targets (vLLM paper, arXiv 2309.06180): Fig. 2 memory shares, Fig. 13 batch sizes,
Fig. 15 sharing savings, Fig. 18b best block sizes, Table 1 slot counts. The paper does not
publish the request rate behind Fig. 2, its length standard deviations, or its per-iteration
latency, so those are searched or derived and the choice is recorded in the notes.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from kvcore.planner import plan
from simulator.config import SimConfig
from simulator.run import simulate
from workloads.generators import OutputLimits, tree_of_thought
from workloads.lengths import LogNormalLengths, sharegpt_lengths
from workloads.registry import build_workload
from workloads.request import Workload
from workloads.reuse import ideal_reuse
from workloads.spec import WorkloadSpec

COLUMNS = ("section", "name", "published", "kvsim", "difference", "tolerance", "pass", "rate",
           "queue_backlog", "preemptions", "note")

SLOTS = 15_728  # OPT-13B on one A100-40GB (Table 1)
MAX_LEN = 2_048
BASE = dict(model="opt-13b", gpu="a100-40gb", kv_dtype="fp16", kv_tokens=SLOTS,
            max_context_len=MAX_LEN)
ORCA = {
    "Orca (Max)": dict(policy="contiguous-max", placement="buddy", admission="reserve"),
    "Orca (Pow2)": dict(policy="contiguous-pow2", placement="buddy", admission="reserve"),
    "Orca (Oracle)": dict(policy="contiguous-oracle", placement="buddy", admission="reserve"),
}
VLLM = dict(policy="paged-nocache", page_size=16, admission="vllm")
SYSTEMS = {**ORCA, "vLLM": VLLM}

# Fig. 2 (token states, reservation, internal frag., external frag. & others), percent
FIG2 = {
    "Orca (Max)": (20.4, 13.3, 57.3, 8.9),
    "Orca (Pow2)": (26.8, 17.9, 13.6, 41.6),
    "Orca (Oracle)": (38.2, 25.2, None, 36.6),
    "vLLM": (96.3, None, None, 3.7),
}
FIG13 = {"Orca (Max)": 7.00, "Orca (Pow2)": 9.81, "Orca (Oracle)": 13.62, "vLLM": 30.42}
FIG13_TOL = {"Orca (Pow2)": 0.10, "Orca (Oracle)": 0.20, "vLLM": 0.25}
FIG15_PARALLEL = {2: 6.09, 4: 8.53, 6: 9.79}  # Alpaca, percent of blocks saved
FIG15_PARALLEL_SHAREGPT = (16.2, 30.5)
FIG15_BEAM = {2: 37.56, 4: 53.13, 6: 55.16}
TABLE1 = [  # model, gpu, tp, KV GiB, published slots (thousands)
    ("opt-13b", "a100-40gb", 1, 12, 15.7),
    ("opt-66b", "a100-40gb", 4, 21, 9.7),
    ("opt-175b", "a100-80gb", 8, 264, 60.1),
]
FIG2_RATES = (1.5, 2.0, 2.5, 3.0)  # req/s searched for Fig. 2 (the paper does not say)
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _row(section: str, name: str, published, kvsim, tolerance: str, ok: bool,
         difference: float | None = None, rate: float | None = None, summary: dict | None = None,
         note: str = "") -> dict:
    if difference is None and isinstance(published, (int, float)) and isinstance(
            kvsim, (int, float)) and published is not None:
        difference = float(kvsim) - float(published)
    return {
        "section": section, "name": name, "published": published, "kvsim": kvsim,
        "difference": difference, "tolerance": tolerance, "pass": bool(ok), "rate": rate,
        "queue_backlog": None if summary is None else int(summary["queue_backlog"]),
        "preemptions": None if summary is None else int(summary["preemptions"]),
        "note": note,
    }


def _sharegpt(rate: float, n: int, seed: int = 0) -> Workload:
    return build_workload(WorkloadSpec(name="sharegpt", rate=rate, num_requests=n,
                                       max_context_len=MAX_LEN, seed=seed))


def _run(workload: Workload, **cfg) -> dict:
    return simulate(workload, SimConfig(**{**BASE, **cfg})).summary


def _saturated(s: dict, n: int) -> bool:
    """A run is saturated when requests are still queued when arrivals stop."""
    return s["queue_backlog"] >= max(1, n // 100)


def _shares(s: dict) -> tuple[float, float, float, float]:
    """kvsim's parts in the paper's four categories (see the module notes)."""
    over = s["internal_overreserve_pct"]
    others = (s["external_frag_pct"] + s["internal_rounding_pct"] + s["free_pct"]
              + s["cached_pct"])
    return s["token_states_pct"], s["reserved_pct"], over, others


# -- Fig. 2 ----------------------------------------------------------------------------------
def _fig2(quick: bool, notes: dict, log: Callable[[str], None]) -> list[dict]:
    minutes = 5 if quick else 30
    warm = 30.0 if quick else 60.0
    rates = (2.5,) if quick else FIG2_RATES
    search = []
    chosen = None
    chosen_runs: dict[str, dict] = {}
    for rate in rates:
        n = int(rate * 60 * minutes)
        w = _sharegpt(rate, n)
        s = _run(w, **VLLM, warmup_s=warm)
        search.append((rate, s))
        log(f"fig2 search: vLLM at {rate} req/s: backlog {s['queue_backlog']}")
        if _saturated(s, n):
            chosen = rate
            chosen_runs["vLLM"] = s
            for name, cfg in ORCA.items():
                chosen_runs[name] = _run(w, **cfg, warmup_s=warm)
                log(f"fig2: {name} at {rate} req/s")
            break
    lines = [f"vLLM at {r:g} req/s: token states {s['token_states_pct']:.1f} %, free "
             f"{s['free_pct']:.1f} %, backlog {s['queue_backlog']}, preemptions "
             f"{s['preemptions']}" for r, s in search]
    if chosen is None:
        notes["Fig. 2 rate"] = ("no searched rate saturated the vLLM run: " + "; ".join(lines))
        return [_row("Fig. 2", "rate search", "saturated", "none", "backlog > 0", False,
                     note="no searched rate saturated the paged run")]
    notes["Fig. 2 rate"] = (
        f"The paper does not state the rate behind Fig. 2. Searched {', '.join(map(str, rates))}"
        f" req/s ({minutes}-minute Poisson traces, first {warm:g} s excluded) and chose the "
        f"lowest at which the paged (vLLM) run is saturated (at least 1 % of the requests "
        f"still queued when arrivals stop): {chosen:g} req/s. The Orca runs are saturated "
        f"there too (see their backlogs). At saturation the paged run preempts often "
        f"(recompute, latest arrival first), which the preemptions column shows. Search: "
        + "; ".join(lines) + ".")
    rows = []
    cats = ("token states", "reservation", "internal frag.", "external frag. & others")
    for name, pub in FIG2.items():
        s = chosen_runs[name]
        ours = _shares(s)
        sat = _saturated(s, int(chosen * 60 * minutes))
        for k, (cat, p) in enumerate(zip(cats, pub, strict=True)):
            v = ours[k]
            if name == "vLLM":
                if k == 0:
                    ok = v >= 93.0 and sat
                    rows.append(_row("Fig. 2", f"{name} {cat}", p, v, ">= 93 % while saturated",
                                     ok, rate=chosen, summary=s,
                                     note="" if sat else "paged run not saturated"))
                elif k == 3:
                    v = 100.0 - ours[0]
                    rows.append(_row("Fig. 2", f"{name} everything else", p, v, "+/- 7 pts",
                                     abs(v - p) <= 7.0, rate=chosen, summary=s,
                                     note="the paper shows only the remainder for vLLM; "
                                     f"kvsim: reserved {ours[1]:.1f}, rounding "
                                     f"{s['internal_rounding_pct']:.2f}, free "
                                     f"{s['free_pct']:.1f} %"))
                continue
            if p is None:  # Oracle internal: not shown in the paper (no over-reservation)
                rows.append(_row("Fig. 2", f"{name} {cat}", 0.0, v, "+/- 7 pts",
                                 abs(v) <= 7.0, rate=chosen, summary=s,
                                 note="not shown in the paper: the oracle never over-reserves"))
                continue
            if name == "Orca (Max)" and k == 3:
                tol, ok = "+/- 0.5 pts", abs(v - p) <= 0.5
            elif k == 0:
                tol, ok = "+/- 5 pts", abs(v - p) <= 5.0
            else:
                tol, ok = "+/- 7 pts", abs(v - p) <= 7.0
            note = ""
            if not ok:
                note = ("kvsim lengths are the bundled ShareGPT file rescaled to the paper's "
                        "means; the paper's length shape (and so the buddy slack) is not "
                        "published")
            rows.append(_row("Fig. 2", f"{name} {cat}", p, v, tol, ok, rate=chosen, summary=s,
                             note=note))
    return rows


# -- Fig. 13 ---------------------------------------------------------------------------------
def _fig13(quick: bool, notes: dict, log: Callable[[str], None]) -> list[dict]:
    rate = 2.0
    n = 1200 if quick else 7200  # the paper's traces are 1 hour long
    warm = 30.0 if quick else 60.0
    w = _sharegpt(rate, n)
    runs = {}
    for name, cfg in SYSTEMS.items():
        runs[name] = _run(w, **cfg, warmup_s=warm)
        log(f"fig13: {name}")
    rows = []
    for name, pub in FIG13.items():
        s = runs[name]
        b = s["avg_batch_size"]
        if name == "Orca (Max)":
            tol, ok = "exactly 7.00", round(b, 2) == 7.00
        else:
            f = FIG13_TOL[name]
            tol, ok = f"+/- {f:.0%}", abs(b - pub) <= f * pub
        note = ""
        if name == "Orca (Oracle)":
            note = ("buddy slack depends on the length distribution, whose shape the paper "
                    "does not publish")
        if name == "vLLM" and not _saturated(s, n):
            note = (f"the paged run is not saturated at {rate:g} req/s (it still preempts when "
                    "bursts fill the pool): its batch is set by the arrival rate and the latency "
                    "model (Little's law), not by memory alone")
        rows.append(_row("Fig. 13", f"{name} batch size", pub, b, tol, ok, rate=rate,
                         summary=s, note=note))
        rows[-1]["difference"] = (b - pub) / pub * 100.0
        rows[-1]["tolerance"] += " (difference in %)"
    v = runs["vLLM"]["avg_batch_size"]
    for other, lo, hi, pub_ratio in (("Orca (Oracle)", 2.0, 2.8, 30.42 / 13.62),
                                     ("Orca (Max)", 4.3, 5.5, 30.42 / 7.00)):
        r = v / runs[other]["avg_batch_size"]
        rows.append(_row("Fig. 13", f"vLLM / {other} batch ratio", round(pub_ratio, 2), r,
                         f"{lo}x - {hi}x", lo <= r <= hi, rate=rate))
    s = runs["vLLM"]
    span = s["window_end_s"] - s["window_start_s"]
    per_iter = span / s["iterations"] * 1e3 if s["iterations"] else float("nan")
    notes["Latency calibration"] = (
        "Fig. 13 implies about 45 ms per iteration (30.42 running / (2 req/s x 338 output "
        "tokens)). kvsim uses its roofline model unchanged (docs/latency.md: weights + KV read "
        "at 60 % of HBM bandwidth, 60 ns per page and layer, 20 us per request, 5 ms per "
        f"iteration; about 43.5 ms for 30 requests). In the vLLM run at {rate:g} req/s the "
        f"mean iteration took {per_iter:.1f} ms over the window, with a mean batch of "
        f"{v:.2f}. No constant was tuned to these rows.")
    return rows


# -- Fig. 18b --------------------------------------------------------------------------------
def _fig18b(notes: dict, log: Callable[[str], None]) -> list[dict]:
    rows = []
    cases = (("ShareGPT", "sharegpt", 2.0, 3600, (16, 128)),
             ("Alpaca", "alpaca", 50.0, 9000, (16, 32)))
    sizes = BLOCK_SIZES
    text = []
    for label, name, rate, n, (lo, hi) in cases:
        w = build_workload(WorkloadSpec(name=name, rate=rate, num_requests=n,
                                        max_context_len=MAX_LEN))
        lat = {}
        for ps in sizes:
            s = _run(w, **{**VLLM, "page_size": ps})
            lat[ps] = s["normalized_latency_s"]
            log(f"fig18b: {label} block {ps}")
        best = min(lat, key=lambda k: (lat[k], k))
        text.append(f"{label} at {rate:g} req/s ({n} requests): " + ", ".join(
            f"{k}: {v * 1e3:.1f}" for k, v in lat.items()) + " ms/token")
        rows.append(_row("Fig. 18b", f"{label} best block size", f"{lo}-{hi}", best,
                         f"in {lo}-{hi}", lo <= best <= hi, rate=rate,
                         note=f"mean normalized latency {lat[best] * 1e3:.1f} ms/token"))
    notes["Fig. 18b"] = (
        "Block sizes " + ", ".join(map(str, sizes)) + " under the vLLM configuration. The paper "
        "does not give the rates; ShareGPT runs at 2 req/s (vLLM's Fig. 13 rate) and Alpaca at "
        "50 req/s, where memory binds so that large blocks cost batch size. Mean normalized "
        "latency: " + "; ".join(text) + ".")
    return rows


# -- Fig. 15 ---------------------------------------------------------------------------------
def _used(s: dict) -> float:
    """Time-averaged slots held by live requests (shared slots once): the paper's blocks."""
    return s["token_states_pct"] + s["reserved_pct"] + s["internal_frag_pct"]


def _saving(w: Workload) -> tuple[float, dict]:
    shared = _run(w, policy="paged", page_size=16, admission="vllm")
    alone = _run(w, policy="paged-nocache", page_size=16, admission="vllm")
    return (1.0 - _used(shared) / _used(alone)) * 100.0, shared


def _fig15(quick: bool, notes: dict, log: Callable[[str], None]) -> list[dict]:
    rows = []
    groups = 60 if quick else 300
    par: dict[int, float] = {}
    for n in (2, 4, 6):
        w = build_workload(WorkloadSpec(name="parallel-sampling", lengths="alpaca",
                                        num_samples=n, rate=8.0 / n, num_requests=groups * n,
                                        max_context_len=MAX_LEN))
        par[n], s = _saving(w)
        log(f"fig15: parallel n={n}")
        ok = par[n] > 0 and (n == 2 or par[n] > par[n - 2])
        rows.append(_row("Fig. 15", f"Alpaca parallel sampling n={n} memory saved (%)",
                         FIG15_PARALLEL[n], par[n], "trend: > 0, rising with n", ok,
                         rate=8.0 / n, summary=s))
    if not quick:
        sg = {}
        for n in (2, 4, 6):
            w = build_workload(WorkloadSpec(name="parallel-sampling", lengths="sharegpt",
                                            num_samples=n, rate=0.6 / n, num_requests=100 * n,
                                            max_context_len=MAX_LEN))
            sg[n], s = _saving(w)
            log(f"fig15: sharegpt parallel n={n}")
        lo, hi = FIG15_PARALLEL_SHAREGPT
        ok = sg[2] < sg[4] < sg[6]
        rows.append(_row("Fig. 15", "ShareGPT parallel sampling n=2/4/6 memory saved (%)",
                         f"{lo}-{hi}", f"{sg[2]:.1f}-{sg[6]:.1f}", "trend: rising with n", ok,
                         note=f"n=4: {sg[4]:.1f} %; the paper gives the range only in text"))
        beam: dict[int, float] = {}
        for k in (2, 4, 6):
            w = _beam_like(k, groups)
            beam[k], s = _saving(w)
            log(f"fig15: beam-like k={k}")
            ok = beam[k] > par[k] and (k == 2 or beam[k] > beam[k - 2])
            rows.append(_row("Fig. 15", f"Alpaca beam-style k={k} memory saved (%)",
                             FIG15_BEAM[k], beam[k], "trend: rising with k, above parallel",
                             ok, rate=1.0, summary=s,
                             note="approximation of beam search (see notes)"))
    notes["Fig. 15"] = (
        "Memory saved = 1 - (time-averaged slots held by live requests with the radix cache, "
        "`paged`) / (the same without sharing, `paged-nocache`), both page 16, vLLM admission, "
        "15,728 slots, at a rate where neither run queues (Alpaca 8/n prompt groups per s). "
        "The n samples of a prompt are admitted together, so their prompt KV is deduplicated "
        "when the prefill is inserted into the radix tree rather than found at admission "
        "(the prefix hit rate stays 0). kvsim does not implement beam search; it is "
        "approximated by a depth-1 tree: a root request (Alpaca-like prompt and output) "
        "and k children released 3 s later whose prompts are the root's prompt + the "
        "root's output + one token, so the k candidates share the prompt and the decoded "
        "history as beams do. Only the trend (rising with k, above parallel sampling) is "
        "checked.")
    return rows


def _beam_like(k: int, trees: int) -> Workload:
    rng = np.random.default_rng([7, k])
    starts = np.cumsum(rng.exponential(1.0, trees))
    return tree_of_thought(starts, 1, k, 19, 1, LogNormalLengths(58.45, 0.9),
                           level_interval_s=3.0, seed=7,
                           limits=OutputLimits(max_context_len=MAX_LEN), name="beam-like")


# -- Table 1 ---------------------------------------------------------------------------------
def _sig3(x: float) -> float:
    return float(f"{x:.3g}")


def _table1() -> list[dict]:
    rows = []
    for model, gpu, tp, gib, pub_k in TABLE1:
        r = plan(model, gpu, tp=tp, kv_dtype="fp16", kv_mem_gib=gib, page_size=1)
        ours = _sig3(r.kv_tokens / 1000)
        ok = ours == pub_k
        note = f"{r.kv_tokens:,} slots from {gib} GiB"
        if not ok:
            implied = pub_k * 1000 * r.kv_bytes_per_token / 2**30
            note += (f"; the paper prints {gib} GB of KV memory but {pub_k}K slots, which "
                     f"needs {implied:.1f} GiB: its KV column is rounded")
        rows.append(_row("Table 1", f"{model} x{tp} {gpu} KV slots (K)", pub_k, ours,
                         "3 significant digits", ok, note=note))
    return rows


# -- prefix caching --------------------------------------------------------------------------
def _hit_rows(label: str, w: Workload, analytic: dict[int, float], cfg: dict,
              log: Callable[[str], None]) -> list[dict]:
    rows = []
    for ps in (1, 16, 64):
        s = _run(w, **cfg, page_size=ps)
        log(f"prefix: {label} page {ps}")
        v = s["prefix_hit_rate"] * 100
        a = analytic[ps] * 100
        note = "unbounded cache" if ps == 1 else (
            f"loss vs page 1: {analytic[1] * 100 - v:.2f} pts (page-aligned analytic "
            f"{a:.2f} %)")
        rows.append(_row("Prefix caching", f"{label} hit rate, page {ps} (%)", a, v,
                         "+/- 0.1 pts", abs(v - a) <= 0.1, summary=s, note=note))
    return rows


def _prefix(quick: bool, notes: dict, log: Callable[[str], None]) -> list[dict]:
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


# -- analytic cross-checks -------------------------------------------------------------------
def _fixed(n: int, prompt: int, output: int, rate: float) -> Workload:
    return build_workload(WorkloadSpec(name="sharegpt", lengths="fixed", input_len=prompt,
                                       output_len=output, rate=rate, num_requests=n,
                                       max_context_len=MAX_LEN))


def _analytic(quick: bool, log: Callable[[str], None]) -> list[dict]:
    rows = []
    # contiguous-oracle + buddy: L = 100 + 201 - 1 = 300 slots in a 512-slot block
    w = _fixed(60 if quick else 300, 100, 201, 50.0)
    s = _run(w, **ORCA["Orca (Oracle)"])
    v = s["internal_rounding_pct"] / _used(s) * 100
    rows.append(_row("Analytic", "identical requests, oracle+buddy: slack / held (%)",
                     212 / 512 * 100, v, "+/- 0.01 pts", abs(v - 212 / 512 * 100) <= 0.01,
                     summary=s, note="L = 300 in a 512-slot buddy block: 212/512 of held "
                     "memory is slack"))
    # paged, page 16, prompt-only requests: 100 tokens in 7 pages
    w = _fixed(60 if quick else 300, 100, 1, 20.0)
    s = _run(w, policy="paged-nocache", page_size=16, admission="sglang")
    v = s["internal_rounding_pct"] / _used(s) * 100
    rows.append(_row("Analytic", "identical requests, paged 16: rounding / held (%)",
                     12 / 112 * 100, v, "+/- 0.01 pts", abs(v - 12 / 112 * 100) <= 0.01,
                     summary=s, note="L = 100 in 7 pages of 16: 12/112 of held memory"))
    log("analytic: fragmentation")
    for slots in (SLOTS, 10_000):
        w = _sharegpt(2.0, 300 if quick else 1000)
        s = _run(w, **ORCA["Orca (Max)"], kv_tokens=slots)
        exp = slots // MAX_LEN
        rows.append(_row("Analytic", f"contiguous-max concurrency, {slots:,} slots",
                         exp, s["peak_batch_size"], "exact",
                         s["peak_batch_size"] == exp, rate=2.0, summary=s,
                         note=f"floor({slots} / {MAX_LEN}); peak batch of a saturated run"))
    log("analytic: concurrency")
    return rows


# -- entry points ----------------------------------------------------------------------------
def run_validation(quick: bool = False, progress: bool = False) -> pd.DataFrame:
    """Every validation check, one row each (see COLUMNS). `quick` uses fewer requests and
    skips the slow rows (Fig. 18b, Fig. 15 ShareGPT and beam-style): about 25 s on 2 cores.
    The method notes are in `df.attrs["notes"]`, the wall time in `df.attrs["wall_s"]`."""
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        if progress:
            print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", flush=True)

    notes: dict[str, str] = {}
    rows: list[dict] = []
    rows += _table1()
    rows += _analytic(quick, log)
    rows += _prefix(quick, notes, log)
    rows += _fig13(quick, notes, log)
    rows += _fig2(quick, notes, log)
    if not quick:
        rows += _fig18b(notes, log)
    rows += _fig15(quick, notes, log)
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df.attrs["notes"] = notes
    df.attrs["quick"] = quick
    df.attrs["wall_s"] = time.perf_counter() - t0
    notes["Lengths"] = (
        f"ShareGPT-like lengths: the bundled ShareGPT length file (means 2,340 in / 439 out) "
        f"with each column multiplied by one factor and rounded so the means are the paper's "
        f"161.31 / 337.99 (`{sharegpt_lengths().note}`), resampled by row; outputs capped so "
        f"prompt + output <= {MAX_LEN}. Alpaca-like: independent lognormals at the paper's "
        "means 19.31 / 58.45 (sigma 0.6 / 0.9, ours: the paper publishes no spread). Poisson "
        "arrivals.")
    notes["Categories"] = (
        "token states = token states; reservation = reserved; internal fragmentation = "
        "over-reservation (slots reserved beyond the final length); external fragmentation & "
        "others = external + rounding (buddy slack, last-page tail) + free + cached.")
    return df


def _fmt(v, column: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if column in ("queue_backlog", "preemptions") and isinstance(v, (int, float, np.number)):
        return f"{int(v):,}"
    if column == "rate" and isinstance(v, (int, float, np.number)):
        return f"{float(v):.3g}"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.2f}"
    return str(v).replace("|", "\\|")


def render_validation_markdown(df: pd.DataFrame) -> str:
    """The report: a summary line, the table, and the method notes of the run."""
    passed = int(df["pass"].sum())
    mode = "quick" if df.attrs.get("quick") else "full"
    lines = [
        "# Validation against published results",
        "",
        "Generated by `run_validation()` / `write_validation_report()` "
        "(simulator/validation.py); do not edit by hand.",
        "",
        f"{passed} of {len(df)} checks pass ({mode} run, "
        f"{df.attrs.get('wall_s', float('nan')):.0f} s). Percentages are shares of the KV pool "
        "unless a row says otherwise; `difference` is kvsim - published (in % of published "
        "for Fig. 13 batch sizes).",
        "",
        "| " + " | ".join(c.replace("_", " ") for c in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for rec in df.to_dict("records"):
        lines.append("| " + " | ".join(_fmt(rec[c], c) for c in COLUMNS) + " |")
    lines += ["", "## Method notes", ""]
    for key, text in df.attrs.get("notes", {}).items():
        lines += [f"**{key}.** {text}", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_validation_report(df: pd.DataFrame, path: str | os.PathLike = "docs/validation.md"
                            ) -> Path:
    """Write the Markdown report atomically (temporary file in the same folder, then
    os.replace), so a reader never sees half a report."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = render_validation_markdown(df)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return out


__all__ = ["render_validation_markdown", "run_validation", "write_validation_report"]


if __name__ == "__main__":  # pragma: no cover
    import sys

    quick_run = "--quick" in sys.argv
    frame = run_validation(quick=quick_run, progress=True)
    write_validation_report(frame, "docs/validation.md")
    print(frame[["name", "published", "kvsim", "pass"]].to_string())
