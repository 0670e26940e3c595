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
