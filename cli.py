"""kvsim command line (typer): a thin shell over experiments/ (running) and reports/ (showing).

The options of `run`, `sweep`, `compare` and `plan` are generated from
`experiments.options.OPTIONS`, the fields of the specs a run is composed of (names, defaults,
help and allowed values live there only, and each spec validates its own fields). `--config
exp.toml` (or a saved config.json) gives the same keys; flags on the command line win over the
file. User mistakes (ValueError / WorkloadError from any package, bad flags) exit with status 2
and one line on stderr; a bug the simulator caught in itself (a broken invariant, a livelock)
exits with status 3 and one line saying so; `kvsim --debug ...` shows the traceback instead.
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
from experiments.options import IMPLIED, OPTIONS, RunOptions
from kvcore.validation import InvariantError
from simulator.guard import LivelockError

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
        except (InvariantError, LivelockError) as e:  # a bug in kvsim, not the user's input
            if _STATE["debug"]:
                raise
            _fail(f"internal error ({type(e).__name__}; a kvsim bug, please report it with the "
                  f"command; --debug shows the traceback): {e}", 3)
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
    cls=KvsimGroup, add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
    help="KV-cache simulator and planner: which page size, which allocator policy, how much "
         "memory, for your traffic.",
)
trace_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Trace files.")
app.add_typer(trace_app, name="trace")


def _examples(*lines: str) -> str:
    """A command's `--help` epilog: its examples as a Markdown code block."""
    return "\n\n".join(["Examples:", *(f"  {line}" for line in lines)])


EXAMPLES = {
    "run": _examples(
        "kvsim run --workload kshot --policy vllm --block-size 16",
        "kvsim run --trace conv.jsonl --model-config ./Llama-3.1-8B --tp 2 --out out/run",
        "kvsim run --workload chat --gpu-memory-utilization 0.9 --max-num-seqs 128"),
    "sweep": _examples(
        "kvsim sweep --workload chat --page-sizes 1..256 --policies paged,vllm --jobs 2 "
        "--out out/sweep",
        "kvsim sweep --workload sharegpt --rates 1,2,4,8 --slo-ttft 1 --out out/rates",
        "kvsim report out/sweep"),
    "compare": _examples(
        "kvsim compare --workload kshot --policies paged,vllm,contiguous-pow2",
        "kvsim compare --workload mooncake-conv --num-requests 500 --mem-fraction-static 0.85 "
        "--out out/cmp"),
    "plan": _examples(
        "kvsim plan --model llama-3.1-70b --gpu h100 --tp 4 --budget vllm",
        "kvsim plan --model-config ./Llama-3.1-8B --gpu-memory-utilization 0.9 --json",
        "kvsim plan --workload chat --num-requests 300 --page-sizes 1..128 --out out/plan"),
    "plot": _examples("kvsim plot out/sweep --slo-ttft 1"),
    "report": _examples("kvsim report out/sweep    # out/sweep/report.md and report.html"),
}


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
    # a boolean is a --x/--no-x pair; a spelling that implies other options is its own
    # parameter (the command must know which spelling was typed)
    plain = [f for f in o.flags if f.lstrip("-").replace("-", "_") not in IMPLIED]
    decls = [f"{o.flag}/--no-{o.flag[2:]}"] if o.type is bool else [o.flag, *plain]
    option = typer.Option(o.default, *decls, help=help_text, rich_help_panel=o.panel,
                          show_default=o.default is not None)
    annotation = Optional[o.type] if o.default is None else o.type  # noqa: UP045 (typer reads it)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=annotation)


def _implied_params(name: str) -> list[inspect.Parameter]:
    """One parameter per engine spelling of option `name` that implies other options
    (`--gpu-memory-utilization`: `--mem-fraction` with `--budget vllm`)."""
    o = OPTIONS[name]
    out = []
    for f in o.flags:
        key = f.lstrip("-").replace("-", "_")
        if key not in IMPLIED:
            continue
        also = " ".join(f"{OPTIONS[k].flag} {v}" for k, v in IMPLIED[key].items())
        option = typer.Option(None, f, help=f"{o.flag} with {also}", rich_help_panel=o.panel)
        out.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=option,
                                     annotation=Optional[o.type]))  # noqa: UP045
    return out


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
        gen = [p for name in OPTIONS if name not in own_names and name not in skip
               for p in (_option_param(name), *_implied_params(name))]
        ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                      annotation=typer.Context)
        params = [ctx_param, *own, *gen, _config_param()]

        def wrapper(ctx: typer.Context, **kwargs: Any) -> Any:
            config = kwargs.pop("config", None)
            given = {k: v for k, v in kwargs.items()
                     if (k in OPTIONS or k in IMPLIED) and k not in own_names
                     and _from_user(ctx, k)}
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


def _warn_overload(rows: list[dict[str, Any]]) -> None:
    """The one-line overload warning (reports.overload_view), on stderr so --json stays JSON."""
    from reports.overload_view import overload_warning

    line = overload_warning(rows)
    if line is not None:
        typer.echo(line, err=True)


# -- run ------------------------------------------------------------------------------------------
@app.command(epilog=EXAMPLES["run"])
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
    from reports.io import check_writable
    from reports.results import write_run
    from reports.tables import breakdown_table, latency_table, run_header

    if events is not None and (not str(events).strip() or events.is_dir()):
        raise ValueError(f"--events {str(events)!r}: give a file name (not a directory)")
    if opts.output.out:
        check_writable(opts.output.out)
    sink = EventCollector() if events is not None else None
    from reports.schema import REQUESTS_FILE

    out = opts.output.out  # rows streamed there as requests finish (a day in bounded memory)
    row, result = simulate_options(opts, progress=progress, event_sink=sink,
                                   requests_file=Path(out) / REQUESTS_FILE if out else None)
    con = _console()
    con.print(run_header(row))
    con.print(breakdown_table([row]))
    con.print(latency_table([row]))
    _print_reuse(con, [row])
    _warn_overload([row])
    if sink is not None:
        sink.write(events, result.timeline, result.requests)
        con.print(f"events: {events} (open in ui.perfetto.dev)")
    if out:
        from reports.plots import plot_dir

        write_run(out, [row], [result], config_document("run", opts))
        figures = plot_dir(Path(out))
        con.print(f"results: {out}/ (summary.csv, requests.parquet, timeline.parquet, "
                  f"config.json, {len(figures)} figures)")


# -- sweep ----------------------------------------------------------------------------------------
@app.command(epilog=EXAMPLES["sweep"])
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
    from experiments.executors import check_jobs, make_executor
    from experiments.runner import CELL_PRELOAD, run_cell
    from reports.io import check_writable

    out = Path(opts.output.out or "kvsim-sweep")
    jobs = check_jobs(jobs)  # no --jobs: AUTO, decided by run_sweep once the workload is built
    check_writable(out)
    runner = make_executor(executor, run_cell, scheduler_address, preload=CELL_PRELOAD)
    if jobs > 1:
        runner.warm_up(jobs)  # local workers start importing now, while this process sets up

    from experiments.grid import page_sizes_for, sweep_axes
    from experiments.runner import config_document, run_sweep
    from reports.plots import plot_dir
    from reports.results import write_config

    page_sizes, notes = page_sizes_for(opts, page_sizes)
    for note in notes:
        typer.echo(note)
    axes = sweep_axes({"page_size": page_sizes,
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
    _warn_overload(df.to_dict("records"))
    if plot and len(df):
        paths = plot_dir(out, out / "figures", slo_ttft=opts.output.slo_ttft,
                         slo_tpot=opts.output.slo_tpot)
        typer.echo(f"{len(paths)} figure(s) in {out}/figures")


# -- compare --------------------------------------------------------------------------------------
@app.command(epilog=EXAMPLES["compare"])
@with_options()
def compare(
    opts: RunOptions,
    policies: str = typer.Option("paged,paged-nocache,vllm,contiguous-max,contiguous-pow2,"
                                 "contiguous-oracle", "--policies",
                                 help="policies to compare, comma list", rich_help_panel="Grid"),
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
    from experiments.progress import RequestBar
    from experiments.runner import config_document, simulate_options
    from reports.deltas import baseline_index
    from reports.io import check_writable
    from reports.plots import plot_results
    from reports.results import write_run
    from reports.tables import breakdown_table, latency_table

    names = parse_list(policies, str, "--policies") or []
    base = baseline_index(names, baseline)
    runs = cells(opts, {"policy": names})
    for r in runs:  # every user mistake before the first simulation
        r.sim_config()
    out = Path(opts.output.out or "kvsim-compare")
    check_writable(out)
    rows, results = [], []
    bar = RequestBar(len(runs), enabled=sys.stderr.isatty() if progress is None else progress,
                     desc="compare")
    try:
        for r in runs:
            row, res = simulate_options(r, progress=bar)
            rows.append(row)
            results.append(res)
    finally:
        bar.close()
    con = _console()
    con.print(breakdown_table(rows))
    con.print(latency_table(rows))
    _print_deltas(con, rows, names, base, out)
    _print_reuse(con, rows)
    _warn_overload(rows)
    write_run(out, rows, results, config_document("compare", opts, axes={"policy": names}))
    import pandas as pd

    paths = plot_results(pd.DataFrame(rows), out / "figures",
                         requests=pd.read_parquet(out / "requests.parquet"),
                         timeline=pd.read_parquet(out / "timeline.parquet"),
                         axes={"policy": names})
    con.print(f"results: {out}/; figures: {', '.join(p.name for p in paths)}")


def _print_reuse(con, rows: list[dict[str, Any]]) -> None:
    """The hit rate next to the ideal and where the gap went (reports.reuse_view)."""
    from reports.reuse_view import reuse_lines

    for line in reuse_lines(rows, [str(r.get("policy", "")) for r in rows]):
        con.print(line, markup=False, highlight=False)


def _print_deltas(con, rows: list[dict[str, Any]], names: list[str], base: int,
                  out: Path) -> None:
    """compare: the deltas table on the terminal, and as out/deltas.csv."""
    import pandas as pd

    from reports.deltas import admission_notes, delta_records, delta_table
    from reports.io import write_csv_atomic

    if len(rows) < 2:
        return
    con.print(delta_table(rows, names, base))
    for line in admission_notes(rows, names, base):
        con.print(line, markup=False, highlight=False)
    write_csv_atomic(out / "deltas.csv", pd.DataFrame(delta_records(rows, names, base)))


# -- plot / report --------------------------------------------------------------------------------
def _results_dir(d: Path) -> Path:
    if not d.is_dir():
        raise ValueError(f"DIR {str(d)!r} is not a directory (give the --out directory of kvsim "
                         "run / sweep / compare)")
    return d


@app.command(epilog=EXAMPLES["plot"])
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


@app.command(epilog=EXAMPLES["report"])
def report(
    results: Path = typer.Argument(..., metavar="DIR", help="a results directory"),
    slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", help="TTFT p99 target (s)"),  # noqa: UP045
    slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", help="TPOT p99 target (s)"),  # noqa: UP045
) -> None:
    """A one-page Markdown + HTML report (figures embedded) from saved results."""
    from reports.report import build_report

    md, html = build_report(_results_dir(results), slo_ttft=slo_ttft, slo_tpot=slo_tpot)
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
    from reports.deltas import delta_table
    from reports.diff import load_side, option_changes, pair_label, side_rows, write_diff

    la = label_a or run_a.resolve().name
    lb = label_b or run_b.resolve().name
    if la == lb:
        la, lb = f"A:{la}", f"B:{lb}"
    a = load_side(run_a, la, "RUN_A")
    b = load_side(run_b, lb, "RUN_B")
    pairs, keys, figs = write_diff(a, b, out)
    con = _console()
    changes = option_changes(a, b)
    con.print(f"{la} -> {lb}: " + ("; ".join(changes) if changes else "same options"),
              markup=False, highlight=False)
    for (_, pr), ra, rb in zip(pairs.iterrows(), side_rows(pairs, "_a"),
                               side_rows(pairs, "_b"), strict=True):
        con.print(delta_table([ra, rb], [la, lb], 0, title=pair_label(pr, keys)))
    unpaired = len(a.summary) + len(b.summary) - 2 * len(pairs)
    if unpaired > 0:
        con.print(f"{unpaired} row(s) without a partner left out", markup=False)
    _warn_overload([*side_rows(pairs, "_a"), *side_rows(pairs, "_b")])
    con.print(f"diff: {out}/diff.csv; figures: {', '.join(p.name for p in figs)}",
              markup=False, highlight=False)


# -- listings -------------------------------------------------------------------------------------
@app.command()
def models() -> None:
    """Model presets, one line each (hybrids: their layer mix)."""
    from kvcore.hybrid_presets import LAYOUTS
    from kvcore.presets import MODELS

    for m in MODELS.values():
        extra = " MLA" if m.is_mla else ""
        extra += f" MoE {m.num_experts}x" if m.is_moe else ""
        extra += f"  [{LAYOUTS[m.id].mix}]" if m.id in LAYOUTS else ""
        typer.echo(f"{m.id:<19} {m.num_params / 1e9:7.1f}B  {m.num_layers:3d} layers  "
                   f"{m.num_kv_heads:3d} KV heads x {m.head_dim}  "
                   f"{m.kv_bytes_per_token():>9,} B/token KV  max ctx {m.max_position:,}"
                   f"{extra}")


@app.command()
def gpus() -> None:
    """GPU presets, one line each."""
    from kvcore.presets import GPUS

    for g in GPUS.values():
        typer.echo(f"{g.id:<10} {g.name:<18} {g.mem_gb:5.0f} GB ({g.mem_gib:6.2f} GiB to CUDA)  "
                   f"{g.bandwidth_tb_s:5.2f} TB/s  "
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
    if opts.output.out:
        from reports.io import check_writable

        check_writable(opts.output.out)
    res = size_host_tier(opts, target)
    if opts.output.out:  # every probe's summary row, as a sweep writes them
        import pandas as pd

        from reports.io import write_csv_atomic

        out = Path(opts.output.out)
        out.mkdir(parents=True, exist_ok=True)
        write_csv_atomic(out / "summary.csv", pd.DataFrame(list(res.rows)))
    if res.overloaded:
        _warn_overload(list(res.rows))
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
    for line in res.notes():
        typer.echo(f"note: {line}")
    if opts.output.out:
        typer.echo(f"results: {opts.output.out}/summary.csv")


@app.command(epilog=EXAMPLES["plan"])
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
    seeds: int = typer.Option(1, "--seeds", help="seeds per page size (from --seed): with "
                              "2 or more the recommendation measures its noise band"),
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
    progress: Optional[bool] = typer.Option(  # noqa: UP045
        None, "--progress/--no-progress", show_default="on a terminal, not with --json",
        help="progress bar of the page-size study (over simulated requests; over cells "
        "with --jobs > 1)", rich_help_panel="Output"),
) -> None:
    """Static memory plan; with --trace or --workload also simulate across page sizes and
    recommend one (never from an overloaded run); with --target-hit-rate, size the host KV
    tier instead."""
    if target_hit_rate is not None:
        _plan_host_tier(ctx, opts, target_hit_rate, as_json)
        return
    from experiments.capacity import check_steps
    from experiments.executors import check_jobs
    from experiments.grid import page_sizes_for
    from experiments.planning import page_size_grid, static_plan
    from reports.recommend import check_tolerance

    jobs = check_jobs(jobs)
    check_steps(steps)
    if context_len is not None and not 1 <= context_len <= 1 << 24:
        raise ValueError(f"--context-len must be in [1, 16,777,216], got {context_len}")
    check_tolerance(tolerance)
    page_sizes, size_notes = page_sizes_for(opts, page_sizes)
    sizes = parse_list(page_sizes, int, "--page-sizes") or []
    page_size_grid(opts, sizes)  # a bad page size is an error even for the static plan
    study = _from_user(ctx, "workload") or opts.workload.trace is not None
    result = static_plan(opts, context_len, with_workload=study)
    doc: dict[str, Any] = result.to_dict()
    lines: list[str] = list(size_notes) if study else []
    if find_rate or at_sustainable_rate:
        opts = _plan_capacity(opts, doc, lines, steps, at_sustainable_rate and study, as_json)
    rec = None
    if study:
        bar = (not as_json and sys.stderr.isatty()) if progress is None else progress
        if not 1 <= seeds <= 64:
            raise ValueError(f"--seeds must be in [1, 64], got {seeds}")
        rec = _plan_study(opts, sizes, tolerance, jobs, bar, doc, lines, seeds)
    if as_json:
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    from reports.plan_view import render_plan_all, render_recommendation

    con = _console()
    con.print(render_plan_all(result))
    if rec is not None:
        con.print(render_recommendation(rec))
    for line in lines:
        con.print(line, markup=False, highlight=False)


def _plan_capacity(opts: RunOptions, doc: dict[str, Any], lines: list[str], steps: int,
                   use_it: bool, quiet: bool) -> RunOptions:
    """plan --find-rate / --at-sustainable-rate: the capacity search; the options to study
    (at the sustainable rate when `use_it` and one was found)."""
    from experiments.capacity import find_sustainable_rate, scaled
    from reports.overload_view import capacity_lines

    if not quiet:
        typer.echo("searching the highest sustainable rate ...", err=True)
    opts.sim_config()
    cap = find_sustainable_rate(opts, steps=steps, on_probe=None if quiet else _echo_probe)
    doc["capacity"] = cap.to_dict()
    lines.append(capacity_lines(cap)[-1])
    if not use_it:
        return opts
    if cap.flag_value is None:
        lines.append("no sustainable rate found: the study runs at the requested rate")
        return opts
    start = cap.probes[0]
    lines.append(f"the page-size study ran at {cap.flag} {cap.flag_value:.4g} "
                 f"({cap.rate_req_s:.4g} req/s), the highest sustainable rate found, instead of "
                 f"{start.flag_value:.4g} ({start.rate_req_s:.4g} req/s)")
    doc["study_rate"] = {"flag": cap.flag, "value": cap.flag_value,
                         "rate_req_s": cap.rate_req_s}
    return scaled(opts, cap.flag, cap.flag_value)


def _plan_study(opts: RunOptions, sizes: list[int], tolerance: float, jobs: int,
                progress: bool, doc: dict[str, Any], lines: list[str], seeds: int = 1):
    """plan --trace / --workload: the page-size study and its recommendation (None from an
    overloaded run: the lines say so and at which rate it ran)."""
    from experiments.planning import page_size_study
    from reports.plan_view import recommendation_notes, reuse_line
    from reports.plots import plot_dir
    from reports.recommend import recommend_page_size

    out, df = page_size_study(opts, sizes, jobs=jobs, progress=progress, seeds=seeds)
    rec = recommend_page_size(df, tolerance)
    figs = plot_dir(out, out / "figures")
    rates = df["rate_req_s"].astype(float)
    rate = float(rates.mean()) if len(rates) else float("nan")
    doc.update(recommended_page_size=rec.page_size, overloaded=rec.overloaded,
               rate_req_s=rate, recommendation=rec.to_dict())
    if rec.overloaded:
        _warn_overload(df.to_dict("records"))
    if rec.all_overloaded:
        lines.append(f"not recommending: the study ran at {rate:.4g} req/s "
                     f"(--rate-scale {opts.workload.rate_scale:g}"
                     f"{'' if opts.workload.rate is None else f', --rate {opts.workload.rate:g}'}"
                     "), which this GPU cannot serve; rerun with --at-sustainable-rate")
    notes = recommendation_notes(rec)
    if rec.all_overloaded and len(notes) > 1:  # the same story per page size: tell it once
        notes = [notes[0], f"(and {len(notes) - 1} more page sizes, overloaded alike: "
                 "overload_reason in summary.csv)"]
    lines.extend(notes)
    line = reuse_line(rec)
    if line is not None:
        lines.append(line)
    lines.append(f"figures: {', '.join(str(p) for p in figs)}")
    return rec


def _echo_probe(p: Any) -> None:
    """One capacity probe, on stderr as it finishes (each is a whole simulation)."""
    verdict = ("servable  " if not p.overloaded else "misses SLO" if p.reason.startswith("SLO")
               else "overloaded")
    typer.echo(f"  {verdict} at {p.flag_value:.4g} ({p.rate_req_s:.4g} req/s)", err=True)


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
    from experiments.capacity import check_steps, find_sustainable_rate
    from experiments.runner import simulate_options
    from reports.overload_view import capacity_lines

    check_steps(steps)
    opts.sim_config()  # a user mistake before the first simulation
    bar = (not as_json and sys.stderr.isatty()) if progress is None else progress
    cap = find_sustainable_rate(opts, steps=steps, on_probe=None if as_json else _echo_probe,
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
    from experiments.calibrate import calibrate as fit_file
    from experiments.calibrate import fit_lines

    fit = fit_file(file, out, model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype, base=base,
                   backend=backend, page_size=page_size, chunk=chunk)
    for line in fit_lines(fit):
        typer.echo(line)
    typer.echo(f"profile: {out} (use --latency-profile {out})")


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
