"""Validation: kvsim's numbers next to published ones (vLLM paper, SGLang paper, closed forms).

`run_validation()` runs every check and returns one DataFrame row per check;
`render_validation_markdown(df)` / `write_validation_report(df, path)` turn it (plus the
method notes the run produced) into Markdown. Nothing in the report is typed by hand: every
kvsim number comes from a run here. `python -m simulator.validation` regenerates the
repository's docs/validation.md and `--check` fails when a fresh run drifts from it.

Every row has a kind (KINDS), because agreement means different things: a `reproduced` row is
a published number the simulation could have missed; an `analytic identity` agrees with the
paper by arithmetic or construction and so is no evidence; a `closed-form cross-check` has no
paper number and tests the simulator against a formula. The counts keep them apart so the
headline only claims what the simulation earned.

Published targets (vLLM paper, arXiv 2309.06180): Fig. 2 memory shares, Fig. 13 batch sizes,
Fig. 15 sharing savings (beam search through simulator.beam), Fig. 18b best block sizes,
Table 1 slot counts. The paper does not publish the request rate behind Fig. 2, its length
standard deviations, its per-iteration latency or its beams' survivor process, so those are
searched, derived or assumed, and the choice is recorded in the notes.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from kvcore.planner import plan
from simulator.beam import BeamConfig, beam_memory, sharing_bounds
from simulator.config import SimConfig
from simulator.run import simulate
from workloads.lengths import alpaca_lengths, sharegpt_lengths
from workloads.registry import build_workload
from workloads.request import Workload
from workloads.reuse import ideal_reuse
from workloads.spec import WorkloadSpec

COLUMNS = ("section", "kind", "name", "reference", "kvsim", "difference", "tolerance", "pass",
           "rate", "queue_backlog", "preemptions", "note")

# Row kinds. Only a row the simulation could have got wrong counts as evidence that kvsim
# reproduces the paper; rows that agree by construction are kept, but apart and counted apart.
REPRODUCED = "reproduced"  # a paper number kvsim's simulation matched within tolerance
NOT_REPRODUCED = "not reproduced"  # ... and missed
IDENTITY = "analytic identity"  # agrees with the paper by arithmetic, construction or echo
CROSS_CHECK = "closed-form cross-check"  # the simulation against a closed form, no paper number
PAPER = "paper"  # _row's kind for paper rows: resolved to REPRODUCED / NOT_REPRODUCED by `ok`
KINDS = (REPRODUCED, NOT_REPRODUCED, IDENTITY, CROSS_CHECK)
REPO_REPORT = Path(__file__).resolve().parents[1] / "docs" / "validation.md"

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
FIG15_TOL = 5.0  # pts: every Fig. 15 row, the tolerance of the Fig. 2 token-state rows
TABLE1 = [  # model, gpu, tp, KV GiB, published slots (thousands)
    ("opt-13b", "a100-40gb", 1, 12, 15.7),
    ("opt-66b", "a100-40gb", 4, 21, 9.7),
    ("opt-175b", "a100-80gb", 8, 264, 60.1),
]
FIG2_RATES = (1.5, 2.0, 2.5, 3.0)  # req/s searched for Fig. 2 (the paper does not say)
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _row(section: str, name: str, reference, kvsim, tolerance: str, ok: bool,
         difference: float | None = None, rate: float | None = None, summary: dict | None = None,
         note: str = "", kind: str = PAPER) -> dict:
    """One check. `kind` is PAPER (a paper number the simulation could miss), IDENTITY or
    CROSS_CHECK (see KINDS)."""
    if difference is None and isinstance(reference, (int, float)) and isinstance(
            kvsim, (int, float)) and reference is not None:
        difference = float(kvsim) - float(reference)
    if kind == PAPER:
        kind = REPRODUCED if ok else NOT_REPRODUCED
    if kind not in KINDS:
        raise ValueError(f"unknown row kind {kind!r}")
    return {
        "section": section, "kind": kind, "name": name, "reference": reference, "kvsim": kvsim,
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
                elif k == 3:  # 100 - the token-state row above: no new information
                    v = 100.0 - ours[0]
                    rows.append(_row("Fig. 2", f"{name} everything else", p, v, "+/- 7 pts",
                                     abs(v - p) <= 7.0, rate=chosen, summary=s,
                                     kind=IDENTITY,
                                     note="100 - the token-state row (the paper shows only the "
                                     f"remainder for vLLM); kvsim: reserved {ours[1]:.1f}, "
                                     f"rounding {s['internal_rounding_pct']:.2f}, free "
                                     f"{s['free_pct']:.1f} %"))
                continue
            if p is None:  # Oracle internal: not shown in the paper (no over-reservation)
                rows.append(_row("Fig. 2", f"{name} {cat}", "not shown", v, "0 by construction",
                                 abs(v) < 0.005, rate=chosen, summary=s, kind=IDENTITY,
                                 note="the oracle reserves exactly the final length, so it "
                                 "never over-reserves; the paper shows no value"))
                continue
            if name == "Orca (Max)" and k == 3:  # 7 blocks of 2,048 always taken: the rest
                exp = (SLOTS - SLOTS // MAX_LEN * MAX_LEN) / SLOTS * 100
                rows.append(_row("Fig. 2", f"{name} {cat}", p, v, "+/- 0.5 pts",
                                 abs(v - p) <= 0.5, rate=chosen, summary=s, kind=IDENTITY,
                                 note=f"(15728 - 7 x 2048) / 15728 = {exp:.2f} % whenever 7 "
                                 "requests run (see the contiguous-max cross-check); the "
                                 "paper's 8.9 is the same arithmetic"))
                continue
            if k == 0:
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
        kind = PAPER
        if name == "Orca (Max)":  # every request holds 2,048 of 15,728 slots: 7 fit
            tol, ok, kind = "exactly 7.00", round(b, 2) == 7.00, IDENTITY
        else:
            f = FIG13_TOL[name]
            tol, ok = f"+/- {f:.0%}", abs(b - pub) <= f * pub
        note = ""
        if name == "Orca (Max)":
            note = ("floor(15728 / 2048) while saturated (see the contiguous-max cross-check); "
                    "the paper's 7.00 is the same arithmetic")
        if name == "Orca (Oracle)":
            note = ("buddy slack depends on the length distribution, whose shape the paper "
                    "does not publish")
        if name == "vLLM" and not _saturated(s, n):
            note = (f"the paged run is not saturated at {rate:g} req/s (it still preempts when "
                    "bursts fill the pool): its batch is set by the arrival rate and the latency "
                    "model (Little's law), not by memory alone")
        rows.append(_row("Fig. 13", f"{name} batch size", pub, b, tol, ok, rate=rate,
                         summary=s, note=note, kind=kind))
        rows[-1]["difference"] = (b - pub) / pub * 100.0
        rows[-1]["tolerance"] += " (difference in %)"
    v = runs["vLLM"]["avg_batch_size"]
    for other, lo, hi, pub_ratio in (("Orca (Oracle)", 2.0, 2.8, 30.42 / 13.62),
                                     ("Orca (Max)", 4.3, 5.5, 30.42 / 7.00)):
        r = v / runs[other]["avg_batch_size"]
        rows.append(_row("Fig. 13", f"vLLM / {other} batch ratio", round(pub_ratio, 2), r,
                         f"{lo}x - {hi}x", lo <= r <= hi, rate=rate,
                         note="the paper's ratio claim; computed from the batch rows above"))
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
    tol = f"+/- {FIG15_TOL:g} pts"
    par: dict[int, float] = {}
    for n in (2, 4, 6):
        w = build_workload(WorkloadSpec(name="parallel-sampling", lengths="alpaca",
                                        num_samples=n, rate=8.0 / n, num_requests=groups * n,
                                        max_context_len=MAX_LEN))
        par[n], s = _saving(w)
        log(f"fig15: parallel n={n}")
        ok = abs(par[n] - FIG15_PARALLEL[n]) <= FIG15_TOL
        rel = (par[n] / FIG15_PARALLEL[n] - 1) * 100
        rows.append(_row("Fig. 15", f"Alpaca parallel sampling n={n} memory saved (%)",
                         FIG15_PARALLEL[n], par[n], tol, ok, rate=8.0 / n, summary=s,
                         note=f"{rel:+.0f} % of the paper's value (the tolerance is absolute)"))
    if not quick:
        sg = {}
        for n in (2, 4, 6):
            w = build_workload(WorkloadSpec(name="parallel-sampling", lengths="sharegpt",
                                            num_samples=n, rate=0.6 / n, num_requests=100 * n,
                                            max_context_len=MAX_LEN))
            sg[n], s = _saving(w)
            log(f"fig15: sharegpt parallel n={n}")
        lo, hi = FIG15_PARALLEL_SHAREGPT
        ok = abs(sg[2] - lo) <= FIG15_TOL and abs(sg[6] - hi) <= FIG15_TOL
        rows.append(_row("Fig. 15", "ShareGPT parallel sampling n=2/4/6 memory saved (%)",
                         f"{lo}-{hi}", f"{sg[2]:.1f}-{sg[6]:.1f}", f"each end {tol}", ok,
                         note=f"n=4: {sg[4]:.1f} %; the paper gives the range only in text"))
    rows += _fig15_beam(quick, notes, log)
    notes["Fig. 15 parallel sampling"] = (
        "Memory saved = 1 - (time-averaged slots held by live requests with the radix cache, "
        "`paged`) / (the same without sharing, `paged-nocache`), both page 16, vLLM admission, "
        "15,728 slots, at a rate where neither run queues (Alpaca 8/n prompt groups per s). "
        "The n samples of a prompt are admitted together, so their prompt KV is deduplicated "
        "when the prefill is inserted into the radix tree rather than found at admission "
        f"(the prefix hit rate stays 0). Tolerance {tol}, the same as the Fig. 2 token-state "
        "rows (these are shares of memory too).")
    return rows


def _fig15_beam(quick: bool, notes: dict, log: Callable[[str], None]) -> list[dict]:
    """Beam search through simulator.beam (page-level block tables with reference counts and
    copy-on-write): the engine cannot create and prune sequences mid-request."""
    groups = 150 if quick else 1000
    rng = np.random.default_rng([7, 0xB3A])
    prompts, outputs = alpaca_lengths().sample_pairs(rng, groups)
    outputs = np.minimum(outputs, MAX_LEN - prompts)
    tol = f"+/- {FIG15_TOL:g} pts"
    rows, text, gaps = [], [], []
    above: list[str] = []  # widths where kvsim saves more than the paper, beyond tolerance
    for k in (2, 4, 6):
        t0 = time.perf_counter()
        m = beam_memory(prompts, outputs, BeamConfig(k, page_size=16, seed=7))
        neutral = beam_memory(prompts, outputs, BeamConfig(k, page_size=16, seed=7,
                                                           survivors="uniform")).saved_pct
        lo, hi = sharing_bounds(prompts, outputs, k, 16)
        log(f"fig15: beam search k={k} ({time.perf_counter() - t0:.1f} s)")
        v, pub = m.saved_pct, FIG15_BEAM[k]
        ok = abs(v - pub) <= FIG15_TOL
        note = f"bounds {lo:.1f}-{hi:.1f} %; uniform-parent survivors {neutral:.1f} %"
        if not ok and v > pub:
            above.append(f"k = {k}")
            note = (f"kvsim saves more: its beams share all but about their last page (that "
                    f"bound: {hi:.1f} %; uniform-parent survivors {neutral:.1f} %); the paper's "
                    "value implies beams that stay apart longer (see the notes)")
        elif not ok:
            note = (f"kvsim saves less (bounds {lo:.1f}-{hi:.1f} %, uniform-parent survivors "
                    f"{neutral:.1f} %; see the notes)")
        rows.append(_row("Fig. 15", f"Alpaca beam search k={k} memory saved (%)", pub, v, tol,
                         ok, note=note))
        text.append(f"k={k}: {v:.1f} % (uniform-parent {neutral:.1f} %, bounds {lo:.1f}-"
                    f"{hi:.1f} %)")
        gaps += [hi - v, hi - neutral]
    why = ""
    if above:
        why = (f" The paper's lower values at {' and '.join(above)} fit that picture, but the "
               "paper does not give enough to model peaked distributions without tuning a free "
               "parameter to its answer, so those rows are reported as not reproduced.")
    notes["Fig. 15 beam search"] = (
        f"simulator/beam.py, {groups} requests with Alpaca-like lengths, page 16. Each request "
        "is prefilled once; its k beams share the prompt's pages and every beam writes one "
        "token per decode step (a fresh page when the last is full, a private copy of a shared "
        "partial last page, copy-on-write, as vLLM does). After each step the top k of the "
        "beams' candidates survive: a beam without a surviving child releases its pages, a "
        "beam with c children is forked c - 1 times (references, no copies). Memory saved = "
        "1 - (distinct pages held) / (pages if every beam had its own copy, prompt included), "
        "summed over all decode steps (equal iteration times make this the ratio of time "
        "averages). The survivor process is our assumption (the paper publishes neither its "
        "prompts nor its beam traces): beam search over a random language model whose "
        "next-token logits are i.i.d. standard normal over OPT's 50,272 tokens, seeded, not "
        "tuned; every beam runs the request's output length (no early stop). As a second, "
        "parameter-free assumption, each survivor's parent drawn uniformly among the current "
        "beams. Bounds, in closed form for the same lengths: beams sharing only the prompt's "
        "full pages (low) and beams sharing everything but their last page (high). "
        "Results: " + "; ".join(text) + f". Both survivor models come within {max(gaps):.1f} "
        "pts of the high bound: with nearly flat next-token distributions the best beam's "
        "children soon displace the others, so beams rarely stay apart for a whole page. A "
        "real model's next-token distributions are mostly peaked, which would keep beams on "
        "their own lines for longer and save less." + why)
    return rows


# -- Table 1 ---------------------------------------------------------------------------------
def _sig3(x: float) -> float:
    return float(f"{x:.3g}")


def _table1() -> list[dict]:
    """The paper's KV GiB is the input and its slot count the output of one division, so these
    rows check the KV-bytes-per-token arithmetic (model dimensions), not the simulator."""
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
                         "3 significant digits", ok, note=note, kind=IDENTITY))
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
                         "+/- 0.1 pts", abs(v - a) <= 0.1, summary=s, note=note,
                         kind=CROSS_CHECK))
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


# -- closed-form cross-checks ------------------------------------------------------------------
# No paper number here: the simulated value against a closed form of the same quantity. They
# can fail (a wrong buddy placement, page rounding or admission would show), so they test the
# simulator, but they are no evidence about the paper and are counted apart.
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
    rows.append(_row("Fragmentation", "identical requests, oracle+buddy: slack / held (%)",
                     212 / 512 * 100, v, "+/- 0.01 pts", abs(v - 212 / 512 * 100) <= 0.01,
                     summary=s, kind=CROSS_CHECK, note="L = 300 in a 512-slot buddy block: "
                     "212/512 of held memory is slack"))
    # paged, page 16, prompt-only requests: 100 tokens in 7 pages
    w = _fixed(60 if quick else 300, 100, 1, 20.0)
    s = _run(w, policy="paged-nocache", page_size=16, admission="sglang")
    v = s["internal_rounding_pct"] / _used(s) * 100
    rows.append(_row("Fragmentation", "identical requests, paged 16: rounding / held (%)",
                     12 / 112 * 100, v, "+/- 0.01 pts", abs(v - 12 / 112 * 100) <= 0.01,
                     summary=s, kind=CROSS_CHECK,
                     note="L = 100 in 7 pages of 16: 12/112 of held memory"))
    log("analytic: fragmentation")
    for slots in (SLOTS, 10_000):
        w = _sharegpt(2.0, 300 if quick else 1000)
        s = _run(w, **ORCA["Orca (Max)"], kv_tokens=slots)
        exp = slots // MAX_LEN
        rows.append(_row("Concurrency", f"contiguous-max concurrency, {slots:,} slots",
                         exp, s["peak_batch_size"], "exact",
                         s["peak_batch_size"] == exp, rate=2.0, summary=s, kind=CROSS_CHECK,
                         note=f"floor({slots} / {MAX_LEN}); peak batch of a saturated run"))
    log("analytic: concurrency")
    return rows


# -- entry points ----------------------------------------------------------------------------
def run_validation(quick: bool = False, progress: bool = False) -> pd.DataFrame:
    """Every validation check, one row each (see COLUMNS and KINDS). `quick` uses fewer
    requests and skips the slowest rows (Fig. 18b, Fig. 15 ShareGPT): about 30 s on 2 cores.
    Progress goes to stderr, so stdout can carry the report. The method notes are in
    `df.attrs["notes"]`, the wall time in `df.attrs["wall_s"]`."""
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        if progress:
            print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)

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
    for col in ("reference", "kvsim"):  # mixed numbers and text: keep ints as ints
        df[col] = pd.Series([r[col] for r in rows], dtype=object)
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
    notes["Row kinds"] = (
        f"`{REPRODUCED}` / `{NOT_REPRODUCED}`: a number the paper publishes that kvsim's "
        "simulation could have missed, inside / outside the stated tolerance. "
        f"`{IDENTITY}`: a row that matches the paper by arithmetic or by construction, so "
        "agreement says nothing about the simulator: Table 1 (the paper's KV GiB is the "
        "input, the slot count one division away), Orca (Max)'s batch of 7 and its 8.85 % "
        "remainder (floor(15728 / 2048) and (15728 - 7 x 2048) / 15728 once saturated), Orca "
        "(Oracle)'s zero over-reservation (it reserves the final length), vLLM's "
        f"'everything else' (100 - its token-state row). `{CROSS_CHECK}`: no paper number; "
        "the simulated value against a closed form of the same quantity (buddy slack, page "
        "rounding, contiguous-max concurrency, ideal prefix hit rates). These can fail, so "
        "they test the simulator, but they are no evidence about the paper.")
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


def summary_line(df: pd.DataFrame) -> str:
    """The counts, each kind apart: only reproduced rows are evidence about the paper."""
    kinds = df["kind"]
    paper = kinds.isin((REPRODUCED, NOT_REPRODUCED))
    ident = df[kinds == IDENTITY]
    cross = df[kinds == CROSS_CHECK]
    return (
        f"Reproduced: {int((kinds == REPRODUCED).sum())} of {int(paper.sum())} paper rows "
        f"within tolerance; not reproduced: {int((kinds == NOT_REPRODUCED).sum())}; analytic "
        f"identities: {len(ident)} ({int(ident['pass'].sum())} match the paper's printed "
        f"value); closed-form cross-checks: {int(cross['pass'].sum())} of {len(cross)} pass.")


SECTIONS = (
    ("Paper rows simulated by kvsim", (REPRODUCED, NOT_REPRODUCED),
     "The simulation could have disagreed with each of these published numbers."),
    ("Analytic identities", (IDENTITY,),
     "These match the paper by arithmetic or construction (see the notes), so they are not "
     "evidence that the simulator reproduces it; they are kept so the full figure is there."),
    ("Closed-form cross-checks", (CROSS_CHECK,),
     "No paper number: `reference` is a closed form of the quantity kvsim simulates. They "
     "test the simulator, not its agreement with the paper."),
)


def render_validation_markdown(df: pd.DataFrame) -> str:
    """The report: the counts, one table per kind of row, and the method notes of the run."""
    mode = "quick" if df.attrs.get("quick") else "full"
    lines = [
        "# Validation against published results",
        "",
        "Generated by `python -m simulator.validation` (simulator/validation.py); do not edit "
        "by hand. `python -m simulator.validation --check` reruns it and fails if a row drifts.",
        "",
        f"{summary_line(df)} ({mode} run, {df.attrs.get('wall_s', float('nan')):.0f} s.)",
        "",
        "Percentages are shares of the KV pool unless a row says otherwise; `reference` is the "
        "published number (closed-form value for cross-checks); `difference` is kvsim - "
        "reference (in % of the reference for Fig. 13 batch sizes).",
    ]
    header = "| " + " | ".join(c.replace("_", " ") for c in COLUMNS) + " |"
    for title, kinds, blurb in SECTIONS:
        part = df[df["kind"].isin(kinds)]
        lines += ["", f"## {title}", "", blurb, "", header, "|" + "---|" * len(COLUMNS)]
        for rec in part.to_dict("records"):
            lines.append("| " + " | ".join(_fmt(rec[c], c) for c in COLUMNS) + " |")
    lines += ["", "## Method notes", ""]
    for key, text in df.attrs.get("notes", {}).items():
        lines += [f"**{key}.** {text}", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_validation_report(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write the Markdown report atomically (temporary file in the same folder, then
    os.replace), so a reader never sees half a report. There is no default path: a run from
    some other directory must not create docs/ there."""
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


# -- drift check -------------------------------------------------------------------------------
def parse_report_rows(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """The table rows of a rendered report, keyed by (section, name), cells as printed."""
    header = [c.replace("_", " ") for c in COLUMNS]
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for line in text.splitlines():
        if not line.startswith("| "):
            continue
        cells = [c.strip().replace("\\|", "|")
                 for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if cells == header or len(cells) != len(COLUMNS):
            continue
        rec = dict(zip(COLUMNS, cells, strict=True))
        rows[(rec["section"], rec["name"])] = rec
    return rows


def _same_value(a: str, b: str) -> bool:
    """Equal as printed, allowing one unit in the last printed digit (0.01) for numbers, so a
    value sitting on a rounding edge does not count as drift."""
    if a == b:
        return True
    try:
        return abs(float(a.replace(",", "")) - float(b.replace(",", ""))) <= 0.0101
    except ValueError:
        return False


def report_drift(df: pd.DataFrame, committed: str) -> list[str]:
    """Differences between a fresh run and a committed report: rows added or removed, and per
    row its kind, pass, reference or kvsim value (beyond print precision). Empty = no drift."""
    old = parse_report_rows(committed)
    new = parse_report_rows(render_validation_markdown(df))
    out = [f"row missing from the committed report: {k[0]} / {k[1]}" for k in new if k not in old]
    out += [f"row no longer produced: {k[0]} / {k[1]}" for k in old if k not in new]
    for key in new.keys() & old.keys():
        for col in ("kind", "pass", "reference", "kvsim"):
            a, b = old[key][col], new[key][col]
            if not _same_value(a, b):
                out.append(f"{key[0]} / {key[1]}: {col} {a!r} in the report, {b!r} now")
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    """The doc generator. A full run writes the repository's docs/validation.md (found from
    this file, not the working directory); `--check` compares instead of writing; a quick run
    prints, since its rows must never replace the full report."""
    ap = argparse.ArgumentParser(prog="python -m simulator.validation",
                                 description="regenerate or check docs/validation.md")
    ap.add_argument("--quick", action="store_true", help="the reduced run (printed only)")
    ap.add_argument("--check", action="store_true",
                    help="rerun the full validation and exit 1 if any row's kind, pass, "
                    "reference or kvsim value differs from the report; writes nothing")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"report path (default: {REPO_REPORT})")
    args = ap.parse_args(argv)
    if args.check and args.quick:
        ap.error("--check compares a full run with the committed report; drop --quick")
    path = args.out or REPO_REPORT
    frame = run_validation(quick=args.quick, progress=True)
    if args.check:
        drift = report_drift(frame, path.read_text(encoding="utf-8"))
        for line in drift:
            print(line)
        print(f"{len(drift)} difference(s) from {path}" if drift else f"{path} is up to date")
        return 1 if drift else 0
    if args.quick and args.out is None:
        sys.stdout.write(render_validation_markdown(frame))
    else:
        print(f"report: {write_validation_report(frame, path)}")
    print(summary_line(frame))
    return 0


__all__ = ["COLUMNS", "KINDS", "main", "parse_report_rows", "render_validation_markdown",
           "report_drift", "run_validation", "summary_line", "write_validation_report"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
