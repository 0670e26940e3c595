"""One parser per trace format: text in, `Row`s into a `RowSink` out.

Each parser checks its own header, turns every data row into a `Row` or a file:line error, and
leaves request building to `load.py`. Timestamps are converted to seconds here (the sink checks
that they never go backwards); shifting to t = 0 and `rate_scale` happen later.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import re

from workloads.errors import WorkloadError
from workloads.request import HASH_BLOCK_TOKENS, PromptSpec
from workloads.traces.azure_columns import azure_rows
from workloads.traces.rows import (
    MAX_HASH_ID,
    MAX_TOKEN_ID,
    CsvHeader,
    Row,
    RowSink,
    csv_records,
    parse_count,
    parse_optional_int,
    parse_seconds,
    parse_token_ids,
)

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
SHAREGPT_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
GENERIC_COLUMNS = ("arrival_s", "prompt_ids", "output_len")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def _csv_rows(text: str, sink: RowSink, required: tuple[str, ...]):
    """Yield (line, header, fields) for each data record after checking the header."""
    records = csv_records(text, sink.source)
    first = next(records, None)
    if first is None:
        raise WorkloadError("empty file", sink.source, 1)
    line, fields = first
    header = CsvHeader(fields)
    header.require(required, sink.source, line)
    for line, fields in records:
        yield line, header, fields


def _located(sink: RowSink, line: int, err: WorkloadError) -> WorkloadError:
    return err if err.line is not None else sink.error(line, err.reason)


def azure_timestamp_ns(text: str) -> int:
    """`YYYY-MM-DD HH:MM:SS[.f...]` (1-9 fractional digits, no zone) as integer nanoseconds
    since 0001-01-01. String arithmetic rather than a datetime parser: the Azure files carry 7
    fractional digits, one more than `datetime` and pandas' default formats take, and integers
    keep the 100 ns resolution exact."""
    s = text.strip()
    m = _AZURE_TS.fullmatch(s)
    if m is not None:  # the usual form: one regex, the day's ordinal from a cache
        y, mo, dd, hh, mm, ss = (int(f) for f in m.groups()[:6])
        frac = m.group(7)
        if hh <= 23 and mm <= 59 and ss <= 60:
            day = _ordinal(y, mo, dd)
            if day is not None:
                return (((day * 86400 + hh * 3600 + mm * 60 + ss) * 1_000_000_000)
                        + (int(frac.ljust(9, "0")) if frac else 0))
    parts = s.split(" ")  # any other form: checked field by field, one-line errors
    if len(parts) != 2:
        parts = s.split("T")
    if len(parts) != 2:
        raise WorkloadError(f"TIMESTAMP: not 'YYYY-MM-DD HH:MM:SS.fffffff': {text[:40]!r}")
    date_s, time_s = parts
    d = date_s.split("-")
    sec_frac = time_s.split(".")
    t = sec_frac[0].split(":")
    frac = sec_frac[1] if len(sec_frac) == 2 else ""
    fields = [*d, *t]
    ok = (
        len(d) == 3 and len(t) == 3 and len(sec_frac) <= 2
        and all(f.isascii() and f.isdigit() and len(f) <= 4 for f in fields)
        and (frac == "" or (frac.isascii() and frac.isdigit() and len(frac) <= 9))
        and (len(sec_frac) == 1 or frac != "")
    )
    if not ok:
        raise WorkloadError(f"TIMESTAMP: not 'YYYY-MM-DD HH:MM:SS.fffffff': {text[:40]!r}")
    y, mo, dd, hh, mm, ss = (int(f) for f in fields)
    try:
        day = _dt.date(y, mo, dd).toordinal()
    except ValueError as e:
        raise WorkloadError(f"TIMESTAMP: bad date {date_s!r}: {e}") from None
    if hh > 23 or mm > 59 or ss > 60:
        raise WorkloadError(f"TIMESTAMP: bad time of day {time_s!r}")
    frac_ns = int(frac.ljust(9, "0")) if frac else 0
    return ((day * 86400 + hh * 3600 + mm * 60 + ss) * 1_000_000_000) + frac_ns


# what azure_timestamp_ns accepts, as one pattern (ASCII digits, at most 4 per field, 1-9
# fractional digits); anything else takes the field-by-field path and its error messages
_AZURE_TS = re.compile(r"(\d{1,4})-(\d{1,4})-(\d{1,4})[ T](\d{1,4}):(\d{1,4}):(\d{1,4})"
                       r"(?:\.(\d{1,9}))?", re.ASCII)


@functools.lru_cache(maxsize=64)
def _ordinal(y: int, mo: int, dd: int) -> int | None:
    """The day's proleptic ordinal, None for no such date (a trace spans a few days)."""
    try:
        return _dt.date(y, mo, dd).toordinal()
    except ValueError:
        return None


def parse_azure(text: str, sink: RowSink) -> None:
    """Azure LLM inference trace (Splitwise): TIMESTAMP, ContextTokens, GeneratedTokens. A
    file in the published form is read as columns (workloads/traces/azure_columns.py: the
    same rows); anything else row by row, each bad row with its file:line error."""
    rows = azure_rows(text)
    if rows is not None:
        sink.extend_sorted(rows)
        return
    t0: int | None = None
    for line, h, f in _csv_rows(text, sink, AZURE_COLUMNS):
        try:
            ns = azure_timestamp_ns(h.get(f, "TIMESTAMP"))
            prompt = parse_count(h.get(f, "ContextTokens"), "ContextTokens", 1)
            out = parse_count(h.get(f, "GeneratedTokens"), "GeneratedTokens", 1)
            if t0 is None:
                t0 = ns
            # relative to the first good row; a row before it is "going backwards" (negative)
            sink.add(Row(line, (ns - t0) / 1e9, prompt, out))
        except WorkloadError as e:
            sink.reject(_located(sink, line, e))


def parse_burstgpt(text: str, sink: RowSink) -> None:
    """BurstGPT: Timestamp (s), Model, Request tokens, Response tokens, Total tokens, Log Type
    (BurstGPT_3 adds Session ID / Elapsed time; extra columns are ignored). A row with 0
    response tokens (or 0 request tokens) is a failed request in BurstGPT's own convention:
    skipped and counted as failed, not as bad."""
    for line, h, f in _csv_rows(text, sink, BURSTGPT_COLUMNS):
        try:
            t = parse_seconds(h.get(f, "Timestamp"), "Timestamp")
            prompt = parse_count(h.get(f, "Request tokens"), "Request tokens")
            out = parse_count(h.get(f, "Response tokens"), "Response tokens")
            if out == 0 or prompt == 0:
                sink.failed_rows += 1
                continue
            sink.add(Row(line, t, prompt, out))
        except WorkloadError as e:
            sink.reject(_located(sink, line, e))


def parse_vidur(text: str, sink: RowSink) -> None:
    """Vidur / Splitwise replay CSV: arrived_at (s), num_prefill_tokens, num_decode_tokens."""
    for line, h, f in _csv_rows(text, sink, VIDUR_COLUMNS):
        try:
            t = parse_seconds(h.get(f, "arrived_at"), "arrived_at")
            prompt = parse_count(h.get(f, "num_prefill_tokens"), "num_prefill_tokens", 1)
            out = parse_count(h.get(f, "num_decode_tokens"), "num_decode_tokens", 1)
            sink.add(Row(line, t, prompt, out))
        except WorkloadError as e:
            sink.reject(_located(sink, line, e))


def parse_sharegpt(text: str, sink: RowSink) -> None:
    """ShareGPT length list (sarathi-serve): num_prefill_tokens, num_decode_tokens, ... and no
    timestamps: the loader pairs it with an arrival process."""
    for line, h, f in _csv_rows(text, sink, SHAREGPT_COLUMNS):
        try:
            prompt = parse_count(h.get(f, "num_prefill_tokens"), "num_prefill_tokens", 1)
            out = parse_count(h.get(f, "num_decode_tokens"), "num_decode_tokens", 1)
            sink.add(Row(line, None, prompt, out))
        except WorkloadError as e:
            sink.reject(_located(sink, line, e))


def _json_lines(text: str, sink: RowSink):
    """(line, object) of each non-blank JSON line; an empty file is an error."""
    seen = False
    for i, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        seen = True
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            sink.reject(sink.error(i, "not a JSON object"))
            continue
        if not isinstance(obj, dict):
            sink.reject(sink.error(i, "not a JSON object"))
            continue
        yield i, obj
    if not seen:
        raise WorkloadError("empty file", sink.source, 1)


def _need(obj: dict, key: str) -> object:
    if key not in obj:
        raise WorkloadError(f"missing column {key}")
    return obj[key]


def parse_mooncake(text: str, sink: RowSink) -> None:
    """Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids. Hash id h at
    offset i of its 512-token block is token h*512+i, so caches see the trace's real sharing;
    `len(hash_ids)` must be ceil(input_length / 512) (the last block is partial)."""
    for line, obj in _json_lines(text, sink):
        try:
            t = parse_seconds(_need(obj, "timestamp"), "timestamp", 1e-3)
            n = parse_count(_need(obj, "input_length"), "input_length", 1)
            out = parse_count(_need(obj, "output_length"), "output_length", 1)
            hashes = _need(obj, "hash_ids")
            if not isinstance(hashes, list):
                raise WorkloadError("hash_ids: expected a list")
            want = math.ceil(n / HASH_BLOCK_TOKENS)
            if len(hashes) != want:
                raise WorkloadError(
                    f"hash_ids has {len(hashes)} blocks, input_length {n} needs {want}"
                )
            for h in hashes:
                if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= MAX_HASH_ID:
                    raise WorkloadError(f"hash_ids: not a block id in [0, 2^29): {h!r:.40}")
            sink.add(Row(line, t, PromptSpec((("hash", tuple(hashes), n),)), out))
        except WorkloadError as e:
            sink.reject(_located(sink, line, e))


def _generic_row(line: int, get, sink: RowSink) -> None:
    t = parse_seconds(get("arrival_s", True), "arrival_s")
    prompt = parse_token_ids(get("prompt_ids", True), "prompt_ids")
    out = parse_count(get("output_len", True), "output_len", 1)
    mnt = parse_optional_int(get("max_new_tokens", False), "max_new_tokens")
    if mnt is not None and mnt < 1:
        raise WorkloadError("max_new_tokens: must be at least 1")
    sess = parse_optional_int(get("session_id", False), "session_id", MAX_TOKEN_ID)
    turn = parse_optional_int(get("turn", False), "turn", MAX_TOKEN_ID)
    sink.add(Row(line, t, prompt, out, mnt, sess, turn))


def parse_generic(text: str, sink: RowSink) -> None:
    """Explicit token ids, as CSV (header arrival_s, prompt_ids, output_len[, max_new_tokens,
    session_id, turn]) or JSON lines with those keys; told apart by the first character."""
    if text.lstrip()[:1] == "{":
        for line, obj in _json_lines(text, sink):

            def get(key: str, required: bool, obj: dict = obj) -> object:
                return _need(obj, key) if required else obj.get(key)

            try:
                _generic_row(line, get, sink)
            except WorkloadError as e:
                sink.reject(_located(sink, line, e))
        return
    for line, h, f in _csv_rows(text, sink, GENERIC_COLUMNS):

        def cget(key: str, required: bool, h: CsvHeader = h, f: list[str] = f) -> object:
            return h.get(f, key, required)

        try:
            _generic_row(line, cget, sink)
        except WorkloadError as e:
            sink.reject(_located(sink, line, e))


PARSERS = {
    "azure": parse_azure,
    "mooncake": parse_mooncake,
    "burstgpt": parse_burstgpt,
    "vidur": parse_vidur,
    "sharegpt": parse_sharegpt,
    "generic": parse_generic,
}
TRACE_FORMATS = ("auto", *PARSERS)


def detect_format(text: str, source: str) -> str:
    """Guess the format from the first non-blank line (a JSON object's keys, or a CSV header)."""
    first = next((ln for ln in text.splitlines() if ln.strip()), None)
    if first is None:
        raise WorkloadError("empty file", source, 1)
    if first.lstrip().startswith("{"):
        try:
            obj = json.loads(first)
        except (ValueError, RecursionError):
            obj = None
        keys = set(obj) if isinstance(obj, dict) else set()
        if "hash_ids" in keys or "input_length" in keys:
            return "mooncake"
        if "prompt_ids" in keys:
            return "generic"
        raise WorkloadError("unknown format: a JSON line without hash_ids or prompt_ids", source, 1)
    try:
        header = CsvHeader(next(csv_records(first, source))[1])
    except (StopIteration, WorkloadError):
        header = CsvHeader([])
    if all(header.has(c) for c in AZURE_COLUMNS):
        return "azure"
    if header.has("Request tokens") and header.has("Response tokens"):
        return "burstgpt"
    if header.has("arrived_at") and header.has("num_prefill_tokens"):
        return "vidur"
    if all(header.has(c) for c in SHAREGPT_COLUMNS):
        return "sharegpt"
    if header.has("prompt_ids"):
        return "generic"
    raise WorkloadError(
        f"unknown format (header {first.strip()[:60]!r}); pass format= one of "
        + ", ".join(PARSERS),
        source,
        1,
    )
