"""Inter-token gaps of a long run kept on disk, with exact percentiles read back.

The pooled inter-token-gap percentiles (`itl_p50_s`, `itl_p99_s`) are exact: numpy's linear
rule over every gap of every request. The recorder keeps the gaps as (distinct value, count)
groups (simulator/metrics.py), but a decode step's time depends on its batch's contexts, so
nearly every step adds a distinct value: about 15-30 a request, 16 bytes each, so hundreds of
megabytes over a day of traffic. `GapSpill` takes the merged groups out of memory once they
exceed `SPILL_VALUES` values and appends each to an anonymous temporary file (removed when
closed or when the process ends) as a *sorted run*: its distinct values in ascending order,
then their running counts. A run that never gets there never touches the file.

A percentile needs the values at two ranks of the sorted expansion (floor(h) and
floor(h) + 1 of numpy's rule). The value at rank r is the smallest value x with more than r
gaps <= x; the count of gaps <= x is, per sorted run, the running count just before the
run's first value above x (one binary search), summed over the runs. So the value is found by
bisection over the values' order-preserving 64-bit keys (at most 64 probes), each probe one
binary search per run over the memory-mapped file: only the pages those searches touch are
read, never the whole file, and the answer is exactly the value at that rank, so the
percentiles equal `weighted_percentiles` over the same groups
(tests/simulator/test_gap_spill.py). Gaps are finite (differences of step end times).
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

SPILL_VALUES = 1 << 18  # merged distinct gap values kept in memory before they go to disk

#: a sorted run: distinct values ascending, and the running count of the gaps up to each
Run = tuple[np.ndarray, np.ndarray]

_SIGN = 1 << 63
_ALL = (1 << 64) - 1


def _key(x: float) -> int:
    """A float's order-preserving unsigned 64-bit key (negatives flipped, positives offset)."""
    (b,) = struct.unpack("<Q", struct.pack("<d", x))
    return (~b & _ALL) if b & _SIGN else b | _SIGN


def _value(key: int) -> float:
    """The float whose key is `key` (the inverse of `_key`)."""
    b = key ^ _SIGN if key & _SIGN else ~key & _ALL
    (x,) = struct.unpack("<d", struct.pack("<Q", b))
    return float(x)


def linear_percentiles(n: int, qs: tuple[float, ...] | list[float],
                       value_at: Callable[[int], Any]) -> list[float]:
    """numpy's "linear" percentile method over n sorted values, its arithmetic included (h,
    then its lerp), reading only the two values each percentile needs (`value_at(rank)`): the
    gaps are never expanded into one array, in memory or from the spill file."""
    out = []
    for q in qs:
        h = (q / 100.0) * (n - 1)
        lo = int(np.floor(h))
        hi = min(lo + 1, n - 1)
        t = h - lo
        a, b = value_at(lo), value_at(hi)
        out.append(float(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t))
    return out


def count_at_most(runs: list[Run], x: float) -> int:
    """Gaps <= x over the sorted runs: each run's running count before its first value > x."""
    total = 0
    for values, cum in runs:
        i = int(np.searchsorted(values, x, side="right"))
        if i:
            total += int(cum[i - 1])
    return total


def select(runs: list[Run], rank: int) -> float:
    """The value at 0-based `rank` of the runs' gaps expanded and sorted: the smallest key
    whose value has more than `rank` gaps at or below it (a count that only grows with the
    key, and jumps only at a gap's value, so that key is a gap's)."""
    lo = min(_key(float(v[0])) for v, _ in runs)
    hi = max(_key(float(v[-1])) for v, _ in runs)
    while lo < hi:  # every key between two finite floats' keys is a finite float's
        mid = (lo + hi) // 2
        if count_at_most(runs, _value(mid)) > rank:
            hi = mid
        else:
            lo = mid + 1
    return _value(lo)


class GapSpill:
    """Sorted runs of gaps appended to a temporary file; `percentiles` reads them back."""

    def __init__(self) -> None:
        # closed by close() or with the process (an anonymous file: nothing left behind)
        self._file = tempfile.TemporaryFile(prefix="kvsim-gaps-")  # noqa: SIM115
        self._runs: list[tuple[int, int]] = []  # (byte offset, values) of each run
        self.values = 0

    def write(self, values: np.ndarray, counts: np.ndarray) -> None:
        """One run: distinct values in ascending order (`merge_gap_groups`' result) with
        their int64 counts."""
        self._file.seek(0, 2)
        self._runs.append((self._file.tell(), len(values)))
        self._file.write(np.ascontiguousarray(values, dtype=np.float64).tobytes())
        self._file.write(np.cumsum(counts, dtype=np.int64).tobytes())
        self.values += len(values)

    def close(self) -> None:
        self._file.close()

    def percentiles(self, memory: Run | None, qs: tuple[float, ...]) -> list[float]:
        """`weighted_percentiles` over the spilled runs and `memory`, the gaps not spilled
        as one more run (values ascending, running counts), or None."""
        runs = self._mapped_runs()
        if memory is not None and len(memory[0]):
            runs.append(memory)
        n = sum(int(cum[-1]) for _, cum in runs)
        if n == 0:
            return [float("nan")] * len(qs)
        return linear_percentiles(n, qs, lambda rank: select(runs, rank))

    def _mapped_runs(self) -> list[Run]:
        """The runs on disk as views of one read-only memory map (unmapped when the last
        view goes)."""
        if not self._runs:
            return []
        self._file.flush()
        mapped = np.memmap(self._file, dtype=np.uint8, mode="r")
        runs = []
        for offset, n in self._runs:
            values = mapped[offset: offset + 8 * n].view(np.float64)
            cum = mapped[offset + 8 * n: offset + 16 * n].view(np.int64)
            runs.append((values, cum))
        return runs


__all__ = ["SPILL_VALUES", "GapSpill", "Run", "count_at_most", "linear_percentiles", "select"]
