"""The per-request table kept in columns (simulator/request_table.py) and streamed to Parquet
(reports.io.ParquetStream): the same frame as the rows as tuples, the same file as the frame.

Cost: the hypothesis test about 1 s; the two simulations about 2 s each on a quiet core.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reports.io import ParquetStream
from simulator import metrics
from simulator.config import SimConfig
from simulator.request_table import (
    COLUMN_KINDS,
    REQUEST_COLUMNS,
    SUMMARY_COLUMNS,
    RequestTable,
    chunk_columns,
)
from simulator.run import simulate
from workloads import build_workload
from workloads.spec import WorkloadSpec

_VALUE = {
    "i": st.one_of(st.none(), st.integers(0, 2**40)),
    "f": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=64)),
    "s": st.one_of(st.none(), st.sampled_from(["completed", "rejected", "too long"])),
}
_ROW = st.tuples(*(_VALUE[COLUMN_KINDS[c]] for c in REQUEST_COLUMNS))


def _only_missing(rows: list[tuple], i: int) -> bool:
    return all(r[i] is None for r in rows)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(_ROW, max_size=6), max_size=4))
def test_chunked_columns_equal_the_frame_of_the_tuples(chunks):
    """Any rows in any chunking give pandas' own frame of the tuples: values and dtypes (int64
    without a missing value, float64 with one, object text). The one documented exception: a
    number column with only missing values is float64 NaN here, object None there."""
    table = RequestTable()
    for rows in chunks:
        table.add(chunk_columns(rows))
    rows = [r for rows in chunks for r in rows]
    got = table.frame()
    want = pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))
    assert list(got.columns) == list(REQUEST_COLUMNS) and len(got) == len(want)
    for i, c in enumerate(REQUEST_COLUMNS):
        if rows and COLUMN_KINDS[c] != "s" and _only_missing(rows, i):
            assert got[c].dtype == np.float64 and got[c].isna().all()
            continue
        pd.testing.assert_series_equal(got[c], want[c], check_exact=True)


def test_kept_columns_only():
    rows = [(1, None, 0, "completed", None, *([0.5] * 8), *([3] * 10), 0.0)]
    table = RequestTable(SUMMARY_COLUMNS)
    table.add(chunk_columns(rows))
    assert list(table.frame().columns) == list(SUMMARY_COLUMNS)
    with pytest.raises(ValueError, match="unknown columns"):
        RequestTable(["nope"])


def _workload():
    # closed-loop sessions (session ids), a pool too small for some prompts (rejections,
    # missing admit times), several chunks of rows (CHUNK_ROWS patched small)
    return build_workload(WorkloadSpec(name="chat", num_requests=60, seed=3,
                                       max_context_len=2048))


def _cfg():
    return SimConfig.of(policy="paged", page_size=16, kv_tokens=1200, max_context_len=2048,
                        latency="constant")


def test_streamed_file_equals_the_in_memory_table(tmp_path, monkeypatch):
    """Every column, every row: the Parquet file a streamed run writes (several row groups)
    equals the table of the same run kept in memory, and the two summaries are equal."""
    monkeypatch.setattr(metrics, "CHUNK_ROWS", 7)
    w = _workload()
    full = simulate(w, _cfg())
    path = tmp_path / "requests.parquet"
    tags = {"config_hash": "abc", "policy": "paged", "page_size": 16}
    with ParquetStream(path, COLUMN_KINDS, tags) as stream:
        streamed = simulate(w, _cfg(), request_sink=stream.write)
        stream.commit()
    frame = full.requests
    assert (frame.status == "rejected").any() and frame.admit_s.isna().any()
    assert frame.session_id.notna().all() and len(frame) > 14  # three chunks at least
    disk = pd.read_parquet(path)
    assert stream.rows == len(frame)
    import pyarrow.parquet as pq

    assert pq.ParquetFile(path).num_row_groups == math.ceil(len(frame) / 7)
    assert (disk[list(tags)] == pd.Series(tags)).all().all()
    pd.testing.assert_frame_equal(disk.drop(columns=list(tags)), frame, check_dtype=False,
                                  check_exact=True)
    # the streamed run kept only the summary's columns, and its summary is the same
    assert list(streamed.columns.columns) == list(SUMMARY_COLUMNS)
    a = {k: v for k, v in full.summary.items() if k != "sim_wall_s"}
    b = {k: v for k, v in streamed.summary.items() if k != "sim_wall_s"}
    assert a.keys() == b.keys()
    assert all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a), \
        [k for k in a if a[k] != b[k] and a[k] == a[k]]


class Interrupted(Exception):
    pass


def test_interrupted_run_leaves_no_file(tmp_path, monkeypatch):
    """A run that fails after row groups were written publishes nothing and leaves no
    temporary: neither requests.parquet nor a .tmp."""
    from experiments.answers.runner import simulate_options
    from experiments.options.run_options import RunOptions

    monkeypatch.setattr(metrics, "CHUNK_ROWS", 5)
    opts = RunOptions.from_mapping({"workload": "sharegpt", "num_requests": 40,
                                    "kv_tokens": 8000, "max_context_len": 2048,
                                    "latency": "constant", "rate": 50.0})
    seen = []

    def boom(*args, **kwargs):  # the schedule observer fails once rows were streamed
        seen.append(1)
        if len(list(tmp_path.glob(".requests.parquet.*.tmp"))) and len(seen) > 20:
            raise Interrupted

    with pytest.raises(Interrupted):
        simulate_options(opts, event_sink=boom, requests_file=tmp_path / "requests.parquet")
    assert list(tmp_path.iterdir()) == []
    _row, result = simulate_options(opts, requests_file=tmp_path / "requests.parquet")
    assert [p.name for p in tmp_path.iterdir()] == ["requests.parquet"]
    assert len(result.requests) == 40 and "config_hash" not in result.requests.columns


def test_timeline_stays_bounded_and_keeps_idle_samples():
    """The timeline's thinning rule (simulator/metrics.py): never more than max rows; the
    forced (idle) samples survive thinning until they fill half the rows; time stays sorted."""
    rec = metrics.Recorder(capacity=100, window_start=0.0, window_end=1e9,
                           timeline_interval_s=1.0, max_timeline_rows=40)
    parts = np.array([5, 0, 0, 0, 0, 95])
    forced_times = []
    for i in range(2000):
        t = float(i)
        force = i % 50 == 0  # the engine went idle
        if force:
            forced_times.append(t)
        rec.sample(t, parts, 0, 0, 0, force=force)
        assert len(rec.timeline) <= 40
        times = [r[0] for r in rec.timeline]
        assert times == sorted(times)
        if len(forced_times) < 20:  # fewer than half the rows: every idle sample is kept
            assert set(forced_times) <= set(times)
    assert rec.timeline_interval_s > 1.0
    assert len(rec.timeline) == len(rec._forced)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from([0.001, 0.002, 0.0025, 0.01, 0.5, 0.0]),
                                   min_size=1, max_size=6),
                          st.integers(1, 40)), min_size=1, max_size=12),
       st.integers(1, 11))
def test_merged_gap_groups_keep_the_percentiles_exactly(groups, cut):
    """Merging the first groups (as Recorder.add_gaps does every GAP_GROUPS) leaves every ITL
    percentile bit for bit what np.percentile gives over the gaps listed one by one."""
    groups = [(np.array(v), c) for v, c in groups]
    merged = [metrics.merge_gap_groups(groups[:cut]), *groups[cut:]]
    flat = np.concatenate([np.repeat(v, c) for v, c in groups])
    qs = (0.0, 12.5, 50.0, 90.0, 99.0, 100.0)
    want = [float(np.percentile(flat, q)) for q in qs]
    assert metrics.weighted_percentiles(merged, qs) == want
    assert metrics.weighted_percentiles(groups, qs) == want
