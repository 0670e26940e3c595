"""The Azure trace read as columns: one regular expression over the whole text and numpy over
its fields, for a file in the published form (the header `TIMESTAMP,ContextTokens,
GeneratedTokens`, one unquoted record a line, `YYYY-MM-DD HH:MM:SS[.f...]` timestamps that
never go backwards, counts in range).

`azure_rows` answers None for anything else (a quote, a blank line, another column order, one
field out of form or out of range, a timestamp going backwards), and `parse_azure` then reads
the file row by row as before, so a bad row still gets its one-line file:line error (or is
counted under `skip_bad_rows`). On a well-formed file both give the same rows: the same line
numbers, the same counts, the same seconds (the integer nanoseconds since the first row,
converted and divided as the row parser does; tests/workloads/test_azure_columns.py).
"""

from __future__ import annotations

import datetime as _dt
import re

import numpy as np

from workloads.traces.rows import MAX_LENGTH, Row

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
_RECORD = re.compile(r"^(\d{4}-\d\d-\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?,"
                     r"(\d{1,9}),(\d{1,9})\r?$", re.ASCII | re.MULTILINE)
_NS = 1_000_000_000


def azure_rows(text: str) -> list[Row] | None:
    """The rows of a well-formed Azure trace (see the module docstring), else None."""
    if '"' in text or text.count("\r") != text.count("\r\n"):
        return None  # quoting or bare carriage returns: the csv module's rules
    head, sep, body = text.partition("\n")
    if head.rstrip("\r") != AZURE_HEADER or not sep:
        return None
    lines = body.count("\n") + (0 if body.endswith("\n") else 1)
    fields = _RECORD.findall(body)
    if not fields or len(fields) != lines:
        return None  # a blank or malformed line: the row parser says which
    dates, hours, minutes, secs, fracs, prompts, outputs = zip(*fields, strict=True)
    prompt, output = _ints(prompts), _ints(outputs)
    if min(prompt.min(), output.min()) < 1 or max(prompt.max(), output.max()) > MAX_LENGTH:
        return None
    nanos = _nanoseconds(dates, _ints(hours), _ints(minutes), _ints(secs), fracs)
    if nanos is None or (np.diff(nanos) < 0).any():
        return None
    seconds = (nanos - nanos[0]).astype(np.float64) / 1e9
    return [Row(line, t, p, o) for line, t, p, o in zip(
        range(2, len(fields) + 2), seconds.tolist(), prompt.tolist(), output.tolist(),
        strict=True)]


def _ints(texts: tuple[str, ...]) -> np.ndarray:
    """Decimal strings (ASCII digits, checked by the pattern) as int64: Python's `int` per
    field, a C parse of a short string, where numpy's string casts go through its generic
    string dtype."""
    return np.fromiter(map(int, texts), dtype=np.int64, count=len(texts))


def _nanoseconds(dates: tuple[str, ...], hours: np.ndarray, minutes: np.ndarray,
                 secs: np.ndarray, fracs: tuple[str, ...]) -> np.ndarray | None:
    """Each record's time in integer nanoseconds since the first record's day (None for a
    date that does not exist or a time of day out of range)."""
    if hours.max() > 23 or minutes.max() > 59 or secs.max() > 60:
        return None
    try:  # a trace spans a few days: each distinct date once
        ordinal = {d: _dt.date(*map(int, d.split("-"))).toordinal() for d in set(dates)}
    except ValueError:  # no such date
        return None
    day = np.fromiter(map(ordinal.__getitem__, dates), dtype=np.int64, count=len(dates))
    day -= day[0]  # a day's nanoseconds from the first record's: far inside int64
    frac = _ints(tuple(f.ljust(9, "0") for f in fracs))  # "" (no fraction) -> 0
    return (day * 86400 + hours * 3600 + minutes * 60 + secs) * _NS + frac


__all__ = ["AZURE_HEADER", "azure_rows"]
