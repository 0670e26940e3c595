"""The vLLM paper's Fig. 15: memory saved by sharing KV, in parallel sampling (simulated by
the engine with and without the radix cache) and in beam search (experiments.validation.beam,
since the engine cannot create and prune sequences mid-request).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from experiments.validation.beam import BeamConfig, beam_memory, sharing_bounds
from experiments.validation.rows import (
    MAX_CONTEXT_LEN,
    Tolerance,
    held_pct,
    make_row,
    run_summary,
)
from workloads.lengths import alpaca_lengths
from workloads.registry import build_workload
from workloads.request import Workload
from workloads.spec import WorkloadSpec

FIG15_PARALLEL = {2: 6.09, 4: 8.53, 6: 9.79}  # Alpaca, percent of blocks saved
FIG15_PARALLEL_SHAREGPT = (16.2, 30.5)
FIG15_BEAM = {2: 37.56, 4: 53.13, 6: 55.16}
# Every Fig. 15 band is relative (in % of the published saving): the published values run from
# 6 to 55 %, and a band in points would mean a 55 % miss at the low end and nothing at the top.
# Reading: Fig. 15 prints its values to two decimals (0.005), in % of each value; the ShareGPT
# range is given in the text to one decimal (0.05). Seed sd: kvsim's saving over seeds 0-4 at
# the full run's scale, in % of its mean (python -m experiments.validation.spread, 2026-12-01:
# Alpaca n=2 2.75-3.27, sd 0.257; n=4 5.44-6.70, sd 0.517; n=6 6.39-7.38, sd 0.384; ShareGPT
# n=2 11.2-14.8, sd 1.34; n=6 24.9-28.8, sd 1.61; beam k=2/4/6 sd 0.55 / 0.84 / 0.94 pts):
FIG15_PARALLEL_SEED_SD = {2: 8.5, 4: 8.5, 6: 5.6}
FIG15_SHAREGPT_SEED_SD = (10.5, 5.9)  # n = 2, n = 6
FIG15_BEAM_SEED_SD = {2: 1.35, 4: 1.37, 6: 1.39}
FIG15_TOL = {
    **{("parallel", n): Tolerance(0.005 / v * 100, FIG15_PARALLEL_SEED_SD[n], relative=True)
       for n, v in FIG15_PARALLEL.items()},
    **{("sharegpt", n): Tolerance(0.05 / v * 100, sd, relative=True)
       for n, v, sd in zip((2, 6), FIG15_PARALLEL_SHAREGPT, FIG15_SHAREGPT_SEED_SD, strict=True)},
    **{("beam", k): Tolerance(0.005 / v * 100, FIG15_BEAM_SEED_SD[k], relative=True)
       for k, v in FIG15_BEAM.items()},
}


def _saving(w: Workload) -> tuple[float, dict]:
    shared = run_summary(w, policy="paged", page_size=16, admission="vllm")
    alone = run_summary(w, policy="paged-nocache", page_size=16, admission="vllm")
    return (1.0 - held_pct(shared) / held_pct(alone)) * 100.0, shared


def fig15_rows(quick: bool, notes: dict, log: Callable[[str], None], seed: int = 0
               ) -> list[dict]:
    """Fig. 15: parallel sampling simulated (Alpaca, and ShareGPT in the full run), beam
    search modelled (`seed`: the workloads' and the beam model's, for the spread)."""
    rows = []
    groups = 60 if quick else 300
    par: dict[int, float] = {}
    for n in (2, 4, 6):
        w = build_workload(WorkloadSpec(name="parallel-sampling", lengths="alpaca",
                                        num_samples=n, rate=8.0 / n, num_requests=groups * n,
                                        max_context_len=MAX_CONTEXT_LEN, seed=seed))
        par[n], s = _saving(w)
        log(f"fig15: parallel n={n}")
        t = FIG15_TOL[("parallel", n)]
        rel = (par[n] / FIG15_PARALLEL[n] - 1) * 100
        rows.append(make_row("Fig. 15", f"Alpaca parallel sampling n={n} memory saved (%)",
                             FIG15_PARALLEL[n], par[n], t.label(), t.ok(par[n], FIG15_PARALLEL[n]),
                             rate=8.0 / n, summary=s,
                             note=f"{rel:+.0f} % of the paper's value"))
    if not quick:
        sg = {}
        for n in (2, 4, 6):
            w = build_workload(WorkloadSpec(name="parallel-sampling", lengths="sharegpt",
                                            num_samples=n, rate=0.6 / n, num_requests=100 * n,
                                            max_context_len=MAX_CONTEXT_LEN, seed=seed))
            sg[n], s = _saving(w)
            log(f"fig15: sharegpt parallel n={n}")
        lo, hi = FIG15_PARALLEL_SHAREGPT
        t_lo, t_hi = FIG15_TOL[("sharegpt", 2)], FIG15_TOL[("sharegpt", 6)]
        ok = t_lo.ok(sg[2], lo) and t_hi.ok(sg[6], hi)
        rows.append(make_row("Fig. 15", "ShareGPT parallel sampling n=2/4/6 memory saved (%)",
                             f"{lo}-{hi}", f"{sg[2]:.1f}-{sg[6]:.1f}",
                             f"n=2 {t_lo.label()}; n=6 {t_hi.label()}", ok,
                             note=f"n=4: {sg[4]:.1f} %; the paper gives the range only in text; "
                             f"ends {(sg[2] / lo - 1) * 100:+.0f} % / "
                             f"{(sg[6] / hi - 1) * 100:+.0f} % of the paper's"))
    rows += fig15_beam_rows(quick, notes, log, seed=7 + seed)
    notes["Fig. 15 parallel sampling"] = (
        "Memory saved = 1 - (time-averaged slots held by live requests with the radix cache, "
        "`paged`) / (the same without sharing, `paged-nocache`), both page 16, vLLM admission, "
        "15,728 slots, at a rate where neither run queues (Alpaca 8/n prompt groups per s). "
        "The n samples of a prompt are admitted together, so their prompt KV is deduplicated "
        "when the prefill is inserted into the radix tree rather than found at admission "
        "(the prefix hit rate stays 0). Bands relative to the published saving (see "
        "experiments/validation/sharing.py).")
    return rows


def fig15_beam_rows(quick: bool, notes: dict, log: Callable[[str], None], seed: int = 7
                    ) -> list[dict]:
    """Beam search through experiments.validation.beam (page-level block tables with reference
    counts and copy-on-write): the engine cannot create and prune sequences mid-request."""
    groups = 150 if quick else 1000
    rng = np.random.default_rng([seed, 0xB3A])
    prompts, outputs = alpaca_lengths().sample_pairs(rng, groups)
    outputs = np.minimum(outputs, MAX_CONTEXT_LEN - prompts)
    rows, text, gaps = [], [], []
    above: list[str] = []  # widths where kvsim saves more than the paper, beyond tolerance
    for k in (2, 4, 6):
        t0 = time.perf_counter()
        m = beam_memory(prompts, outputs, BeamConfig(k, page_size=16, seed=seed))
        neutral = beam_memory(prompts, outputs, BeamConfig(k, page_size=16, seed=seed,
                                                           survivors="uniform")).saved_pct
        lo, hi = sharing_bounds(prompts, outputs, k, 16)
        log(f"fig15: beam search k={k} ({time.perf_counter() - t0:.1f} s)")
        v, pub, t = m.saved_pct, FIG15_BEAM[k], FIG15_TOL[("beam", k)]
        ok = t.ok(v, pub)
        note = f"bounds {lo:.1f}-{hi:.1f} %; uniform-parent survivors {neutral:.1f} %"
        if not ok and v > pub:
            above.append(f"k = {k}")
            note = (f"kvsim saves more: its beams share all but about their last page (that "
                    f"bound: {hi:.1f} %; uniform-parent survivors {neutral:.1f} %); the paper's "
                    "value implies beams that stay apart longer (see the notes)")
        elif not ok:
            note = (f"kvsim saves less (bounds {lo:.1f}-{hi:.1f} %, uniform-parent survivors "
                    f"{neutral:.1f} %; see the notes)")
        rows.append(make_row("Fig. 15", f"Alpaca beam search k={k} memory saved (%)", pub, v,
                             t.label(), ok, note=note))
        text.append(f"k={k}: {v:.1f} % (uniform-parent {neutral:.1f} %, bounds {lo:.1f}-"
                    f"{hi:.1f} %)")
        gaps += [hi - v, hi - neutral]
    why = ""
    if above:
        why = (f" The paper's lower values at {' and '.join(above)} fit that picture, but the "
               "paper does not give enough to model peaked distributions without tuning a free "
               "parameter to its answer, so those rows are reported as not reproduced.")
    notes["Fig. 15 beam search"] = (
        f"experiments/validation/beam.py, {groups} requests with Alpaca-like lengths, page 16. "
        "Each request is prefilled once; its k beams share the prompt's pages and every beam "
        "writes one token per decode step (a fresh page when the last is full, a private copy "
        "of a shared partial last page, copy-on-write, as vLLM does). After each step the top "
        "k of the beams' candidates survive: a beam without a surviving child releases its "
        "pages, a beam with c children is forked c - 1 times (references, no copies). Memory "
        "saved = "
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

