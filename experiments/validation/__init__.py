"""Validation: kvsim's numbers next to published ones (vLLM paper, SGLang paper, closed forms).

`run_validation()` runs every check and returns one DataFrame row per check; the report is
rendered and written by reports.validation_report. Nothing in the report is typed by hand:
every kvsim number comes from a run here. `python -m experiments.validation` regenerates the
repository's docs/validation.md and `--check` fails when a fresh run drifts from it.

The checks, by source: vllm_paper.py (Fig. 2 memory shares, Fig. 13 batch sizes, Fig. 18b best
block sizes, Table 1 slot counts), sharing.py (Fig. 15 sharing savings, beam search through
beam.py), closed_form.py (prefix-cache hit rates, fragmentation and concurrency against
formulas), hybrid_rows.py (vLLM's hybrid block sizes, RFC #11382's sliding-window waste),
fleet_rows.py (the published fleet benchmarks' setups and figures; the per-pod KV pools);
rows.py holds the row and its kinds. Every row has a kind (KINDS), because agreement
means different things: only a `reproduced` row is a published number the simulation could
have missed, and the counts keep the kinds apart so the headline only claims what the
simulation earned. Each paper row's band has its reason beside it (rows.Tolerance: reading
precision plus measured seed spread, spread.py), and tests/data/validation_verdicts.csv locks
every row's verdict.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from experiments.validation.closed_form import analytic_rows, prefix_rows
from experiments.validation.fleet_rows import awaiting_rows, pool_rows
from experiments.validation.hybrid_rows import hybrid_rows
from experiments.validation.latency_rows import latency_rows
from experiments.validation.rows import MAX_CONTEXT_LEN
from experiments.validation.sharing import FIG15_TOL, fig15_rows
from experiments.validation.vllm_paper import fig2_rows, fig13_rows, fig18b_rows, table1_rows
from reports.validation_report import (
    COLUMNS,
    CROSS_CHECK,
    DERIVED,
    IDENTITY,
    KINDS,
    NOT_REPRODUCED,
    REPRODUCED,
    render_validation_markdown,
    report_drift,
    summary_line,
    write_validation_report,
)
from workloads.lengths import sharegpt_lengths

REPO_REPORT = Path(__file__).resolve().parents[2] / "docs" / "validation.md"


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
    rows += table1_rows()
    rows += analytic_rows(quick, log)
    rows += prefix_rows(quick, notes, log)
    rows += fig13_rows(quick, notes, log)
    rows += fig2_rows(quick, notes, log)
    if not quick:
        rows += fig18b_rows(notes, log)
    rows += fig15_rows(quick, notes, log)
    rows += latency_rows(log)
    rows += hybrid_rows(notes)
    rows += pool_rows()
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in ("reference", "kvsim"):  # mixed numbers and text: keep ints as ints
        df[col] = pd.Series([r[col] for r in rows], dtype=object)
    df.attrs["notes"] = notes
    df.attrs["awaiting"] = awaiting_rows()
    df.attrs["quick"] = quick
    df.attrs["wall_s"] = time.perf_counter() - t0
    notes["Lengths"] = (
        f"ShareGPT-like lengths: the bundled ShareGPT length file (means 2,340 in / 439 out) "
        f"with each column multiplied by one factor and rounded so the means are the paper's "
        f"161.31 / 337.99 (`{sharegpt_lengths().note}`), resampled by row; outputs capped so "
        f"prompt + output <= {MAX_CONTEXT_LEN}. Alpaca-like: independent lognormals at the paper's "
        "means 19.31 / 58.45 (sigma 0.6 / 0.9, ours: the paper publishes no spread). Poisson "
        "arrivals.")
    notes["Latency"] = (
        "The latency rows run the modern profiles (docs/latency.md) on Llama-3.1-8B / H100: "
        "vllm-hopper / fa3 against vLLM v0.19.1's batch-1 ITL line (its calibration source, "
        "hence identities) and sglang-hopper / fa3 against SGLang PR #4832 at pages 1, 64, 128 "
        "(page 64 is its fit point; the PR does not state its GPU). Every other row uses "
        "vllm-paper-2023, the 2023 calibration. Tolerances are justified in "
        "experiments/validation/latency_rows.py.")
    notes["Fleet pools"] = (
        "The llm-d capacity reports' per-pod KV tokens (their profiles' comments) against "
        "`kvsim plan --budget vllm` on the same model, GPU and TP at kvsim's defaults "
        "(gpu_memory_utilization 0.9, activation peak 2 GiB and non-torch 0.5 GiB per GPU), "
        "exact since vLLM prints a block count. Both reports imply about 3.14 GiB per GPU "
        "outside weights and KV where kvsim assumes 2.5; the reports name no vLLM version, "
        "utilization or max-num-batched-tokens, and no constant was changed to meet them. "
        "The fleet figures below the tables (experiments/validation/fleet_rows.py) await "
        "kvsim's fleet simulation.")
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
        "rounding, contiguous-max concurrency, ideal prefix hit rates), met exactly (to "
        "1e-9, float rounding). These can fail, so they test the simulator, but they are no "
        f"evidence about the paper. `{DERIVED}`: a paper claim computed from other rows (the "
        "Fig. 13 batch ratios), shown but not counted: it has no run of its own.")
    notes["Tolerances"] = (
        "Each paper row's band is the published value's reading precision (half a unit of "
        "the last digit the paper prints) plus 3 x sqrt(2) standard deviations of kvsim's "
        "value over seeds 0-4 at the row's own scale (the paper's number is one run with seed "
        "noise too; the sqrt(2) is for the difference of two runs). `python -m "
        "experiments.validation.spread` measures the deviations; experiments/validation/"
        "vllm_paper.py and sharing.py quote them beside each band. Fig. 13 and Fig. 15 bands "
        "are relative (in % of the published value). A gap beyond the band is a difference "
        "of model or input (the paper's length distribution, latency, sampling), and the row "
        "is reported as not reproduced: no band was widened and no constant tuned to pass.")
    return df


def main(argv: list[str] | None = None) -> int:
    """The doc generator. A full run writes the repository's docs/validation.md (found from
    this file, not the working directory); `--check` compares instead of writing; a quick run
    prints, since its rows must never replace the full report."""
    ap = argparse.ArgumentParser(prog="python -m experiments.validation",
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


__all__ = ["COLUMNS", "CROSS_CHECK", "DERIVED", "FIG15_TOL", "IDENTITY", "KINDS", "NOT_REPRODUCED",
           "REPO_REPORT", "REPRODUCED", "main", "run_validation"]
