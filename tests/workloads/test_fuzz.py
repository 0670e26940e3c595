"""Fuzz every parser: random bytes and random rows give a Workload or a WorkloadError, never
any other exception."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads.errors import WorkloadError
from workloads.traces import TRACE_FORMATS, load_trace_bytes
from workloads.traces.formats import (
    AZURE_COLUMNS,
    GENERIC_COLUMNS,
    MOONCAKE_KEYS,
    VIDUR_COLUMNS,
)

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEADERS = {
    "azure": ",".join(AZURE_COLUMNS),
    "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    "vidur": ",".join(VIDUR_COLUMNS),
    "sharegpt": "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio",
    "generic": ",".join((*GENERIC_COLUMNS, "max_new_tokens", "session_id", "turn")),
}


def check(data: bytes, fmt: str, skip: bool, rate: float | None = 1.0) -> None:
    try:
        w = load_trace_bytes(data, "fuzz", format=fmt, skip_bad_rows=skip, rate=rate)
    except WorkloadError as e:
        msg = str(e)
        assert "\n" not in msg and msg.startswith("fuzz")
        return
    for r in w.requests[:5]:  # what loads is usable
        assert r.prompt_len >= 1 and 1 <= r.output_len <= r.max_new_tokens
        assert len(r.prompt_ids()) == r.prompt_len


@FUZZ
@given(data=st.binary(max_size=300), fmt=st.sampled_from(TRACE_FORMATS), skip=st.booleans())
def test_random_bytes(data, fmt, skip):
    check(data, fmt, skip)


@FUZZ
@given(data=st.binary(max_size=200), fmt=st.sampled_from(list(HEADERS)), skip=st.booleans())
def test_random_bytes_after_header(data, fmt, skip):
    check(HEADERS[fmt].encode() + b"\n" + data, fmt, skip)
    check(HEADERS[fmt].encode() + b"\n" + data, "auto", skip, rate=None)


cell = st.one_of(
    st.integers(-5, 10**6).map(str), st.floats(allow_nan=True).map(repr),
    st.sampled_from(["", " ", "x", "1e309", "nan", "-0", "1_0", "2023-11-16 18:15:46.6805900",
                     "2023-02-30 00:00:00", "[1, 2]", "[1, [2]]", "1 2 3", "+7", "--1", "1.5",
                     "\"", "\x00", "٣", "1e18", "16777217", str(2**62)]),
    st.text(max_size=12),
)


@FUZZ
@given(rows=st.lists(st.lists(cell, max_size=8), max_size=8),
       fmt=st.sampled_from(list(HEADERS)), skip=st.booleans())
def test_random_csv_rows(rows, fmt, skip):
    body = "\n".join(",".join(r) for r in rows)
    check((HEADERS[fmt] + "\n" + body).encode("utf-8", "surrogatepass"), fmt, skip)


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 2**40) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=10,
)
keys = st.sampled_from([*MOONCAKE_KEYS, *GENERIC_COLUMNS, "max_new_tokens", "turn", "x"])


@FUZZ
@given(objs=st.lists(st.dictionaries(keys, json_value | st.integers(0, 3000) |
                                     st.lists(st.integers(-1, 5), max_size=8), max_size=6),
                     max_size=6),
       fmt=st.sampled_from(["mooncake", "generic", "auto"]), skip=st.booleans())
def test_random_json_rows(objs, fmt, skip):
    text = "\n".join(json.dumps(o) for o in objs)
    check(text.encode(), fmt, skip)


def test_deep_nesting_is_an_error_not_a_crash():
    check(b"[" * 100000, "mooncake", False)
    check(b'{"timestamp": ' + b"[" * 100000, "auto", False)
