"""What the commands print to the terminal besides their tables, and how the process ends.

cli.py keeps the commands; these are the small printing helpers several of them share (the
overload warning, the skipped trace rows, the reuse lines, the SLO verdicts, the capacity
probes) and `freeze_heap_at_exit`, the one process-wide setting a `kvsim` command makes.
"""

from __future__ import annotations

import atexit
import gc
from typing import Any

import typer


def console():
    """A rich console, imported only by the commands that print through one."""
    from rich.console import Console

    return Console()


def warn_overload(rows: list[dict[str, Any]]) -> None:
    """The one-line overload warning (reports.overload_view), on stderr so --json stays JSON."""
    from reports.overload_view import overload_warning

    line = overload_warning(rows)
    if line is not None:
        typer.echo(line, err=True)


def warn_skipped_rows(rows: list[dict[str, Any]]) -> None:
    """How many malformed trace rows `--skip-bad-rows` skipped, once per trace, on stderr."""
    seen: dict[str, int] = {}
    for r in rows:
        n = r.get("trace_bad_rows")
        if isinstance(n, (int, float)) and n == n and n > 0:
            seen.setdefault(str(r.get("trace") or r.get("workload")), int(n))
    for trace, n in seen.items():
        typer.echo(f"note: --skip-bad-rows skipped {n:,} malformed row{'s' if n != 1 else ''} "
                   f"of {trace}", err=True)


def print_lines(con, lines: list[str]) -> None:
    for line in lines:
        con.print(line, markup=False, highlight=False)


def print_reuse(con, rows: list[dict[str, Any]]) -> None:
    """The hit rate next to the ideal and where the gap went (reports.reuse_view)."""
    from reports.reuse_view import reuse_lines

    print_lines(con, reuse_lines(rows, [str(r.get("policy", "")) for r in rows]))


def print_slo(con, rows: list[dict[str, Any]]) -> None:
    """Whether each run met its SLO (reports.slo_view); nothing without a target."""
    from reports.slo_view import slo_line

    named = len(rows) > 1
    print_lines(con, [line for r in rows
                      if (line := slo_line(r, str(r.get("policy", "")) if named else ""))])


def echo_lines(lines: list[str]) -> None:
    for line in lines:
        typer.echo(line)


def echo_probe(p: Any) -> None:
    """One capacity probe, on stderr as it finishes."""
    from reports.overload_view import probe_line

    typer.echo(probe_line(p), err=True)


def freeze_heap_at_exit() -> None:
    """Skip the garbage collector's last passes when the process ends.

    Why: a finished command has written its results (atomically, reports/io.py) and closed its
    files; what is left is torch's and the run's objects, which the interpreter's shutdown
    would walk with the cyclic collector once more. With torch imported that walk is most of
    the time a `kvsim` process spends exiting (docs/performance.md, "The process's exit").
    `gc.freeze()` from an atexit hook moves every object to the permanent generation, which
    the shutdown collection skips; memory goes back to the OS with the process anyway.
    atexit hooks run before the interpreter tears down its modules, so this one runs first.
    """
    atexit.register(gc.freeze)
