"""The vLLM paper's (arXiv 2309.06180) memory and batching figures, simulated: Fig. 2
(where KV memory goes), Fig. 13 (batch sizes), Fig. 18b (best block sizes), Table 1 (slots).

The paper does not publish the request rate behind Fig. 2, its length standard deviations or
its per-iteration latency, so those are searched, derived or assumed, and each choice is
recorded in the notes the report prints.
"""

from __future__ import annotations

from collections.abc import Callable

from experiments.validation.rows import (
    DERIVED,
    EXACT,
    IDENTITY,
    MAX_CONTEXT_LEN,
    ORCA,
    PAPER,
    SLOTS,
    SYSTEMS,
    VLLM,
    Tolerance,
    make_row,
    paper_shares,
    run_summary,
    saturated,
    sharegpt_workload,
)
from kvcore.model.memory import MemorySpec
from kvcore.model.planner import plan
from workloads.registry import build_workload
from workloads.spec import WorkloadSpec

# Fig. 2 (token states, reservation, internal frag., external frag. & others), percent
FIG2 = {
    "Orca (Max)": (20.4, 13.3, 57.3, 8.9),
    "Orca (Pow2)": (26.8, 17.9, 13.6, 41.6),
    "Orca (Oracle)": (38.2, 25.2, None, 36.6),
    "vLLM": (96.3, None, None, 3.7),
}
FIG2_CATS = ("token states", "reservation", "internal frag.", "external frag. & others")
# Fig. 2 prints its shares to one decimal: reading precision 0.05 pts. Seed sd: kvsim's share
# over seeds 0-4 at 2.5 req/s, 30-minute traces, the full run's setting (python -m
# experiments.validation.spread, 2026-12-01: e.g. Orca (Max) token states 17.36-18.18, mean
# 17.71, sd 0.339; vLLM token states 96.69-97.09, sd 0.161):
FIG2_SEED_SD = {  # (system, category index) -> pts
    ("Orca (Max)", 0): 0.34, ("Orca (Max)", 1): 0.13, ("Orca (Max)", 2): 0.39,
    ("Orca (Pow2)", 0): 0.25, ("Orca (Pow2)", 1): 0.12, ("Orca (Pow2)", 2): 0.16,
    ("Orca (Pow2)", 3): 0.26,
    ("Orca (Oracle)", 0): 0.26, ("Orca (Oracle)", 1): 0.12, ("Orca (Oracle)", 3): 0.29,
    ("vLLM", 0): 0.16,
}
FIG2_TOL = {key: Tolerance(0.05, sd) for key, sd in FIG2_SEED_SD.items()}
FIG13 = {"Orca (Max)": 7.00, "Orca (Pow2)": 9.81, "Orca (Oracle)": 13.62, "vLLM": 30.42}
# Fig. 13 prints the batch sizes to two decimals: reading 0.005, in % of each value. Seed sd:
# kvsim's mean batch over seeds 0-4, 1-hour traces at 2 req/s (the paper's), in % of the mean
# (python -m experiments.validation.spread, 2026-12-01: Pow2 10.26-10.51, sd 0.090; Oracle
# 16.21-16.47, sd 0.114; vLLM 31.41-32.98, sd 0.612):
FIG13_SEED_SD = {"Orca (Pow2)": 0.87, "Orca (Oracle)": 0.70, "vLLM": 1.89}
FIG13_TOL = {name: Tolerance(0.005 / FIG13[name] * 100, sd, relative=True)
             for name, sd in FIG13_SEED_SD.items()}
TABLE1 = [  # model, gpu, tp, KV GiB, published slots (thousands)
    ("opt-13b", "a100-40gb", 1, 12, 15.7),
    ("opt-66b", "a100-40gb", 4, 21, 9.7),
    ("opt-175b", "a100-80gb", 8, 264, 60.1),
]
FIG2_RATES = (1.5, 2.0, 2.5, 3.0)  # req/s searched for Fig. 2 (the paper does not say)
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


# -- Fig. 2 ----------------------------------------------------------------------------------
def fig2_rows(quick: bool, notes: dict, log: Callable[[str], None], seed: int = 0,
              rates: tuple[float, ...] | None = None) -> list[dict]:
    """Fig. 2 at the lowest searched rate that saturates the paged run (`rates`: the search,
    default FIG2_RATES; `seed`: the workload's, for the spread measurement)."""
    minutes = 5 if quick else 30
    warm = 30.0 if quick else 60.0
    rates = rates or ((2.5,) if quick else FIG2_RATES)
    search = []
    chosen = None
    chosen_runs: dict[str, dict] = {}
    for rate in rates:
        n = int(rate * 60 * minutes)
        w = sharegpt_workload(rate, n, seed)
        s = run_summary(w, **VLLM, warmup_s=warm)
        search.append((rate, s))
        log(f"fig2 search: vLLM at {rate} req/s: backlog {s['queue_backlog']}")
        if saturated(s, n):
            chosen = rate
            chosen_runs["vLLM"] = s
            for name, cfg in ORCA.items():
                chosen_runs[name] = run_summary(w, **cfg, warmup_s=warm)
                log(f"fig2: {name} at {rate} req/s")
            break
    lines = [f"vLLM at {r:g} req/s: token states {s['token_states_pct']:.1f} %, free "
             f"{s['free_pct']:.1f} %, backlog {s['queue_backlog']}, preemptions "
             f"{s['preemptions']}" for r, s in search]
    if chosen is None:
        notes["Fig. 2 rate"] = ("no searched rate saturated the vLLM run: " + "; ".join(lines))
        return [make_row("Fig. 2", "rate search", "saturated", "none", "backlog > 0", False,
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
    for name, pub in FIG2.items():
        s = chosen_runs[name]
        ours = paper_shares(s)
        sat = saturated(s, int(chosen * 60 * minutes))
        for k, (cat, p) in enumerate(zip(FIG2_CATS, pub, strict=True)):
            v = ours[k]
            if name == "vLLM":
                tol = FIG2_TOL[(name, 0)]
                if k == 0:
                    rows.append(make_row("Fig. 2", f"{name} {cat}", p, v,
                                         tol.label() + " while saturated", tol.ok(v, p) and sat,
                                         rate=chosen, summary=s,
                                         note="" if sat else "paged run not saturated"))
                elif k == 3:  # 100 - the token-state row above: no new information
                    v = 100.0 - ours[0]
                    rows.append(make_row("Fig. 2", f"{name} everything else", p, v, tol.label(),
                                         tol.ok(v, p), rate=chosen, summary=s, kind=IDENTITY,
                                         note="100 - the token-state row (the paper shows only the "
                                         f"remainder for vLLM; same band); kvsim: reserved "
                                         f"{ours[1]:.1f}, rounding {s['internal_rounding_pct']:.2f}"
                                         f", free {s['free_pct']:.1f} %"))
                continue
            if p is None:  # Oracle internal: not shown in the paper (no over-reservation)
                rows.append(make_row("Fig. 2", f"{name} {cat}", "not shown", v,
                                     f"0 by construction (+/- {EXACT:g})", abs(v) <= EXACT,
                                     rate=chosen, summary=s, kind=IDENTITY,
                                     note="the oracle reserves exactly the final length, so it "
                                     "never over-reserves; the paper shows no value"))
                continue
            if name == "Orca (Max)" and k == 3:  # 7 blocks of 2,048 always taken: the rest
                exp = (SLOTS - SLOTS // MAX_CONTEXT_LEN * MAX_CONTEXT_LEN) / SLOTS * 100
                # the paper prints 8.9: it can be read to +/- 0.05 pts, and the arithmetic
                # has no seed noise once 7 requests run throughout the window
                rows.append(make_row("Fig. 2", f"{name} {cat}", p, v,
                                     "+/- 0.05 pts (printed to one decimal)",
                                     abs(v - p) <= 0.05 + EXACT, rate=chosen, summary=s,
                                     kind=IDENTITY,
                                     note=f"(15728 - 7 x 2048) / 15728 = {exp:.2f} % whenever 7 "
                                     "requests run (see the contiguous-max cross-check); the "
                                     "paper's 8.9 is the same arithmetic"))
                continue
            tol = FIG2_TOL[(name, k)]
            ok = tol.ok(v, p)
            note = ""
            if not ok:
                note = ("kvsim lengths are the bundled ShareGPT file rescaled to the paper's "
                        "means; the paper's length shape (and so the buddy slack) is not "
                        "published")
            rows.append(make_row("Fig. 2", f"{name} {cat}", p, v, tol.label(), ok, rate=chosen,
                                 summary=s, note=note))
    return rows


# -- Fig. 13 ---------------------------------------------------------------------------------
def fig13_rows(quick: bool, notes: dict, log: Callable[[str], None], seed: int = 0
               ) -> list[dict]:
    """Fig. 13's mean batch sizes at 2 req/s, and the paper's two ratio claims (derived)."""
    rate = 2.0
    n = 1200 if quick else 7200  # the paper's traces are 1 hour long
    warm = 30.0 if quick else 60.0
    w = sharegpt_workload(rate, n, seed)
    runs = {}
    for name, cfg in SYSTEMS.items():
        runs[name] = run_summary(w, **cfg, warmup_s=warm)
        log(f"fig13: {name}")
    rows = []
    for name, pub in FIG13.items():
        s = runs[name]
        b = s.avg_batch_size
        kind = PAPER
        if name == "Orca (Max)":  # every request holds 2,048 of 15,728 slots: 7 fit
            # printed as 7.00: read to +/- 0.005, and no seed noise once saturated
            tol, ok, kind = "7.00 +/- 0.005 (as printed)", abs(b - 7.0) <= 0.005, IDENTITY
        else:
            t = FIG13_TOL[name]
            tol, ok = t.label(), t.ok(b, pub)
        note = ""
        if name == "Orca (Max)":
            note = ("floor(15728 / 2048) while saturated (see the contiguous-max cross-check); "
                    "the paper's 7.00 is the same arithmetic")
        if name == "Orca (Oracle)":
            note = ("buddy slack depends on the length distribution, whose shape the paper "
                    "does not publish")
        if name == "vLLM" and not saturated(s, n):
            note = (f"the paged run is not saturated at {rate:g} req/s (it still preempts when "
                    "bursts fill the pool): its batch is set by the arrival rate and the latency "
                    "model (Little's law), not by memory alone")
        rows.append(make_row("Fig. 13", f"{name} batch size", pub, b, tol, ok, rate=rate,
                             summary=s, note=note, kind=kind))
        rows[-1]["difference"] = (b - pub) / pub * 100.0
        rows[-1]["tolerance"] += " (difference in %)"
    v = runs["vLLM"].avg_batch_size
    for other in ("Orca (Oracle)", "Orca (Max)"):
        pub_ratio = FIG13["vLLM"] / FIG13[other]
        # symmetric, to first order the two batch rows' relative bands added (Orca (Max)'s
        # batch is exact: it adds its reading precision only)
        rel = FIG13_TOL["vLLM"].width + (FIG13_TOL[other].width if other in FIG13_TOL
                                         else 0.005 / FIG13[other] * 100)
        half = pub_ratio * rel / 100
        r = v / runs[other].avg_batch_size
        rows.append(make_row("Fig. 13", f"vLLM / {other} batch ratio", round(pub_ratio, 2), r,
                             f"+/- {half:.2f}x (the batch rows' bands, {rel:.1f} %)",
                             abs(r - pub_ratio) <= half, rate=rate, kind=DERIVED,
                             note="the paper's ratio claim, computed from the batch rows above: "
                             "no run of its own, so not counted as a reproduction"))
    s = runs["vLLM"]
    span = s.window_end_s - s.window_start_s
    per_iter = span / s.iterations * 1e3 if s.iterations else float("nan")
    notes["Latency calibration"] = (
        "Fig. 13 implies about 45 ms per iteration (30.42 running / (2 req/s x 338 output "
        "tokens)). kvsim uses its roofline model unchanged (docs/latency.md: weights + KV read "
        "at 60 % of HBM bandwidth, 60 ns per page and layer, 20 us per request, 5 ms per "
        f"iteration; about 43.5 ms for 30 requests). In the vLLM run at {rate:g} req/s the "
        f"mean iteration took {per_iter:.1f} ms over the window, with a mean batch of "
        f"{v:.2f}. No constant was tuned to these rows.")
    return rows


# -- Fig. 18b --------------------------------------------------------------------------------
def fig18b_rows(notes: dict, log: Callable[[str], None]) -> list[dict]:
    rows = []
    # the bands are the paper's own reading of its figure (arXiv 2309.06180, Sec. 7 "Impact
    # of block size"): 16 to 128 best on ShareGPT; 16 and 32 on Alpaca, larger ones degrade.
    # A best size is a discrete choice, so no seed band is added.
    cases = (("ShareGPT", "sharegpt", 2.0, 3600, (16, 128)),
             ("Alpaca", "alpaca", 50.0, 9000, (16, 32)))
    sizes = BLOCK_SIZES
    text = []
    for label, name, rate, n, (lo, hi) in cases:
        w = build_workload(WorkloadSpec(name=name, rate=rate, num_requests=n,
                                        max_context_len=MAX_CONTEXT_LEN))
        lat = {}
        for ps in sizes:
            s = run_summary(w, **{**VLLM, "page_size": ps})
            lat[ps] = s.normalized_latency_s
            log(f"fig18b: {label} block {ps}")
        best = min(lat, key=lambda k: (lat[k], k))
        text.append(f"{label} at {rate:g} req/s ({n} requests): " + ", ".join(
            f"{k}: {v * 1e3:.1f}" for k, v in lat.items()) + " ms/token")
        rows.append(make_row("Fig. 18b", f"{label} best block size", f"{lo}-{hi}", best,
                             f"in {lo}-{hi}", lo <= best <= hi, rate=rate,
                             note=f"mean normalized latency {lat[best] * 1e3:.1f} ms/token"))
    notes["Fig. 18b"] = (
        "Block sizes " + ", ".join(map(str, sizes)) + " under the vLLM configuration. The paper "
        "does not give the rates; ShareGPT runs at 2 req/s (vLLM's Fig. 13 rate) and Alpaca at "
        "50 req/s, where memory binds so that large blocks cost batch size. Mean normalized "
        "latency: " + "; ".join(text) + ".")
    return rows



# -- Table 1 ---------------------------------------------------------------------------------
def _sig3(x: float) -> float:
    return float(f"{x:.3g}")


def table1_rows() -> list[dict]:
    """The paper's KV GiB is the input and its slot count the output of one division, so these
    rows check the KV-bytes-per-token arithmetic (model dimensions), not the simulator."""
    rows = []
    for model, gpu, tp, gib, pub_k in TABLE1:
        r = plan(MemorySpec(model=model, gpu=gpu, tp=tp, kv_dtype="fp16", kv_mem_gib=gib),
                 page_size=1)
        ours = _sig3(r.kv_tokens / 1000)
        ok = ours == pub_k  # the paper prints 3 significant digits: the reading precision
        note = f"{r.kv_tokens:,} slots from {gib} GiB"
        if not ok:
            implied = pub_k * 1000 * r.kv_bytes_per_token / 2**30
            note += (f"; the paper prints {gib} GB of KV memory but {pub_k}K slots, which "
                     f"needs {implied:.1f} GiB: its KV column is rounded")
        rows.append(make_row("Table 1", f"{model} x{tp} {gpu} KV slots (K)", pub_k, ours,
                             "3 significant digits", ok, note=note, kind=IDENTITY))
    return rows

