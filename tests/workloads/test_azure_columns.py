"""The Azure trace read as columns (workloads/traces/azure_columns.py) against the row parser:
the same rows on well-formed files, and on anything else the row parser's own rows or error.

Cost: the hypothesis tests about 0.5 s; the bundled trace about 0.5 s.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.errors import WorkloadError
from workloads.registry import _TRACES
from workloads.request import namespace_column, namespace_of
from workloads.traces import formats
from workloads.traces.azure_columns import AZURE_HEADER, azure_rows
from workloads.traces.rows import RowSink, decode_text

# a well-formed record, or one with one defect the row parser reports (or accepts: "007",
# " 5" and "4.0" are counts it reads); times drawn from a few seconds so that they often go
# backwards as well
_DEFECTS = {
    "month": ("2023-11-16 ", "2023-13-16 "), "day": ("2023-11-16 ", "2023-02-30 "),
    "hour": (" 18:", " 24:"), "minute": (":15:", ":60:"), "second": (":5", ":6"),
    "leap": (":56", ":60"), "past leap": (":56", ":61"),
    "fraction": (".", ".1234567890"), "zero": (",3,", ",0,"), "big": (",3,", ",16777217,"),
    "padded": (",3,", ",007,"), "space": (",3,", ", 5,"), "float": (",3,", ",4.0,"),
    "negative": (",3,", ",-3,"), "text": (",3,", ",x,"), "T": ("16 ", "16T"),
}
_line = st.one_of(
    st.builds(lambda s, f, d: (f"2023-11-16 18:15:5{s}{f},3,4").replace(*_DEFECTS[d])
              if d else f"2023-11-16 18:15:5{s}{f},3,4",
              st.integers(0, 9), st.sampled_from(["", ".5", ".123456789"]),
              st.sampled_from([None, None, None, *_DEFECTS])),
    st.sampled_from(["", "  ", '"2023-11-16 18:15:46",3,4', "a,b"]))


def _row_by_row(text: str, skip: bool, monkeypatch) -> object:
    """What parse_azure gives with the columnar reader switched off: rows or the error."""
    sink = RowSink("t.csv", skip)
    with monkeypatch.context() as m:
        m.setattr(formats, "azure_rows", lambda text: None)
        try:
            formats.parse_azure(text, sink)
        except WorkloadError as e:
            return str(e)
    return sink.rows, sink.bad_rows, sink.first_bad


def _columns_first(text: str, skip: bool) -> object:
    sink = RowSink("t.csv", skip)
    try:
        formats.parse_azure(text, sink)
    except WorkloadError as e:
        return str(e)
    return sink.rows, sink.bad_rows, sink.first_bad


@settings(max_examples=200, deadline=None)
@given(st.lists(_line, min_size=0, max_size=5), st.sampled_from(["\n", "\r\n"]),
       st.booleans(), st.booleans())
def test_the_same_rows_or_error_as_row_by_row(lines, newline, trailing, skip):
    """Near-miss dates, times, counts, blank lines, quotes, CRLF, timestamps going backwards:
    parse_azure (columns first) answers exactly what the row parser answers."""
    text = newline.join([AZURE_HEADER, *lines]) + (newline if trailing else "")
    with pytest.MonkeyPatch.context() as mp:
        want = _row_by_row(text, skip, mp)
    assert _columns_first(text, skip) == want


@pytest.mark.parametrize("defect", [*_DEFECTS, "backwards"])
@pytest.mark.parametrize("skip", [False, True])
def test_each_defect_reads_as_row_by_row(defect, skip, monkeypatch):
    good = "2023-11-16 18:15:55.5,3,4"
    bad = ("2023-11-16 18:15:54,3,4" if defect == "backwards"
           else "2023-11-16 18:15:56.25,3,4".replace(*_DEFECTS[defect]))
    text = "\n".join([AZURE_HEADER, good, bad, "2023-11-16 18:16:30,3,4"])
    want = _row_by_row(text, skip, monkeypatch)
    assert _columns_first(text, skip) == want
    if defect not in ("padded", "space", "float", "leap"):  # rows the row parser reads too
        assert azure_rows(text) is None


def test_well_formed_rows_are_read_as_columns():
    text = "\n".join([AZURE_HEADER, "2023-11-16 23:59:59.9999999,5,6",
                      "2023-11-17 00:00:00,1,16777216", "2023-11-17 00:00:00.5,3,1"])
    rows = azure_rows(text)
    assert rows is not None
    assert [(r.line, r.arrival_s, r.prompt, r.output_len) for r in rows] == [
        (2, 0.0, 5, 6), (3, 1e-7, 1, 16777216), (4, 0.5000001, 3, 1)]
    assert azure_rows(text.replace(",3,1", ",3,0")) is None  # out of range: row by row
    assert azure_rows(text + "\n\n") is None  # a blank line: row by row


def test_bundled_trace_rows_equal_row_by_row(monkeypatch):
    path = _TRACES["azure-conv"][1]
    text = decode_text(path.read_bytes(), str(path))
    rows = azure_rows(text)
    assert rows is not None and len(rows) == 19366
    assert _row_by_row(text, False, monkeypatch) == (rows, 0, None)
    assert all(type(r.arrival_s) is float and type(r.prompt) is int for r in rows)


@settings(max_examples=40, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1), st.lists(st.integers(0, 2**63 - 1), max_size=20),
       st.integers(0, 9))
def test_namespace_column_is_namespace_of(seed, keys, tag):
    """The trace loader's namespaces of length-only rows, computed as one uint64 column, are
    `namespace_of`'s (so every request's token ids are what they were). About 0.3 s."""
    got = namespace_column(seed, np.array(keys, dtype=np.int64), tag)
    assert got.dtype == np.int64
    assert got.tolist() == [namespace_of(seed, k, tag) for k in keys]
