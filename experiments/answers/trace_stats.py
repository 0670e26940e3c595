"""`kvsim trace stats`: a trace file (or a built-in workload) read as a run would read it, and
its statistics (workloads/stats.py) at a page size."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any


def file_stats(file: str, page_size: int, *, format: str = "auto", skip_bad_rows: bool = False,
               num_requests: int | None = None, rate: float | None = None) -> dict[str, Any]:
    """Lengths, rate, sessions and ideal prefix reuse of `file` (a path, else a built-in
    workload's name); every value is checked by the spec that owns it."""
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
    return trace_stats(build_workload(spec), page_size)


__all__ = ["file_stats"]
