"""kvsim command line (typer): a thin shell over experiments/ (running) and reports/ (showing).

Each command declares only its own flags; the options of `run`, `sweep`, `compare`, `plan` and
`capacity` (and the grid axes' list flags) are generated from the specs' fields
(experiments/console/command_options.py), and errors become one line and an exit status
(experiments/console/command_errors.py: 2 for a user mistake, 3 for a bug kvsim caught in itself).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

import kvcore
from experiments.answers.compare import COMPARED
from experiments.console.cli_reference import COMMAND_EXAMPLES, epilog
from experiments.console.command_errors import STATE, KvsimGroup
from experiments.console.command_options import from_user, with_options
from experiments.console.console_out import (
    console,
    echo_lines,
    echo_probe,
    freeze_heap_at_exit,
    print_lines,
    print_reuse,
    print_slo,
    warn_overload,
    warn_skipped_rows,
)
from experiments.options.grid import DEFAULT_PAGE_SIZES, SWEEP_AXES, parse_list
from experiments.options.run_options import RunOptions

__all__ = ["EXAMPLES", "SWEEP_AXES", "app", "main"]  # the sweep flags and examples, for tests
EXAMPLES = {command: epilog(command) for command in COMMAND_EXAMPLES}  # each --help's examples


app = typer.Typer(
    cls=KvsimGroup, add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
    help="KV-cache simulator and planner: which page size, which allocator policy, how much "
         "memory, for your traffic.",
)
trace_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Trace files.")
app.add_typer(trace_app, name="trace")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvsim {kvcore.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="print the version and exit"),
    debug: bool = typer.Option(False, "--debug", help="show Python tracebacks of errors"),
) -> None:
    """kvsim: which page size, which allocator policy, how much memory, for your traffic."""
    STATE["debug"] = debug


def _engine_header(opts: RunOptions, lists: dict[str, str | None] | None = None,
                   err: bool = False) -> None:
    """`--engine`'s line, first (on stderr under --json, which keeps stdout JSON); `lists`:
    a grid command's list flags, whose values replace the engine's in every cell."""
    from experiments.options.engines import engine_header
    from experiments.options.grid import SWEEP_AXES

    swept = {name: f"{SWEEP_AXES[name]} {text}" for name, text in (lists or {}).items()
             if text and name in SWEEP_AXES}
    line = engine_header(opts.to_dict(), swept)
    if line is not None:
        opts.sim_config()  # a user mistake is the only line, not after the header
        typer.echo(line, err=err)


# -- run ------------------------------------------------------------------------------------------
@app.command(epilog=epilog("run"))
@with_options()
def run(
    opts: RunOptions,
    events: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--events", help="write the schedule as a Chrome / Perfetto trace JSON",
        rich_help_panel="Output"),
    progress: Optional[bool] = typer.Option(  # noqa: UP045
        None, "--progress/--no-progress", show_default="on a terminal",
        help="progress bar over requests", rich_help_panel="Output"),
) -> None:
    """One simulation: prints the memory breakdown and the latency summary."""
    from experiments.answers.run_one import simulate_one, write_one
    from reports.pool_view import run_tables

    if progress is None:  # long runs show a bar when someone is watching
        progress = sys.stderr.isatty()
    _engine_header(opts)
    one = simulate_one(opts, events=events, progress=progress)
    con = console()
    for table in run_tables(one.row):  # a hybrid run's pools per layer kind come last
        con.print(table)
    if (fleet := one.result.extra.get("fleet")) is not None:  # replicas behind a router
        from reports.fleet_view import fleet_lines, replica_table

        con.print(replica_table(one.row, fleet.replica_rows))
        print_lines(con, fleet_lines(one.row))
    print_reuse(con, [one.row])
    print_slo(con, [one.row])
    warn_skipped_rows([one.row])
    warn_overload([one.row])
    if events is not None:
        con.print(f"events: {events} (open in ui.perfetto.dev)")
    if out := opts.output.out:
        con.print(f"results: {out}/ (summary.csv, requests.parquet, timeline.parquet, "
                  f"config.json, {write_one(opts, one)} figures)")


# -- sweep ----------------------------------------------------------------------------------------
@app.command(epilog=epilog("sweep"))
@with_options(grid={name: DEFAULT_PAGE_SIZES if name == "page_size" else None
                    for name in SWEEP_AXES})
def sweep(
    opts: RunOptions,
    lists: dict[str, str | None],
    jobs: Optional[int] = typer.Option(  # noqa: UP045
        None, "--jobs", "-j", help="worker processes (local pool, or the local Dask cluster)",
        show_default="one per core; one for a small sweep", rich_help_panel="Grid"),
    executor: str = typer.Option("local", "--executor", help="where cells run [local, dask]",
                                 rich_help_panel="Executor"),
    scheduler_address: Optional[str] = typer.Option(  # noqa: UP045
        None, "--scheduler-address", help="Dask scheduler, e.g. tcp://HOST:8786 (with "
        "--executor dask; without it a local cluster of --jobs processes is started)",
        rich_help_panel="Executor"),
    progress: bool = typer.Option(True, "--progress/--no-progress",
                                  help="progress bar over cells", rich_help_panel="Output"),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="draw the figures when done",
                              rich_help_panel="Output"),
) -> None:
    """A grid of simulations, one summary row per cell; resumable (cells already in
    DIR/summary.csv, by config hash, are skipped)."""
    from experiments.answers.sweep import run_grid
    from reports.plots import plot_dir

    _engine_header(opts, lists)
    out, df = run_grid(opts, lists, jobs=jobs, executor=executor,
                       scheduler_address=scheduler_address, progress=progress, say=typer.echo)
    typer.echo(f"{len(df)} row(s) in {out}/summary.csv")
    warn_skipped_rows(df.to_dict("records"))
    warn_overload(df.to_dict("records"))
    if plot and len(df):
        paths = plot_dir(out, out / "figures", slo_ttft=opts.output.slo_ttft,
                         slo_tpot=opts.output.slo_tpot)
        typer.echo(f"{len(paths)} figure(s) in {out}/figures")


# -- compare --------------------------------------------------------------------------------------
@app.command(epilog=epilog("compare"))
@with_options(grid={"policy": COMPARED})
def compare(
    opts: RunOptions,
    lists: dict[str, str | None],
    baseline: Optional[str] = typer.Option(  # noqa: UP045
        None, "--baseline", help="policy the deltas are taken against [default: the first "
        "of --policies]", rich_help_panel="Grid"),
    progress: Optional[bool] = typer.Option(  # noqa: UP045
        None, "--progress/--no-progress", show_default="on a terminal",
        help="one progress bar over every policy's simulated requests",
        rich_help_panel="Output"),
) -> None:
    """Several policies on one workload: a table, the deltas against a baseline policy and a
    stacked bar of the breakdown."""
    from experiments.answers.compare import compare_policies, write_compare, write_deltas
    from reports.deltas import admission_notes, delta_table
    from reports.tables import breakdown_table, latency_table

    _engine_header(opts, lists)
    c = compare_policies(opts, lists["policy"], baseline,
                         sys.stderr.isatty() if progress is None else progress)
    con = console()
    con.print(breakdown_table(c.rows))
    con.print(latency_table(c.rows))
    if len(c.rows) >= 2:
        con.print(delta_table(c.rows, c.names, c.base))
        print_lines(con, admission_notes(c.rows, c.names, c.base))
        write_deltas(c)
    print_reuse(con, c.rows)
    print_slo(con, c.rows)
    warn_skipped_rows(c.rows)
    warn_overload(c.rows)
    paths = write_compare(opts, c)
    con.print(f"results: {c.out}/; figures: {', '.join(p.name for p in paths)}")


# -- plot / report --------------------------------------------------------------------------------
@app.command(epilog=epilog("plot"))
def plot(
    results: Path = typer.Argument(..., metavar="DIR", help="a results directory"),
    out: Optional[Path] = typer.Option(None, "--out", help="figure directory "  # noqa: UP045
                                       "[default: DIR/figures]"),
    slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", help="TTFT p99 target (s)"),  # noqa: UP045
    slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", help="TPOT p99 target (s)"),  # noqa: UP045
) -> None:
    """PNG figures from saved results (no re-simulation)."""
    from reports.plots import plot_dir
    from reports.results import results_dir

    paths = plot_dir(results_dir(results), out, slo_ttft=slo_ttft, slo_tpot=slo_tpot)
    for p in paths:
        typer.echo(str(p))


@app.command(epilog=epilog("report"))
def report(
    results: Path = typer.Argument(..., metavar="DIR", help="a results directory"),
    slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", help="TTFT p99 target (s)"),  # noqa: UP045
    slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", help="TPOT p99 target (s)"),  # noqa: UP045
) -> None:
    """A one-page Markdown + HTML report (figures embedded) from saved results."""
    from experiments.answers.recommend import page_size_sentence
    from reports.report import build_report
    from reports.results import results_dir

    md, html = build_report(results_dir(results), recommend=page_size_sentence,
                            slo_ttft=slo_ttft, slo_tpot=slo_tpot)
    typer.echo(f"{md}\n{html}")


@app.command()
def diff(
    run_a: Path = typer.Argument(..., metavar="RUN_A", help="a results directory (the base)"),
    run_b: Path = typer.Argument(..., metavar="RUN_B", help="a results directory (compared "
                                 "with RUN_A)"),
    out: Path = typer.Option(Path("kvsim-diff"), "--out", help="where diff.csv and the "
                             "overlaid figures go"),
    label_a: Optional[str] = typer.Option(None, "--label-a", help="name of RUN_A in tables "  # noqa: UP045
                                          "and figures [default: its directory name]"),
    label_b: Optional[str] = typer.Option(None, "--label-b", help="name of RUN_B "  # noqa: UP045
                                          "[default: its directory name]"),
) -> None:
    """Two saved runs or sweeps side by side: the metrics of each paired run (by the swept
    axes), B - A with better / worse, the option changes, diff.csv and figures overlaid."""
    from reports.diff import diff_view

    items, rows = diff_view(run_a, run_b, out, label_a, label_b)
    con = console()
    for item in items[:-1]:  # lines as they are, tables with their colours
        con.print(item, **({"markup": False, "highlight": False} if isinstance(item, str)
                           else {}))
    warn_overload(rows)
    con.print(items[-1], markup=False, highlight=False)


# -- listings -------------------------------------------------------------------------------------
@app.command()
def models() -> None:
    """Model presets, one line each (hybrids: their layer mix)."""
    from reports.listings import model_lines

    echo_lines(model_lines())


@app.command()
def gpus() -> None:
    """GPU presets, one line each."""
    from reports.listings import gpu_lines

    echo_lines(gpu_lines())


@app.command("workloads")
def workloads_cmd() -> None:
    """Built-in workloads and bundled traces, one line each."""
    from reports.listings import workload_lines

    echo_lines(workload_lines())


@app.command()
def policies() -> None:
    """KV allocation policies and when to pick each, one line each."""
    from reports.listings import policy_lines

    echo_lines(policy_lines())


@app.command()
def info() -> None:
    """Versions and devices."""
    import torch

    typer.echo(f"kvsim {kvcore.__version__}  torch {torch.__version__}  "
               f"cuda {'yes' if torch.cuda.is_available() else 'no'}")


# -- trace stats ----------------------------------------------------------------------------------
@trace_app.command("stats")
def trace_stats_cmd(
    file: str = typer.Argument(..., metavar="FILE", help="a trace file (or a built-in "
                               "workload name)"),
    page_size: int = typer.Option(1, "--page-size", help="page size for the ideal reuse"),
    format: str = typer.Option("auto", "--format", help="trace format"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows/--no-skip-bad-rows"),
    num_requests: Optional[int] = typer.Option(None, "--num-requests",  # noqa: UP045
                                               help="read only this many requests"),
    rate: Optional[float] = typer.Option(  # noqa: UP045
        None, "--rate", help="Poisson arrivals (req/s) for a trace without timestamps "
        "(ShareGPT lengths)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Lengths, rate, sessions and ideal prefix reuse of a trace."""
    from experiments.answers.trace_stats import file_stats

    s = file_stats(file, page_size, format=format, skip_bad_rows=skip_bad_rows,
                   num_requests=num_requests, rate=rate)
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
    from reports.tables import trace_stats_lines, trace_stats_table

    con = console()
    con.print(trace_stats_table(s))
    for line in trace_stats_lines(s):
        con.print(line)


# -- plan -----------------------------------------------------------------------------------------
@app.command(epilog=epilog("plan"))
@with_options(grid={"page_size": DEFAULT_PAGE_SIZES, "seed": None})
def plan(
    ctx: typer.Context,
    opts: RunOptions,
    lists: dict[str, str | None],
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
    context_len: Optional[int] = typer.Option(  # noqa: UP045
        None, "--context-len", help="context length of the page-table figure [default: "
        "--max-context-len, else the model's maximum]"),
    tolerance: float = typer.Option(0.02, "--tolerance", help="page-size recommendation: "
                                    "within this fraction of the best"),
    jobs: Optional[int] = typer.Option(  # noqa: UP045
        None, "--jobs", "-j", help="local worker processes",
        show_default="one per core; one for a small study"),
    find_rate: bool = typer.Option(False, "--find-rate", help="also search the highest "
                                   "sustainable rate (as kvsim capacity) at --page-size"),
    at_sustainable_rate: bool = typer.Option(
        False, "--at-sustainable-rate", help="search the highest sustainable rate first and "
        "run the page-size study at it (implies --find-rate)"),
    steps: int = typer.Option(4, "--steps", help="bisection steps of the rate search"),
    target_hit_rate: Optional[float] = typer.Option(  # noqa: UP045
        None, "--target-hit-rate", help="with --trace / --workload: the host KV tier needed "
        "for this total prefix hit rate (simulated search over host sizes)"),
    replicas_for_rate: Optional[float] = typer.Option(  # noqa: UP045
        None, "--replicas-for-rate", help="the fewest replicas behind --router that serve "
        "this rate (req/s) within the SLO (--slo-ttft-p90 ...): simulated search"),
    knee_routers: Optional[str] = typer.Option(  # noqa: UP045
        None, "--knee-routers", help="comma list of routers: the knee (highest sustainable "
        "rate, as kvsim capacity) of each on --replicas replicas"),
    progress: Optional[bool] = typer.Option(  # noqa: UP045
        None, "--progress/--no-progress", show_default="on a terminal, not with --json",
        help="progress bar of the page-size study (over simulated requests; over cells "
        "with --jobs > 1)", rich_help_panel="Output"),
) -> None:
    """Static memory plan; with --trace or --workload also simulate across page sizes and
    recommend one (never from an overloaded run); with --target-hit-rate, size the host KV
    tier instead."""
    if replicas_for_rate is not None or knee_routers is not None:
        from experiments.answers.fleet_plan import knee_per_router, probe_line
        from experiments.answers.fleet_plan import replicas_for_rate as for_rate
        from experiments.answers.runner import simulate_options

        bar = (not as_json and sys.stderr.isatty()) if progress is None else progress
        probe = None if as_json else (lambda p: typer.echo(probe_line(p), err=True))
        answers = []
        if replicas_for_rate is not None:
            answers.append(for_rate(opts, replicas_for_rate, on_probe=probe,
                                    simulate=lambda o: simulate_options(o, progress=bar)[0]))
        if knee_routers is not None:
            routers = parse_list(knee_routers, str, "--knee-routers") or []
            answers.append(knee_per_router(opts, routers, steps, on_probe=probe,
                                           simulate=lambda o: simulate_options(
                                               o, progress=bar)[0]))
        echo_lines([json.dumps([a.to_dict() for a in answers], indent=2, default=str)]
                   if as_json else [line for a in answers for line in a.lines()])
        return
    from experiments.answers.plan_modes import PlanRequest, make_plan

    study = from_user(ctx, "workload") or opts.workload.trace is not None
    bar = (not as_json and sys.stderr.isatty()) if progress is None else progress
    seeds = parse_list(lists["seed"], int, "--seeds")
    mine = {"context_len": context_len, "tolerance": tolerance, "page_sizes":
            lists["page_size"], "seeds": lists["seed"], "jobs": jobs, "find_rate": find_rate,
            "at_sustainable_rate": at_sustainable_rate, "steps": steps, "progress": progress}
    req = PlanRequest(context_len, tolerance, lists["page_size"],
                      None if seeds is None else tuple(seeds), jobs, find_rate,
                      at_sustainable_rate, steps, study, bar, target_hit_rate,
                      frozenset(n for n, v in mine.items() if v != PLAN_DEFAULTS[n]))
    on_probe = None if as_json else echo_probe
    announce = None if as_json else lambda m: typer.echo(m, err=True)
    _engine_header(opts, lists, err=as_json)
    if target_hit_rate is not None:
        from experiments.answers.host_sizing import plan_host_tier

        sizing = plan_host_tier(opts, req, on_probe, announce)
        if sizing.overloaded:
            warn_overload(list(sizing.rows))
        echo_lines([json.dumps(sizing.to_dict(), indent=2, default=str)] if as_json
                   else sizing.report_lines(opts.output.out))
        return
    answer = make_plan(opts, req, on_probe=on_probe, announce=announce)
    if answer.study is not None:
        warn_skipped_rows(list(answer.study.rows))
        if answer.study.recommendation.overloaded:
            warn_overload(list(answer.study.rows))
    if as_json:
        typer.echo(json.dumps(answer.to_dict(), indent=2, default=str))
        return
    from reports.plan_view import render_plan_all, render_recommendation

    con = console()
    con.print(render_plan_all(answer.plan))
    if answer.study is not None:
        con.print(render_recommendation(answer.study.recommendation))
    for line in answer.lines():
        con.print(line, markup=False, highlight=False)


# plan's own flags at their defaults (a flag away from it was given: PlanRequest.check)
PLAN_DEFAULTS = {"context_len": None, "tolerance": 0.02, "page_sizes": DEFAULT_PAGE_SIZES,
                 "seeds": None, "jobs": None, "find_rate": False, "at_sustainable_rate": False,
                 "steps": 4, "progress": None}


@app.command()
@with_options()
def capacity(
    opts: RunOptions,
    steps: int = typer.Option(4, "--steps", help="bisection steps after the bracket (each "
                              "halves the gap in log scale; 4: within 4.4 %)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    progress: Optional[bool] = typer.Option(  # noqa: UP045
        None, "--progress/--no-progress", show_default="on a terminal, not with --json",
        help="progress bar over each probe's requests", rich_help_panel="Output"),
) -> None:
    """The highest sustainable arrival rate for these options (model, GPU, pool, policy): a
    short bisection on --rate-scale (traces) or --rate, each probe one simulation judged by
    the overload rule (and the SLO, with --slo-ttft / --slo-tpot: goodput); reported as req/s
    and tokens/s."""
    from experiments.answers.capacity import check_steps, find_sustainable_rate
    from experiments.answers.runner import simulate_options
    from reports.overload_view import capacity_lines

    check_steps(steps)
    opts.sim_config()  # a user mistake before the first simulation
    _engine_header(opts, err=as_json)
    bar = (not as_json and sys.stderr.isatty()) if progress is None else progress
    cap = find_sustainable_rate(opts, steps=steps, on_probe=None if as_json else echo_probe,
                                simulate=lambda o: simulate_options(o, progress=bar)[0])
    if as_json:
        typer.echo(json.dumps(cap.to_dict(), indent=2, default=str))
        return
    typer.echo(capacity_lines(cap)[-1])


@app.command()
def calibrate(
    file: str = typer.Argument(..., metavar="FILE", help="vllm bench serve --save-result "
                               "JSON, sglang.bench_serving --output-file JSON lines, or a CSV "
                               "of batch_size, context_len, step_time_s"),
    out: str = typer.Option("kvsim-profile.toml", "--out", help="the profile file to write "
                            "(.toml or .json), for --latency-profile FILE"),
    model: str = typer.Option("llama-3.1-8b", "--model", help="the model measured"),
    gpu: str = typer.Option("h100", "--gpu", help="the GPU measured"),
    tp: int = typer.Option(1, "--tp", help="tensor-parallel degree measured"),
    kv_dtype: str = typer.Option("bf16", "--kv-dtype", help="KV cache dtype measured"),
    base: Optional[str] = typer.Option(  # noqa: UP045
        None, "--base-profile", help="profile whose constants the data cannot identify are "
        "kept [default: the file's engine's: vllm-hopper or sglang-hopper]"),
    backend: Optional[str] = typer.Option(  # noqa: UP045
        None, "--attention-backend", help="the attention backend measured [default: the "
        "base profile's]"),
    page_size: int = typer.Option(16, "--page-size", help="benchmark JSON: the engine's "
                                  "page (block) size"),
    chunk: int = typer.Option(8192, "--chunked-prefill-size", help="benchmark JSON: the "
                              "engine's prefill chunk (TTFT = its chunks)"),
) -> None:
    """Fit a latency profile (HBM and compute efficiency, per-iteration, per-request and page
    cost) to your own measurements; prints the constants and the fit error and writes a
    profile file that run / sweep / plan take with --latency-profile FILE."""
    from experiments.answers.calibrate import calibrate as fit_file
    from experiments.answers.calibrate import fit_lines

    fit = fit_file(file, out, model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype, base=base,
                   backend=backend, page_size=page_size, chunk=chunk)
    echo_lines([*fit_lines(fit), f"profile: {out} (use --latency-profile {out})"])


@app.command()
def validate(
    quick: bool = typer.Option(False, "--quick", help="a reduced run (about 30 s)"),
    out: Optional[Path] = typer.Option(  # noqa: UP045 (typer reads it)
        None, "--out", help="also write the Markdown report to this file (nothing is written "
        "without it)"),
) -> None:
    """kvsim next to the vLLM and SGLang papers' published numbers: prints the Markdown report
    (rows by kind: reproduced, analytic identity, closed-form cross-check) and the counts."""
    from experiments.validation import run_validation
    from reports import validation_report as vr

    df = run_validation(quick=quick, progress=True)
    typer.echo(vr.render_validation_markdown(df), nl=False)
    if out is not None:
        typer.echo(f"report: {vr.write_validation_report(df, out)}", err=True)
    typer.echo(vr.summary_line(df))


@app.command("cli-reference", hidden=True)
def cli_reference_cmd() -> None:
    """Print docs/cli.md (kvsim cli-reference > docs/cli.md)."""
    typer.echo(cli_reference(), nl=False)


def cli_reference() -> str:
    """docs/cli.md, whole: the template's prose, the commands' usages, the option tables."""
    from experiments.console.cli_reference import render
    from experiments.console.command_options import command_usages

    return render(command_usages(typer.main.get_command(app)))


def main() -> None:
    """Console entry point. Errors are turned into exit status 2 by KvsimGroup (so the same
    handling applies under a test runner); this wrapper adds Ctrl-C handling and the quick
    exit (experiments.console.console_out.freeze_heap_at_exit)."""
    freeze_heap_at_exit()
    try:
        app()
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
