"""kvsim command line (typer): a thin shell over experiments/ (running) and reports/ (showing).

The options of `run`, `sweep`, `compare` and `plan` are generated from
`experiments.options.OPTIONS`, the fields of the specs a run is composed of (names, defaults,
help and allowed values live there only, and each spec validates its own fields). `--config
exp.toml` (or a saved config.json) gives the same keys; flags on the command line win over the
file. User mistakes (ValueError / WorkloadError from any package, bad flags) exit with status 2
and one line on stderr; `kvsim --debug ...` shows the traceback instead.
"""

from __future__ import annotations

import inspect
import json
import sys
import typing
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperGroup

import kvcore
from experiments.config_file import options_from
from experiments.grid import AXIS_PARAMS, DEFAULT_PAGE_SIZES, SWEEP_AXES, cells, parse_list
from experiments.options import OPTIONS, RunOptions

_STATE = {"debug": False}
__all__ = ["SWEEP_AXES", "app", "main"]  # SWEEP_AXES: the sweep flags, for tests


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, code: int = 2) -> typing.NoReturn:
    typer.echo(f"kvsim: error: {_one_line(message)}", err=True)
    sys.exit(code)


class KvsimGroup(TyperGroup):
    """The root command: user mistakes become exit status 2 and one line on stderr.

    Parsing errors (unknown option, bad value) and ValueError from any package (kvcore,
    simulator, workloads' WorkloadError) are caught here, around the whole app, so a test
    runner sees the same behaviour as the shell; `kvsim --debug` re-raises instead.
    """

    def main(self, args=None, prog_name=None, complete_var=None,  # type: ignore[override]
             standalone_mode=True, **extra):
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except (ValueError, OSError) as e:  # OSError: a path the user gave, or a full disk
            if _STATE["debug"]:
                raise
            _fail(str(e))
        except Exception as e:
            if hasattr(e, "exit_code") and hasattr(e, "format_message"):  # a parse error
                ctx = getattr(e, "ctx", None)
                hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
                _fail(e.format_message() + hint, int(e.exit_code))
            raise
        if isinstance(rv, int) and not isinstance(rv, bool):
            sys.exit(rv)  # an explicit exit status (--help, --version, typer.Exit)
        return rv


app = typer.Typer(
    cls=KvsimGroup, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
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
    _STATE["debug"] = debug


# -- options generated from the specs' fields --------------------------------------------------
def _option_param(name: str) -> inspect.Parameter:
    o = OPTIONS[name]
    help_text = o.help
    allowed = o.allowed()
    if allowed:
        joined = ", ".join(allowed)
        help_text += f" [{joined}]" if len(joined) < 160 else f" [{len(allowed)} values]"
    # a boolean is a --x/--no-x pair
    decls = [f"{o.flag}/--no-{o.flag[2:]}"] if o.type is bool else [o.flag, *o.flags]
    option = typer.Option(o.default, *decls, help=help_text, rich_help_panel=o.panel,
                          show_default=o.default is not None)
    annotation = Optional[o.type] if o.default is None else o.type  # noqa: UP045 (typer reads it)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=annotation)


def _config_param() -> inspect.Parameter:
    return inspect.Parameter(
        "config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],  # noqa: UP045
        default=typer.Option(None, "--config", help="experiment file (TOML with the option "
                             "names as keys, or a saved config.json); flags override it",
                             rich_help_panel="Output"))


def with_options(*, skip: tuple[str, ...] = ()) -> Callable:
    """Give a command every option (minus `skip` and its own parameters) and `--config`; the
    command receives the merged `opts: RunOptions` (and `file_extras`, the config file's values
    for its own parameters, if it asks for them)."""

    def deco(fn: Callable) -> Callable:
        hints = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in sig.parameters.values() if p.name not in ("opts", "file_extras", "ctx")]
        own_names = {p.name for p in own}
        gen = [_option_param(name) for name in OPTIONS
               if name not in own_names and name not in skip]
        ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                      annotation=typer.Context)
        params = [ctx_param, *own, *gen, _config_param()]

        def wrapper(ctx: typer.Context, **kwargs: Any) -> Any:
            config = kwargs.pop("config", None)
            given = {k: v for k, v in kwargs.items()
                     if k in OPTIONS and k not in own_names and _from_user(ctx, k)}
            opts, extras = options_from(config, given, own_names)
            call = {k: v for k, v in kwargs.items() if k in own_names}
            for k, v in extras.items():  # the file's values for the command's own options
                target = k if k in own_names else AXIS_PARAMS.get(k)
                if target not in own_names:
                    raise ValueError(f"--config: {k!r} is a list; only kvsim sweep takes "
                                     f"lists (of {', '.join(SWEEP_AXES)})")
                if not _from_user(ctx, target):
                    call[target] = ",".join(str(x) for x in v) if isinstance(v, list) else v
            if "file_extras" in sig.parameters:
                call["file_extras"] = extras
            if "ctx" in sig.parameters:
                call["ctx"] = ctx
            return fn(opts=opts, **call)

        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        wrapper.__name__ = fn.__name__
        wrapper.__doc__ = fn.__doc__
        return wrapper

    return deco


def _from_user(ctx: typer.Context, name: str) -> bool:
    """True when option `name` was typed on the command line (or came from the environment),
    not left at its default: only such values override the --config file."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _console():
    from rich.console import Console

    return Console()


# -- run ------------------------------------------------------------------------------------------
@app.command()
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
    if progress is None:  # long runs show a bar when someone is watching
        progress = sys.stderr.isatty()
    from experiments.runner import config_document, simulate_options
    from reports.events import EventCollector
    from reports.results import write_run
    from reports.tables import breakdown_table, latency_table, run_header

    if events is not None and (not str(events).strip() or events.is_dir()):
        raise ValueError(f"--events {str(events)!r}: give a file name (not a directory)")
    sink = EventCollector() if events is not None else None
    row, result = simulate_options(opts, progress=progress, event_sink=sink)
    con = _console()
    con.print(run_header(row))
    con.print(breakdown_table([row]))
    con.print(latency_table([row]))
    if sink is not None:
        sink.write(events, result.timeline, result.requests)
        con.print(f"events: {events} (open in ui.perfetto.dev)")
    out = opts.output.out
    if out:
        from reports.plots import plot_dir

        write_run(out, [row], [result], config_document("run", opts))
        figures = plot_dir(Path(out))
        con.print(f"results: {out}/ (summary.csv, requests.parquet, timeline.parquet, "
                  f"config.json, {len(figures)} figures)")


# -- sweep ----------------------------------------------------------------------------------------
@app.command()
@with_options()
def sweep(
    opts: RunOptions,
    page_sizes: Optional[str] = typer.Option(  # noqa: UP045
        None, "--page-sizes", help=f"page sizes, comma list or a..b powers of two "
        f"[default: {DEFAULT_PAGE_SIZES}]", rich_help_panel="Grid"),
    policies: Optional[str] = typer.Option(None, "--policies",  # noqa: UP045
                                           help="policies, comma list [default: --policy]",
                                           rich_help_panel="Grid"),
    placements: Optional[str] = typer.Option(None, "--placements",  # noqa: UP045
                                             help="placements [default: --placement]",
                                             rich_help_panel="Grid"),
    rates: Optional[str] = typer.Option(None, "--rates", help="request rates [default: "  # noqa: UP045
                                        "--rate]", rich_help_panel="Grid"),
    kv_tokens: Optional[str] = typer.Option(None, "--kv-tokens", help="KV pool sizes in "  # noqa: UP045
                                            "slots, comma list", rich_help_panel="Grid"),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="seeds [default: --seed]",  # noqa: UP045
                                        rich_help_panel="Grid"),
    workloads: Optional[str] = typer.Option(None, "--workloads",  # noqa: UP045
                                            help="workloads [default: --workload]",
                                            rich_help_panel="Grid"),
    hicache_ratios: Optional[str] = typer.Option(  # noqa: UP045
        None, "--hicache-ratios", help="host KV tier sizes as multiples of the device pool, "
        "comma list (0: none) [default: --hicache-ratio]", rich_help_panel="Grid"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="worker processes (local pool, or the "
                             "local Dask cluster)", rich_help_panel="Grid"),
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
    from experiments.executors import check_jobs, make_executor
    from experiments.runner import CELL_PRELOAD, run_cell

    out = Path(opts.output.out or "kvsim-sweep")
    check_jobs(jobs)
    runner = make_executor(executor, run_cell, scheduler_address, preload=CELL_PRELOAD)
    runner.warm_up(jobs)  # local workers start importing now, while this process sets up

    from experiments.grid import sweep_axes
    from experiments.runner import config_document, run_sweep
    from reports.plots import plot_dir
    from reports.results import write_config

    axes = sweep_axes({"page_size": DEFAULT_PAGE_SIZES if page_sizes is None else page_sizes,
                       "policy": policies, "placement": placements, "rate": rates,
                       "kv_tokens": kv_tokens, "seed": seeds, "workload": workloads,
                       "hicache_ratio": hicache_ratios})
    grid = cells(opts, axes)
    for c in grid:  # every user mistake (a model that does not fit...) before the first cell
        c.sim_config()
    write_config(out, config_document("sweep", opts, axes=axes))
    df = run_sweep(grid, out, jobs=jobs, progress=progress, executor=runner,
                   announce=lambda todo, done: typer.echo(
                       f"{len(grid)} cell(s): {todo} to run, {done} already in "
                       f"{out}/summary.csv"))
    typer.echo(f"{len(df)} row(s) in {out}/summary.csv")
    if plot and len(df):
        paths = plot_dir(out, out / "figures", slo_ttft=opts.output.slo_ttft,
                         slo_tpot=opts.output.slo_tpot)
        typer.echo(f"{len(paths)} figure(s) in {out}/figures")


# -- compare --------------------------------------------------------------------------------------
@app.command()
@with_options()
def compare(
    opts: RunOptions,
    policies: str = typer.Option("paged,paged-nocache,vllm,contiguous-max,contiguous-pow2,"
                                 "contiguous-oracle", "--policies",
                                 help="policies to compare, comma list"),
) -> None:
    """Several policies on one workload: a table and a stacked bar of the breakdown."""
    from experiments.runner import config_document, simulate_options
    from reports.plots import plot_results
    from reports.results import write_run
    from reports.tables import breakdown_table, latency_table

    names = parse_list(policies, str, "--policies") or []
    runs = cells(opts, {"policy": names})
    for r in runs:  # every user mistake before the first simulation
        r.sim_config()
    rows, results = [], []
    for r in runs:
        row, res = simulate_options(r)
        rows.append(row)
        results.append(res)
    con = _console()
    con.print(breakdown_table(rows))
    con.print(latency_table(rows))
    out = Path(opts.output.out or "kvsim-compare")
    write_run(out, rows, results, config_document("compare", opts, axes={"policy": names}))
    import pandas as pd

    paths = plot_results(pd.DataFrame(rows), out / "figures",
                         requests=pd.read_parquet(out / "requests.parquet"),
                         timeline=pd.read_parquet(out / "timeline.parquet"))
    con.print(f"results: {out}/; figures: {', '.join(p.name for p in paths)}")


# -- plot / report --------------------------------------------------------------------------------
def _results_dir(d: Path) -> Path:
    if not d.is_dir():
        raise ValueError(f"DIR {str(d)!r} is not a directory (give the --out directory of kvsim "
                         "run / sweep / compare)")
    return d


@app.command()
def plot(
    results: Path = typer.Argument(..., metavar="DIR", help="a results directory"),
    out: Optional[Path] = typer.Option(None, "--out", help="figure directory "  # noqa: UP045
                                       "[default: DIR/figures]"),
    slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", help="TTFT p99 target (s)"),  # noqa: UP045
    slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", help="TPOT p99 target (s)"),  # noqa: UP045
) -> None:
    """PNG figures from saved results (no re-simulation)."""
    from reports.plots import plot_dir

    paths = plot_dir(_results_dir(results), out, slo_ttft=slo_ttft, slo_tpot=slo_tpot)
    for p in paths:
        typer.echo(str(p))


@app.command()
def report(
    results: Path = typer.Argument(..., metavar="DIR", help="a results directory"),
    slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", help="TTFT p99 target (s)"),  # noqa: UP045
    slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", help="TPOT p99 target (s)"),  # noqa: UP045
) -> None:
    """A one-page Markdown + HTML report (figures embedded) from saved results."""
    from reports.report import build_report

    md, html = build_report(_results_dir(results), slo_ttft=slo_ttft, slo_tpot=slo_tpot)
    typer.echo(f"{md}\n{html}")


# -- listings -------------------------------------------------------------------------------------
@app.command()
def models() -> None:
    """Model presets, one line each."""
    from kvcore.presets import MODELS

    for m in MODELS.values():
        extra = " MLA" if m.is_mla else ""
        extra += f" MoE {m.num_experts}x" if m.is_moe else ""
        typer.echo(f"{m.id:<14} {m.num_params / 1e9:7.1f}B  {m.num_layers:3d} layers  "
                   f"{m.num_kv_heads:3d} KV heads x {m.head_dim}  "
                   f"{m.kv_bytes_per_token():>9,} B/token KV  max ctx {m.max_position:,}"
                   f"{extra}")


@app.command()
def gpus() -> None:
    """GPU presets, one line each."""
    from kvcore.presets import GPUS

    for g in GPUS.values():
        typer.echo(f"{g.id:<10} {g.name:<18} {g.mem_gb:5.0f} GB  {g.bandwidth_tb_s:5.2f} TB/s  "
                   f"{g.bf16_tflops:6.0f} TFLOPS bf16")


@app.command("workloads")
def workloads_cmd() -> None:
    """Built-in workloads and bundled traces, one line each."""
    from workloads import list_workloads

    for name, desc in list_workloads().items():
        typer.echo(f"{name:<18} {desc}")


@app.command()
def policies() -> None:
    """KV allocation policies and when to pick each, one line each."""
    from kvcore.policies import policy_help
    from kvcore.policies.placement import placement_names

    for name, when in policy_help().items():
        typer.echo(f"{name:<18} {when}")
    typer.echo(f"(placements for contiguous-*: {', '.join(placement_names())})")


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
    from simulator.specs import PolicySpec
    from workloads import WorkloadSpec, build_workload, list_workloads, trace_stats

    PolicySpec(page_size=page_size)  # the page size's domain, checked where it is defined
    given = WorkloadSpec(format=format, skip_bad_rows=skip_bad_rows,  # checks the values
                         num_requests=num_requests, rate=rate)
    if not Path(file).exists() and file in list_workloads():
        spec = WorkloadSpec(name=file, num_requests=num_requests)
    else:
        if not Path(file).is_file():
            raise ValueError(f"FILE {file!r}: no such file (or built-in workload: "
                             f"{', '.join(list_workloads())})")
        spec = replace(given, trace=file)
    s = trace_stats(build_workload(spec), page_size)
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
    from reports.tables import trace_stats_lines, trace_stats_table

    con = _console()
    con.print(trace_stats_table(s))
    for line in trace_stats_lines(s):
        con.print(line)


# -- plan -----------------------------------------------------------------------------------------
def _plan_host_tier(ctx: typer.Context, opts: RunOptions, target: float, as_json: bool) -> None:
    """`plan --target-hit-rate`: the host tier search (experiments/host_sizing.py)."""
    from experiments.host_sizing import size_host_tier

    if not (_from_user(ctx, "workload") or opts.workload.trace is not None):
        raise ValueError(f"--target-hit-rate {target} needs --trace or --workload to simulate")
    res = size_host_tier(opts, target)
    if as_json:
        typer.echo(json.dumps(res.to_dict(), indent=2))
        return
    typer.echo(f"ideal reuse of the workload: {res.ideal_reuse:.4f}; target {target:.4f}")
    typer.echo("host tier (x pool) | host GiB/rank | hit rate | host hit | TTFT p50 (s)")
    for s in res.steps:
        typer.echo(f"{s.ratio:18.3g} | {s.host_gib:13.2f} | {s.prefix_hit_rate:8.4f} | "
                   f"{s.host_hit_rate:8.4f} | {s.ttft_p50_s:.3f}")
    if res.needed is None:
        typer.echo("not reached even with an unbounded host tier")
    else:
        typer.echo(f"host memory needed: {res.needed.host_gib:.2f} GiB per rank "
                   f"(--hicache-ratio {res.needed.ratio:g})")


@app.command()
@with_options()
def plan(
    ctx: typer.Context,
    opts: RunOptions,
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
    context_len: Optional[int] = typer.Option(  # noqa: UP045
        None, "--context-len", help="context length of the page-table figure [default: "
        "--max-context-len, else the model's maximum]"),
    tolerance: float = typer.Option(0.02, "--tolerance", help="page-size recommendation: "
                                    "within this fraction of the best"),
    page_sizes: str = typer.Option(DEFAULT_PAGE_SIZES, "--page-sizes",
                                   help="page sizes simulated with --trace / --workload"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="local worker processes"),
    target_hit_rate: Optional[float] = typer.Option(  # noqa: UP045
        None, "--target-hit-rate", help="with --trace / --workload: the host KV tier needed "
        "for this total prefix hit rate (simulated search over host sizes)"),
) -> None:
    """Static memory plan; with --trace or --workload also simulate across page sizes and
    recommend one (or, with --target-hit-rate, size the host KV tier)."""
    if target_hit_rate is not None:
        _plan_host_tier(ctx, opts, target_hit_rate, as_json)
        return
    from experiments.executors import check_jobs
    from experiments.planning import page_size_grid, page_size_study, static_plan
    from reports.plan_view import render_plan_all, render_recommendation
    from reports.recommend import check_tolerance, recommend_page_size

    check_jobs(jobs)
    if context_len is not None and not 1 <= context_len <= 1 << 24:
        raise ValueError(f"--context-len must be in [1, 16,777,216], got {context_len}")
    check_tolerance(tolerance)
    sizes = parse_list(page_sizes, int, "--page-sizes") or []
    page_size_grid(opts, sizes)  # a bad page size is an error even for the static plan
    result = static_plan(opts, context_len)
    rec = None
    if _from_user(ctx, "workload") or opts.workload.trace is not None:
        from reports.plots import plot_dir

        out, df = page_size_study(opts, sizes, jobs=jobs, progress=not as_json)
        rec = recommend_page_size(df, tolerance)
        figs = plot_dir(out, out / "figures")
    if as_json:
        doc = result.to_dict()
        if rec is not None:
            doc["recommendation"] = rec.to_dict()
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    con = _console()
    con.print(render_plan_all(result))
    if rec is not None:
        con.print(render_recommendation(rec))
        con.print(f"figures: {', '.join(str(p) for p in figs)}")


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
    from reports.validation_report import (
        render_validation_markdown,
        summary_line,
        write_validation_report,
    )

    df = run_validation(quick=quick, progress=True)
    typer.echo(render_validation_markdown(df), nl=False)
    if out is not None:
        typer.echo(f"report: {write_validation_report(df, out)}", err=True)
    typer.echo(summary_line(df))


def main() -> None:
    """Console entry point. Errors are turned into exit status 2 by KvsimGroup (so the same
    handling applies under a test runner); this wrapper only adds Ctrl-C handling."""
    try:
        app()
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
