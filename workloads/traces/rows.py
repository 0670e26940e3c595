"""What every trace parser produces, and the strict field parsers they share.

Parsers turn text into `Row`s and never build requests themselves: request ids, prompt content
for length-only traces, arrival scaling and `max_new_tokens` are decided once, in `load.py`, so
all formats behave the same. Every problem in a row becomes a `WorkloadError` with file:line;
`RowSink` either raises it or (with skip_bad_rows) counts it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass

from workloads.errors import WorkloadError
from workloads.request import NAMESPACE_SPAN, PromptSpec

MAX_TOKEN_ID = (1 << 62) - 1  # explicit ids must fit int64 with room to spare
MAX_HASH_ID = (1 << 29) - 1  # h * 512 + 511 stays below the synthetic namespaces (>= 2**38)
MAX_LENGTH = NAMESPACE_SPAN  # 16,777,216 tokens: one synthetic namespace; far above any model


@dataclass
class Row:
    """One parsed trace row. `prompt` is a PromptSpec when the trace says what the prompt is
    (hash blocks, explicit ids) and a bare length when it does not."""

    line: int
    arrival_s: float | None
    prompt: PromptSpec | int
    output_len: int
    max_new_tokens: int | None = None
    session_id: int | None = None
    turn: int | None = None


class RowSink:
    """Collects good rows; raises or counts bad ones; enforces non-decreasing timestamps."""

    def __init__(self, source: str, skip_bad_rows: bool):
        self.source = source
        self.skip_bad_rows = skip_bad_rows
        self.rows: list[Row] = []
        self.bad_rows = 0
        self.first_bad: str | None = None
        self.failed_rows = 0  # rows the trace itself marks as failed requests (BurstGPT)
        self._last_arrival: float | None = None

    def error(self, line: int, message: str) -> WorkloadError:
        return WorkloadError(message, self.source, line)

    def reject(self, err: WorkloadError) -> None:
        if not self.skip_bad_rows:
            raise err
        self.bad_rows += 1
        if self.first_bad is None:
            self.first_bad = str(err)

    def add(self, row: Row) -> None:
        if row.arrival_s is not None:
            if self._last_arrival is not None and row.arrival_s < self._last_arrival:
                raise self.error(
                    row.line,
                    f"timestamps go backwards ({row.arrival_s:g} s after {self._last_arrival:g} s)",
                )
            self._last_arrival = row.arrival_s
        self.rows.append(row)

    def extend_sorted(self, rows: list[Row]) -> None:
        """Good rows whose timestamps the caller has checked never go backwards (a
        columnar reader): `add` for each, without the per-row check."""
        if not rows:
            return
        if self.rows or self._last_arrival is not None:
            for row in rows:
                self.add(row)
            return
        self.rows = list(rows)
        self._last_arrival = rows[-1].arrival_s


def decode_text(data: bytes, source: str) -> str:
    """UTF-8 (a BOM is dropped); anything else is an error at the line of the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise WorkloadError("not UTF-8 text", source, line) from None


def parse_count(
    text: object, column: str, minimum: int = 0, maximum: int = MAX_LENGTH
) -> int:
    """A token count: an integer in [0, 2^24] ("12" or "12.0"); raises WorkloadError (no
    location; the caller adds it). The upper bound keeps synthetic content inside one
    namespace and a bogus row from asking for terabytes of token ids."""
    if isinstance(text, bool) or text is None:
        raise WorkloadError(f"{column}: not a number: {text!r}")
    if isinstance(text, int):
        value = text
    elif isinstance(text, float):
        if not math.isfinite(text) or not text.is_integer():
            raise WorkloadError(f"{column}: not an integer: {text!r}")
        value = int(text)
    elif isinstance(text, str):
        s = text.strip()
        digits = s[1:] if s[:1] in ("+", "-") else s
        if digits.isascii() and digits.isdigit() and len(s) < 20:
            value = int(s)
        else:
            try:
                f = float(s)
            except ValueError:
                raise WorkloadError(f"{column}: not a number: {_show(s)}") from None
            if not math.isfinite(f) or not f.is_integer() or "_" in s:
                raise WorkloadError(f"{column}: not an integer: {_show(s)}")
            value = int(f)
    else:
        raise WorkloadError(f"{column}: not a number: {_show(text)}")
    if value < 0:
        raise WorkloadError(f"{column}: negative length {value}")
    if value < minimum:
        raise WorkloadError(f"{column}: must be at least {minimum}, got {value}")
    if value > maximum:
        raise WorkloadError(f"{column}: too large: {value} (at most {maximum})")
    return value


def parse_seconds(text: object, column: str, scale: float = 1.0) -> float:
    """A finite, non-negative time (times `scale`, e.g. 1e-3 for milliseconds)."""
    if isinstance(text, bool) or text is None:
        raise WorkloadError(f"{column}: not a number: {text!r}")
    if isinstance(text, (int, float)):
        try:
            f = float(text)
        except OverflowError:
            raise WorkloadError(f"{column}: not a finite number: {_show(text)}") from None
    elif isinstance(text, str):
        s = text.strip()
        try:
            f = float(s)
        except ValueError:
            raise WorkloadError(f"{column}: not a number: {_show(s)}") from None
        if "_" in s:
            raise WorkloadError(f"{column}: not a number: {_show(s)}")
    else:
        raise WorkloadError(f"{column}: not a number: {_show(text)}")
    if not math.isfinite(f):
        raise WorkloadError(f"{column}: not a finite number: {_show(text)}")
    if f < 0:
        raise WorkloadError(f"{column}: negative time {f:g}")
    return f * scale


def parse_token_ids(value: object, column: str) -> PromptSpec:
    """Explicit token ids: a JSON list of ints, or a string of space-separated ints (or a JSON
    list inside a string, as a CSV cell holds it)."""
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            try:
                value = json.loads(s)
            except (ValueError, RecursionError):
                raise WorkloadError(f"{column}: not a JSON list of token ids") from None
        else:
            value = s.replace(",", " ").split()
    if not isinstance(value, list):
        raise WorkloadError(f"{column}: expected a list of token ids")
    if not value:
        raise WorkloadError(f"{column}: empty prompt (at least 1 token needed)")
    ids = []
    for v in value:
        if isinstance(v, str) and v.isascii() and v.isdigit() and len(v) < 20:
            t = int(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            t = v
        else:
            raise WorkloadError(f"{column}: not a token id: {_show(v)}")
        if not 0 <= t <= MAX_TOKEN_ID:
            raise WorkloadError(f"{column}: token id out of range: {t}")
        ids.append(t)
    import numpy as np

    arr = np.asarray(ids, dtype=np.int64)
    arr.setflags(write=False)
    return PromptSpec((("ids", arr),))


def parse_optional_int(
    value: object, column: str, maximum: int = MAX_LENGTH
) -> int | None:
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    return parse_count(value, column, 0, maximum)


def _show(v: object) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def csv_records(text: str, source: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each non-blank CSV record, the header included."""
    reader = csv.reader(io.StringIO(text, newline=""))
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise WorkloadError(f"bad CSV: {e}", source, reader.line_num) from None
        if not fields or all(not f.strip() for f in fields):
            continue
        yield reader.line_num, fields


class CsvHeader:
    """Column lookup by name (case-insensitive, surrounding spaces ignored)."""

    def __init__(self, fields: list[str]):
        self.index: dict[str, int] = {}
        for i, f in enumerate(fields):
            self.index.setdefault(f.strip().lower(), i)

    def has(self, name: str) -> bool:
        return name.lower() in self.index

    def require(self, names: tuple[str, ...], source: str, line: int) -> None:
        missing = [n for n in names if not self.has(n)]
        if missing:
            raise WorkloadError(f"header lacks column(s) {', '.join(missing)}", source, line)

    def get(self, fields: list[str], name: str, required: bool = True) -> str | None:
        i = self.index.get(name.lower())
        if i is None or i >= len(fields):
            if required:
                raise WorkloadError(f"missing column {name}")
            return None
        return fields[i]
