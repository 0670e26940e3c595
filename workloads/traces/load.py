"""Trace file -> `Workload`: format detection, arrival handling, ids, `max_new_tokens`.

Decisions made here, once, for every format:

* request ids are 0..n-1 in file order (after bad and failed rows are dropped);
* a trace without prefix information gets unique prompt content per request
  (`unique_prompt(seed, request_id)`), so nothing is shared by accident;
* arrivals: the trace's timestamps shifted to start at 0 and divided by `rate_scale` (or
  rescaled to a mean `rate` when one is given: `rate_scale_for`), or, when
  `arrival` names a synthetic process (always for a trace with no timestamps), fresh times from
  that process, keeping the rows' order;
* `max_new_tokens`: the trace's column where it has one, else the `max_new_tokens` option, else
  `max_context_len - prompt_len` (at least 1). A true output longer than that is cut to it (an
  engine stops there too); the count is in `meta["clipped_outputs"]`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workloads.arrivals import ArrivalConfig, arrival_times, trace_arrivals
from workloads.errors import WorkloadError
from workloads.request import PROMPT_TAG, PromptSpec, Request, Workload, namespace_column
from workloads.traces.formats import PARSERS, TRACE_FORMATS, detect_format
from workloads.traces.rows import RowSink, decode_text

DEFAULT_MAX_CONTEXT_LEN = 131072


def resolve_max_new_tokens(
    prompt_len: int,
    output_len: int,
    column: int | None,
    option: int | None,
    max_context_len: int,
) -> tuple[int, int]:
    """(max_new_tokens, output_len clipped to it), by the precedence in the module docstring."""
    if column is not None:
        mnt = column
    elif option is not None:
        mnt = option
    else:
        mnt = max_context_len - prompt_len
    mnt = max(int(mnt), 1)
    return mnt, min(output_len, mnt)


def load_trace(path: str | Path, **options) -> Workload:
    """Read a trace file; see `load_trace_bytes` for the options."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise WorkloadError(f"cannot read trace: {e.strerror or e}", str(path)) from None
    options.setdefault("name", p.stem)
    return load_trace_bytes(data, str(path), **options)


def rate_scale_for(stamps: list[float], rate: float, num_requests: int | None,
                   source: str) -> float:
    """The `rate_scale` that replays the trace's timestamps at a mean of `rate` requests per
    second: `--rate R` with a timestamped trace is `--rate-scale R / native`, where native is
    the kept rows' count over their span (the rows `--num-requests` keeps; the same
    count-over-span summary.csv reports as `rate_req_s`), so the burst shape is kept and only
    the clock runs faster or slower."""
    kept = stamps if num_requests is None else stamps[:num_requests]
    span = (max(kept) - min(kept)) if len(kept) > 1 else 0.0
    if span <= 0:  # all at one instant: every scale replays the same arrivals
        return 1.0
    return rate / (len(kept) / span)


def load_trace_bytes(
    data: bytes,
    source: str = "<trace>",
    *,
    format: str = "auto",
    skip_bad_rows: bool = False,
    seed: int = 0,
    arrival: str | None = None,
    rate: float | None = None,
    cv: float = 1.0,
    peak_to_trough: float = 3.0,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
    num_requests: int | None = None,
    max_new_tokens: int | None = None,
    max_context_len: int = DEFAULT_MAX_CONTEXT_LEN,
    name: str | None = None,
) -> Workload:
    """Parse trace bytes into a Workload. Raises only `WorkloadError` for bad input.

    `arrival=None` replays the trace's timestamps when it has them (`"trace"`; a `rate` then
    rescales them to that mean rate, see `rate_scale_for`) and otherwise needs `rate` for a
    Poisson process; `"poisson" | "gamma" | "fixed" | "diurnal"` replace the timestamps.
    `num_requests` keeps the first rows, `duration_s` the rows arriving before it (after
    scaling). Bad and failed row counts land in `meta`.
    """
    if format not in TRACE_FORMATS:
        choices = ", ".join(TRACE_FORMATS)
        raise WorkloadError(f"unknown trace format {format!r} (choose from {choices})")
    if num_requests is not None and num_requests < 0:
        raise WorkloadError(f"num_requests must be >= 0, got {num_requests}")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise WorkloadError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if max_context_len < 1:
        raise WorkloadError(f"max_context_len must be >= 1, got {max_context_len}")
    text = decode_text(data, source)
    fmt = detect_format(text, source) if format == "auto" else format
    sink = RowSink(source, skip_bad_rows)
    PARSERS[fmt](text, sink)
    rows = sink.rows
    has_times = bool(rows) and rows[0].arrival_s is not None

    kind = arrival if arrival is not None else ("trace" if has_times or not rows else "poisson")
    if kind == "trace":
        if rows and not has_times:
            raise WorkloadError(f"{fmt} trace has no timestamps: choose an arrival process", source)
        stamps = [r.arrival_s for r in rows]
        if rate is not None:
            if rate_scale != 1.0:
                raise WorkloadError(f"--rate {rate:g} and --rate-scale {rate_scale:g} both "
                                    "rescale the trace's timestamps; give one", source)
            rate_scale = rate_scale_for(stamps, rate, num_requests, source)
        times = trace_arrivals(stamps, rate_scale, num_requests, duration_s)
    elif kind == "ladder":
        raise WorkloadError("--arrival ladder draws the times of a generated workload; a trace "
                            "keeps its rows' times (or --rate / --rate-scale)", source)
    else:
        if rate is None and kind != "burst":
            raise WorkloadError(
                f"{fmt} trace needs a rate for arrival process {kind!r} (it has no timestamps)"
                if not has_times else f"arrival process {kind!r} needs a rate", source,
            )
        bound = len(rows) if num_requests is None else min(num_requests, len(rows))
        rng = np.random.default_rng([seed, 0xA1])
        times = arrival_times(ArrivalConfig(kind, rate or 1.0, cv, peak_to_trough), rng, bound,
                              duration_s)

    requests: list[Request] = []
    clipped = 0
    # a length-only row's own content (`unique_prompt(seed, rid, n)`): the namespaces of
    # every kept row at once
    spaces = namespace_column(seed, np.arange(len(times)), PROMPT_TAG).tolist()
    # times may be shorter than rows (num_requests / duration_s bounds)
    for rid, (row, t) in enumerate(zip(rows, times.tolist(), strict=False)):
        prompt = row.prompt
        if not isinstance(prompt, PromptSpec):
            prompt = PromptSpec((("unique", spaces[rid], int(prompt), 0),))
        plen = prompt.length
        mnt, out = resolve_max_new_tokens(
            plen, row.output_len, row.max_new_tokens, max_new_tokens, max_context_len
        )
        clipped += out < row.output_len
        requests.append(
            Request(
                request_id=rid,
                arrival_s=float(t),
                prompt=prompt,
                output_len=out,
                max_new_tokens=mnt,
                seed=seed,
                session_id=row.session_id,
                turn=row.turn,
                meta={"line": row.line},
            )
        )
    return Workload(
        name=name or Path(source).stem,
        requests=requests,
        seed=seed,
        description=f"{fmt} trace {source}",
        meta={
            "source": source,
            "format": fmt,
            "arrival": kind,
            "rate_scale": rate_scale,
            "requested_rate": rate if kind == "trace" else None,
            "rows_read": len(rows),
            "bad_rows": sink.bad_rows,
            "first_bad_row": sink.first_bad,
            "failed_rows": sink.failed_rows,
            "clipped_outputs": clipped,
        },
    )
