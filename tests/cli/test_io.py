"""Atomic writes leave either the old file or the new one, never a partial one."""

from __future__ import annotations

import pandas as pd
import pytest

from reports import io


def _leftovers(d):
    return [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


def test_writer_that_raises_leaves_old_file_and_no_temp(tmp_path):
    target = tmp_path / "out.txt"
    io.atomic_write_text(target, "old")

    def bad(tmp):
        with open(tmp, "w") as fh:
            fh.write("half a fi")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        io._atomic(target, bad)
    assert target.read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_failed_first_write_leaves_nothing(tmp_path):
    class Boom(pd.DataFrame):
        def to_parquet(self, *a, **k):
            with open(a[0], "wb") as fh:
                fh.write(b"PAR1")
            raise OSError("interrupted")

    with pytest.raises(OSError):
        io.write_parquet_atomic(tmp_path / "x.parquet", Boom({"a": [1]}))
    assert list(tmp_path.iterdir()) == []


def test_helpers_round_trip(tmp_path):
    io.atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    io.write_csv_atomic(tmp_path / "t.csv", df)
    io.write_parquet_atomic(tmp_path / "t.parquet", df)
    assert pd.read_parquet(tmp_path / "t.parquet").equals(df)
    full = io.append_rows_atomic(tmp_path / "t.csv", [{"a": 3, "c": 1.5}])
    assert list(full.columns) == ["a", "b", "c"] and len(full) == 3
    assert len(pd.read_csv(tmp_path / "t.csv")) == 3
    assert _leftovers(tmp_path) == []
