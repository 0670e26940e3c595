"""Atomic writes: a temporary file in the target's directory, then `os.replace`.

A reader (or a resumed sweep) therefore sees either the old file or the new one, never a
half-written one, even if the writer raises or the process is killed mid-write.
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


_MODE = 0o666 & ~_umask()  # what a plain open() would give (mkstemp makes 0600)


STALE_TEMP_S = 600.0  # a temp this old belongs to a writer that died (kill -9, power loss)


def remove_stale_temps(target: Path, older_than_s: float = STALE_TEMP_S) -> int:
    """Delete `target`'s temporaries left by a killed writer (never a live writer's: those
    are younger than `older_than_s`); returns how many went."""
    removed = 0
    for p in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - p.stat().st_mtime > older_than_s:
                p.unlink()
                removed += 1
    return removed


def _atomic(path: str | Path, write: Callable[[str], None]) -> Path:
    """Call `write(tmp_path)`, then move the result over `path`; on error remove the temp.
    Temporaries of `path` left by a killed earlier writer are removed first."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _MODE)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def check_writable(path: str | Path, flag: str = "--out") -> None:
    """ValueError (one line, naming `flag`) unless results can be written under directory
    `path`: checked before a simulation starts, so a long run does not fail at its end. The
    nearest existing ancestor must be a directory in which a file can be created (a probe
    file, removed at once: permission bits alone miss a read-only file system or root)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{flag} {str(path)!r} exists and is not a directory")
    probe_dir = target
    while not probe_dir.exists():
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise ValueError(f"{flag} {str(path)!r}: {str(probe_dir)!r} is a file, not a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kvsim-write-check.", dir=probe_dir)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ValueError(f"{flag} {str(path)!r} is not writable ({e.strerror or e})") from None


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    def w(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    return _atomic(path, w)


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_csv_atomic(path: str | Path, df: pd.DataFrame) -> Path:
    return _atomic(path, lambda tmp: df.to_csv(tmp, index=False))


def write_parquet_atomic(path: str | Path, df: pd.DataFrame) -> Path:
    return _atomic(path, lambda tmp: df.to_parquet(tmp, index=False))


# a column kind (simulator/request_table.py) -> its Parquet type
_ARROW_KINDS = {"i": "int64", "f": "float64", "s": "string"}


class ParquetStream:
    """A Parquet file written in row groups as a run goes, published atomically: the groups go
    to a temporary file beside `path` (named as `_atomic`'s, so a killed writer's leftover is
    removed by the next writer of `path`), and `commit()` renames it over `path`; `abort()`
    (or an exception inside a `with` block) removes it. A reader never sees a half file.

    `kinds`: column -> "i" (integers, NaN = missing), "f" (floats) or "s" (text or None), in
    file order; `constants`: columns of one value on every row (a run's tags), after them."""

    def __init__(self, path: str | Path, kinds: Mapping[str, str],
                 constants: Mapping[str, Any] | None = None) -> None:
        import pyarrow as pa

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.path)
        self.kinds = dict(kinds)
        self.constants = dict(constants or {})
        fields = [pa.field(c, _ARROW_KINDS[k]) for c, k in self.kinds.items()]
        fields += [pa.field(c, pa.string() if isinstance(v, str) else pa.int64())
                   for c, v in self.constants.items()]
        self.schema = pa.schema(fields)
        self.rows = 0
        self.tmp: str | None = None
        self._writer: Any = None

    def _open(self) -> None:
        """The temporary file, made at the first row group (or the commit of a run without
        rows): a short run killed by SIGKILL leaves nothing behind, a long one a hidden
        temporary that the next writer of `path` removes (`remove_stale_temps`)."""
        import pyarrow.parquet as pq

        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                        dir=self.path.parent)
        os.close(fd)
        self._writer = pq.ParquetWriter(self.tmp, self.schema)

    def write(self, columns: Mapping[str, Any]) -> None:
        """One row group: every column of `kinds`, as equal-length numpy arrays."""
        import numpy as np
        import pyarrow as pa

        n = len(next(iter(columns.values())))
        arrays = []
        for c, k in self.kinds.items():
            v = columns[c]
            if k == "i":
                missing = np.isnan(v)
                arrays.append(pa.array(np.where(missing, 0, v).astype(np.int64),
                                       mask=missing if missing.any() else None))
            elif k == "f":
                arrays.append(pa.array(v, type=pa.float64(), from_pandas=True))
            else:
                arrays.append(pa.array(v, type=pa.string(), from_pandas=True))
        for c, v in self.constants.items():
            arrays.append(pa.array([v] * n, type=self.schema.field(c).type))
        if self._writer is None:
            self._open()
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))
        self.rows += n

    def commit(self) -> Path:
        """Close the file and move it over `path`."""
        if self._writer is None:
            self._open()
        assert self.tmp is not None
        self._writer.close()
        try:
            os.chmod(self.tmp, _MODE)
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Close and remove the temporary file: nothing is published."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)

    def __enter__(self) -> ParquetStream:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:
            self.abort()


def save_figure_atomic(path: str | Path, fig: Any, **kwargs: Any) -> Path:
    """A matplotlib figure as PNG (format given explicitly: the temp name has no suffix)."""
    return _atomic(path, lambda tmp: fig.savefig(tmp, format="png", **kwargs))


def read_csv_or_empty(path: str | Path) -> pd.DataFrame:
    """The CSV as a frame (empty when missing or empty), consolidated: the parser leaves a wide
    summary.csv as one block per column, and the first `.assign` on it would print pandas'
    PerformanceWarning into `plan` and `report` output."""
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return pd.DataFrame()
    return pd.read_csv(p).copy()


def append_rows_atomic(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Add rows to a CSV by rewriting the whole file atomically (columns are the union, in
    first-seen order); returns the full table."""
    old = read_csv_or_empty(path)
    new = pd.DataFrame(list(rows))
    df = new if old.empty else pd.concat([old, new], ignore_index=True, sort=False)
    write_csv_atomic(path, df)
    return df
