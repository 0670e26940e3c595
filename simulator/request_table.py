"""The per-request table, column by column, in chunks: what a day-long run keeps in memory.

A run of a million requests cannot keep its result rows as Python tuples (about 1 KB each).
The recorder hands finished rows here in chunks of `CHUNK_ROWS`; each chunk becomes one numpy
array per column (`chunk_columns`). A run that streams its rows to disk (`kvsim run --out`)
passes every chunk to its sink and keeps only `SUMMARY_COLUMNS`, the ones the summary reads
(percentiles, the overload verdict, the reuse gap, the SLO columns); a run without a sink
keeps every column.

The final columns (`RequestColumns`; a pandas frame only when asked for, so a run whose
caller reads the summary alone never imports pandas) have the dtypes pandas infers from the
rows as tuples, so summaries and digests are exactly what they were when the recorder built
the frame from a list of tuples:
an integer column with a missing value (`None`) is float64 with NaN, else int64; a float
column is float64; a text column is object (str or None). Each column's kind is fixed here,
so every chunk of a streamed file has the same schema (`COLUMN_KINDS`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

CHUNK_ROWS = 8192  # rows per chunk: one Parquet row group of a streamed run

REQUEST_COLUMNS = (
    "request_id", "session_id", "turn", "status", "reject_reason", "arrival_s", "admit_s",
    "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "normalized_latency_s",
    "prompt_len", "output_len", "final_len", "cached_tokens", "token_hit_tokens",
    "preemptions", "recomputed_tokens", "swapped_tokens", "host_hit_tokens",
    "storage_hit_tokens", "load_stall_s",
)  # fmt: skip

# "i": integers, None when missing; "f": floats (None -> NaN); "s": text or None
COLUMN_KINDS: dict[str, str] = {
    "request_id": "i", "session_id": "i", "turn": "i", "status": "s", "reject_reason": "s",
    "arrival_s": "f", "admit_s": "f", "first_token_s": "f", "finish_s": "f", "ttft_s": "f",
    "tpot_s": "f", "e2e_s": "f", "normalized_latency_s": "f", "prompt_len": "i",
    "output_len": "i", "final_len": "i", "cached_tokens": "i", "token_hit_tokens": "i",
    "preemptions": "i", "recomputed_tokens": "i", "swapped_tokens": "i",
    "host_hit_tokens": "i", "storage_hit_tokens": "i", "load_stall_s": "f",
}  # fmt: skip

# what simulator.run, simulator.overload, simulator.reuse_gap and experiments.answers.slo read
SUMMARY_COLUMNS = ("request_id", "status", "arrival_s", "admit_s", "first_token_s",
                   "finish_s", "ttft_s", "tpot_s", "normalized_latency_s", "prompt_len",
                   "cached_tokens")


def chunk_columns(rows: Sequence[tuple]) -> dict[str, np.ndarray]:
    """Rows (REQUEST_COLUMNS order) as one array per column: float64 for numbers (None ->
    NaN), object for text."""
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(REQUEST_COLUMNS)
    out: dict[str, np.ndarray] = {}
    for name, values in zip(REQUEST_COLUMNS, cols, strict=True):
        if COLUMN_KINDS[name] == "s":
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            out[name] = arr
        else:
            out[name] = np.array(values, dtype=np.float64)
    return out


def _final(name: str, arr: np.ndarray) -> np.ndarray:
    """An integer column without a missing value is int64 (pandas' inference from tuples)."""
    if COLUMN_KINDS[name] == "i" and len(arr) and not np.isnan(arr).any() \
            and bool(np.all(arr == np.floor(arr))):
        return arr.astype(np.int64)
    return arr


def column(requests, name: str) -> np.ndarray:
    """Column `name` of a `RequestColumns` or a pandas frame, as a numpy array."""
    col = requests[name]
    return col if isinstance(col, np.ndarray) else col.to_numpy()


def nan_mean(values: np.ndarray) -> float:
    """The mean of the non-NaN values as pandas' `Series.mean()` computes it (NaN filled
    with 0, one sum over the whole array, divided by the count), so the same double."""
    values = np.asarray(values, dtype=np.float64)
    if not len(values):
        return float("nan")
    mask = np.isnan(values)
    if mask.any():
        values = np.where(~mask, values, 0.0)
    count = np.float64(len(values) - int(mask.sum()))
    return float(values.sum() / count) if count > 0 else float("nan")


def nan_median(values: np.ndarray) -> float:
    """The median of the non-NaN values, as pandas' `Series.median()` takes it."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    return float(np.median(values)) if len(values) else float("nan")


def nan_sum(values: np.ndarray) -> float:
    """The sum of the non-NaN values, as pandas' `Series.sum()` takes it, as a float."""
    if values.dtype.kind == "f":
        mask = np.isnan(values)
        if mask.any():
            values = np.where(~mask, values, 0.0)
    return float(values.sum())


class RequestColumns:
    """The finished requests' table as one numpy array per column, read by the summary
    (simulator/run.py, overload.py, reuse_gap.py) as a frame's columns are: `cols[name]`,
    `name in cols`, `len(cols)` (rows). `frame()` builds the pandas frame, importing pandas
    then, so a caller that reads only the summary never pays pandas' import."""

    def __init__(self, data: dict[str, np.ndarray], names: Sequence[str], rows: int) -> None:
        self._data, self.names, self.rows = data, tuple(names), rows

    def __getitem__(self, name: str) -> np.ndarray:
        return self._data[name]

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __len__(self) -> int:
        return self.rows

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def frame(self) -> pd.DataFrame:
        """The columns as a frame (no rows: object columns, as an empty list of tuples
        gives)."""
        import pandas as pd

        if self.rows == 0:
            return pd.DataFrame([], columns=list(self.names))
        return pd.DataFrame(self._data, copy=False)


class RequestTable:
    """Chunks of columns; `keep`: the columns kept in memory (None: all)."""

    def __init__(self, keep: Sequence[str] | None = None) -> None:
        unknown = sorted(set(keep or ()) - set(REQUEST_COLUMNS))
        if unknown:
            raise ValueError(f"RequestTable keep: unknown columns {unknown}")
        self.columns: tuple[str, ...] = tuple(REQUEST_COLUMNS if keep is None else
                                              [c for c in REQUEST_COLUMNS if c in keep])
        self._chunks: dict[str, list[np.ndarray]] = {c: [] for c in self.columns}
        self.rows = 0

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        for c in self.columns:
            self._chunks[c].append(chunk[c])
        self.rows += len(chunk[REQUEST_COLUMNS[0]])

    def finished(self) -> RequestColumns:
        """The kept columns, each as one array with its final dtype."""
        data: dict[str, np.ndarray] = {}
        if self.rows:
            for c in self.columns:
                parts = self._chunks[c]
                arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
                self._chunks[c] = [arr]  # one array from now on (may be called again)
                data[c] = _final(c, arr)
        return RequestColumns(data, self.columns, self.rows)

    def frame(self) -> pd.DataFrame:
        """The kept columns as one frame (no rows: object columns, as an empty list of
        tuples gives)."""
        return self.finished().frame()


__all__ = ["CHUNK_ROWS", "COLUMN_KINDS", "REQUEST_COLUMNS", "SUMMARY_COLUMNS", "RequestColumns",
           "RequestTable", "chunk_columns", "column", "nan_mean", "nan_median", "nan_sum"]
