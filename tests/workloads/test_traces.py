"""Trace loaders: bundled traces match the shared README, fixtures, formats, bad rows."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.workloads.conftest import DATA, FIXTURES
from workloads.errors import WorkloadError
from workloads.request import HASH_BLOCK_TOKENS
from workloads.traces import (
    azure_timestamp_ns,
    detect_format,
    formats,
    load_trace,
    load_trace_bytes,
)


def _means(w):
    df = w.to_frame()
    return len(df), df.prompt_len.mean(), df.output_len.mean(), df


def test_mooncake_bundled(mooncake):
    n, mi, mo, df = _means(mooncake)
    assert n == 12031
    assert mi == pytest.approx(12035.1, abs=0.05)
    assert mo == pytest.approx(342.6, abs=0.05)
    assert df.arrival_s.iloc[-1] == pytest.approx(3536.999)
    assert df.prompt_len.min() == 891 and df.prompt_len.max() == 126195
    r0 = mooncake.requests[0]
    ids = r0.prompt_ids()
    assert len(ids) == 6758
    assert ids[0] == 0 and ids[HASH_BLOCK_TOKENS] == 1 * HASH_BLOCK_TOKENS
    assert mooncake.meta["format"] == "mooncake" and mooncake.meta["bad_rows"] == 0


def test_azure_bundled(azure):
    n, mi, mo, df = _means(azure)
    assert n == 19366
    assert mi == pytest.approx(1154.7, abs=0.05)
    assert mo == pytest.approx(211.1, abs=0.05)
    assert df.arrival_s.iloc[-1] - df.arrival_s.iloc[0] == pytest.approx(3501.722, abs=1e-3)
    assert np.all(np.diff(df.arrival_s) >= 0)


def test_sharegpt_bundled(sharegpt_real):
    n, mi, mo, _ = _means(sharegpt_real)
    assert n == 30731
    assert mi == pytest.approx(2340.0, abs=0.05)
    assert mo == pytest.approx(438.7, abs=0.05)
    assert sharegpt_real.meta["arrival"] == "poisson"


def test_sharegpt_needs_rate():
    with pytest.raises(WorkloadError, match="rate"):
        load_trace(DATA / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")


def test_burstgpt_fixture():
    w = load_trace(FIXTURES / "burstgpt_sample.csv")
    assert w.meta["format"] == "burstgpt"
    assert w.meta["failed_rows"] == 1 and w.meta["bad_rows"] == 0
    df = w.to_frame()
    assert df.prompt_len.tolist() == [472, 1087, 417, 35]
    assert df.output_len.tolist() == [18, 230, 276, 1020]
    assert df.arrival_s.tolist() == [0.0, 40.0, 113.0, 115.5]
    assert [r.meta["line"] for r in w.requests] == [2, 3, 5, 6]


def test_vidur_fixture_and_rate_scale():
    w = load_trace(FIXTURES / "vidur_sample.csv", rate_scale=2.0)
    assert w.meta["format"] == "vidur"
    df = w.to_frame()
    assert df.arrival_s.tolist() == [0.0, 0.0625, 0.0625, 1.25]
    assert df.prompt_len.tolist() == [591, 547, 3772, 16]
    # unique prompt content per request: no shared tokens
    a, b = w.requests[0].prompt_ids(), w.requests[1].prompt_ids()
    assert not set(a[:100].tolist()) & set(b[:100].tolist())


def test_bounds_duration_and_count():
    w = load_trace(FIXTURES / "vidur_sample.csv", num_requests=2)
    assert len(w.requests) == 2
    w = load_trace(FIXTURES / "vidur_sample.csv", duration_s=1.0)
    assert len(w.requests) == 3


def test_azure_timestamps_6_and_7_digits():
    a = azure_timestamp_ns("2023-11-16 18:15:46.6805900")
    b = azure_timestamp_ns("2023-11-16 18:15:46.680590")
    c = azure_timestamp_ns("2023-11-16 18:15:47")
    assert a == b and c - a == 319_410_000
    data = (b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
            b"2023-11-16 23:59:59.9999999,10,2\n2023-11-17 00:00:00.000001,5,3")
    w = load_trace_bytes(data, "az.csv")
    assert w.requests[1].arrival_s == pytest.approx(1.1e-6)


def _timestamp_or_error(text: str) -> int | str:
    try:
        return azure_timestamp_ns(text)
    except WorkloadError as e:
        return str(e)


_ts_field = st.sampled_from(["", "0", "1", "07", "11", "16", "23", "24", "59", "60", "61",
                             "2023", "02023", "\u0661"])


@settings(max_examples=40, deadline=None)
@example(("02023", "11", "16", "18", "15", "46"), ("-", " "), "1", "")  # a 5-digit field
@example(("2023", "02", "30", "18", "15", "46"), ("-", " "), None, "")  # no such day
@example(("2023", "11", "16", "24", "15", "46"), ("-", "T"), None, " ")  # hour 24
@example(("2023", "11", "16", "23", "59", "61"), ("-", " "), None, "")  # second 61
@example(("2023", "11", "16", "23", "59", "59"), ("-", " "), "", "")  # a dot, no digits
@example(("2023", "11", "16", "23", "59", "60"), ("-", " "), "1234567890", "")  # 10 digits
@example(("\u0661", "11", "16", "23", "59", "60"), ("-", " "), None, "")  # not ASCII
@example(("2023", "11", "16", "23", "59", "60"), ("-", "  "), "5", "\u00a0")  # two spaces
@given(fields=st.tuples(_ts_field, _ts_field, _ts_field, _ts_field, _ts_field, _ts_field),
       seps=st.tuples(st.sampled_from(["-", "/"]), st.sampled_from([" ", "T", "  ", "x"])),
       frac=st.one_of(st.none(), _ts_field, st.text(max_size=3)),
       pad=st.sampled_from(["", " ", "\t", "\u00a0"]))
def test_azure_timestamp_fast_path_equals_the_field_checks(fields, seps, frac, pad):
    """The one-regex path answers exactly as the field-by-field checks (the value, or the
    same error) on near-miss timestamps: bad digits, lengths, dates, times, separators,
    padding. About 0.3 s."""
    y, mo, d, h, mi, sec = fields
    text = f"{pad}{y}{seps[0]}{mo}-{d}{seps[1]}{h}:{mi}:{sec}"
    if frac is not None:
        text += "." + frac
    text += pad
    fast = _timestamp_or_error(text)
    saved, formats._AZURE_TS = formats._AZURE_TS, re.compile("(?!)")  # never matches
    try:
        assert _timestamp_or_error(text) == fast
    finally:
        formats._AZURE_TS = saved


def test_generic_csv_and_jsonl():
    csv = (b'arrival_s,prompt_ids,output_len,max_new_tokens,session_id,turn\n'
           b'0.5,1 2 3,4,8,7,0\n1.0,"[1, 2, 3, 9]",2,,7,1\n')
    w = load_trace_bytes(csv, "g.csv")
    assert w.meta["format"] == "generic"
    r0, r1 = w.requests
    assert r0.prompt_ids().tolist() == [1, 2, 3] and r0.max_new_tokens == 8
    assert r1.prompt_ids().tolist() == [1, 2, 3, 9] and r1.session_id == 7 and r1.turn == 1
    assert r0.arrival_s == 0.0 and r1.arrival_s == 0.5
    jsonl = b'{"arrival_s": 0, "prompt_ids": [5, 6], "output_len": 3}\n'
    w = load_trace_bytes(jsonl, "g.jsonl", max_context_len=100)
    assert w.requests[0].max_new_tokens == 98


def test_max_new_tokens_precedence_and_clipping():
    w = load_trace(FIXTURES / "vidur_sample.csv", max_new_tokens=100)
    assert [r.max_new_tokens for r in w.requests] == [100] * 4
    assert [r.output_len for r in w.requests] == [100, 100, 54, 4]
    assert w.meta["clipped_outputs"] == 2
    w = load_trace(FIXTURES / "vidur_sample.csv", max_context_len=4096)
    assert [r.max_new_tokens for r in w.requests] == [4096 - 591, 4096 - 547, 4096 - 3772, 4080]


@pytest.mark.parametrize(
    ("fmt", "text", "line", "what"),
    [
        ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,x,5\n", 3,
         "not a number"),
        ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,-5,5\n", 3,
         "negative"),
        ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n\n1,5\n", 4,
         "missing column"),
        ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n2,5,5\n1,5,5\n", 3,
         "backwards"),
        ("vidur", "arrived_at,num_prefill_tokens\n0,5\n", 1, "lacks column"),
        ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1e18,5\n", 2,
         "too large"),
        ("mooncake", '{"timestamp": 0, "input_length": 600, "output_length": 2, '
         '"hash_ids": [1]}\n', 1, "hash_ids has 1 blocks"),
        ("mooncake", '{"timestamp": 0, "input_length": 6, "output_length": 2, "hash_ids": [1]}'
         '\n{"timestamp": 1, "input_length": 6, "hash_ids": [1]}\n', 2, "output_length"),
        ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,2\n"
         "2023-11-16 18:15:45.1,3,4\n", 3, "backwards"),
        ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:15:46.68,1,2\n", 2,
         "bad date"),
        ("generic", "arrival_s,prompt_ids,output_len\n0,,3\n", 2, "empty prompt"),
    ],
)
def test_bad_rows_name_file_and_line(fmt, text, line, what):
    with pytest.raises(WorkloadError) as e:
        load_trace_bytes(text.encode(), "t.txt", format=fmt)
    msg = str(e.value)
    assert msg.startswith(f"t.txt:{line}: ") and what in msg and "\n" not in msg
    assert e.value.line == line


def test_skip_bad_rows_counts(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n1,5,5\n1,x,5\n0.5,3,3\n"
                 "2,-1,1\n3,7,7\n")
    w = load_trace(p, skip_bad_rows=True)
    assert len(w.requests) == 2 and w.meta["bad_rows"] == 3
    assert w.meta["first_bad_row"].startswith(f"{p}:3: ")
    with pytest.raises(WorkloadError, match=f"{p}:3: "):
        load_trace(p)


@pytest.mark.parametrize(
    ("data", "what"),
    [(b"", "empty file"), (b"\n\n", "empty file"), (b"a,b,c\n1,2,3\n", "unknown format"),
     (b'{"x": 1}\n', "unknown format"), (b"\xff\xfe\x00", "not UTF-8")],
)
def test_file_level_errors(data, what):
    with pytest.raises(WorkloadError, match=what):
        load_trace_bytes(data, "f")
    with pytest.raises(WorkloadError, match="unknown trace format"):
        load_trace_bytes(b"x", "f", format="nope")


def test_missing_file():
    with pytest.raises(WorkloadError, match="cannot read"):
        load_trace("/nonexistent/trace.csv")


def test_detect_format():
    assert detect_format((DATA / "AzureLLMInferenceTrace_conv.csv").read_text()[:200], "a") == (
        "azure")
    assert detect_format((FIXTURES / "burstgpt_sample.csv").read_text(), "b") == "burstgpt"
    assert detect_format("num_prefill_tokens,num_decode_tokens\n1,2\n", "s") == "sharegpt"
    assert detect_format('{"timestamp": 1, "input_length": 3}', "m") == "mooncake"


def test_trace_arrival_override(azure):
    w = load_trace(FIXTURES / "vidur_sample.csv", arrival="fixed", rate=4.0)
    assert [r.arrival_s for r in w.requests] == [0.0, 0.25, 0.5, 0.75]
