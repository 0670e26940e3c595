"""Inter-token gaps of a long run kept on disk, with exact percentiles read back.

The pooled inter-token-gap percentiles (`itl_p50_s`, `itl_p99_s`) are exact: numpy's linear
rule over every gap of every request. The recorder keeps the gaps as (distinct value, count)
groups (simulator/metrics.py), but a decode step's time depends on its batch's contexts, so
nearly every step adds a distinct value: about 15-30 a request, 16 bytes each, so 250-450 MB
over a day of traffic. `GapSpill` takes the merged groups out of memory once they exceed
`SPILL_VALUES` values and appends them to an anonymous temporary file (removed when closed or
when the process ends); a run that never gets there never touches it.

The percentiles are then found without loading the file whole: each wanted rank (the values
at ranks floor(h) and floor(h) + 1 of numpy's rule) is selected by a radix search over the
values' order-preserving 64-bit keys, 16 bits per pass, each pass a weighted histogram over
the file's chunks and the groups still in memory. The value found is exactly the one at that
rank in the sorted expansion, so the percentiles equal `weighted_percentiles` over the same
groups (tests/simulator/test_gap_spill.py).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

SPILL_VALUES = 1 << 18  # merged distinct gap values kept in memory before they go to disk
_BITS = 16  # key bits fixed per radix pass (a 65,536-bin histogram)


def _keys(values: np.ndarray) -> np.ndarray:
    """float64 -> uint64 with the same order (negative values flipped, positives offset)."""
    b = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    return np.where(b >> np.uint64(63), ~b, b | np.uint64(1 << 63))


def _value(key: int) -> float:
    b = np.uint64(key)
    raw = b ^ np.uint64(1 << 63) if b >> np.uint64(63) else ~b
    return float(np.array([raw], dtype=np.uint64).view(np.float64)[0])


def _counts(values: np.ndarray, count: Any) -> np.ndarray:
    return count if isinstance(count, np.ndarray) else np.full(len(values), count, np.int64)


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


class GapSpill:
    """Gap groups appended to a temporary file; `percentiles` reads them back in chunks."""

    def __init__(self) -> None:
        # closed by close() or with the process (an anonymous file: nothing left behind)
        self._file = tempfile.TemporaryFile(prefix="kvsim-gaps-")  # noqa: SIM115
        self._chunks: list[tuple[int, int]] = []  # (byte offset, values) of each group
        self.values = 0

    def write(self, values: np.ndarray, counts: np.ndarray) -> None:
        """One group: distinct (or not) values with their int64 counts."""
        self._file.seek(0, 2)
        self._chunks.append((self._file.tell(), len(values)))
        self._file.write(np.ascontiguousarray(values, dtype=np.float64).tobytes())
        self._file.write(np.ascontiguousarray(counts, dtype=np.int64).tobytes())
        self.values += len(values)

    def _groups(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for offset, n in self._chunks:
            self._file.seek(offset)
            values = np.fromfile(self._file, dtype=np.float64, count=n)
            yield values, np.fromfile(self._file, dtype=np.int64, count=n)

    def close(self) -> None:
        self._file.close()

    def percentiles(self, memory: list[tuple[np.ndarray, Any]], qs: tuple[float, ...]
                    ) -> list[float]:
        """`weighted_percentiles` over the spilled groups and `memory` (groups not spilled)."""

        def groups() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            yield from self._groups()
            for v, c in memory:
                yield v, _counts(v, c)

        n = sum(int(c.sum()) for _, c in groups())
        if n == 0:
            return [float("nan")] * len(qs)
        return linear_percentiles(n, qs, lambda rank: self._select(groups, rank))

    @staticmethod
    def _select(groups, rank: int) -> np.float64:
        """The value at 0-based `rank` of the groups' values expanded and sorted."""
        prefix, fixed = 0, 0
        while fixed < 64:
            hist = np.zeros(1 << _BITS, dtype=np.int64)
            shift = np.uint64(64 - fixed - _BITS)
            for values, counts in groups():
                k = _keys(values)
                if fixed:
                    sel = (k >> np.uint64(64 - fixed)) == np.uint64(prefix)
                    k, counts = k[sel], counts[sel]
                bins = ((k >> shift) & np.uint64((1 << _BITS) - 1)).astype(np.int64)
                hist += np.bincount(bins, weights=counts, minlength=1 << _BITS).astype(np.int64)
            cum = np.cumsum(hist)
            b = int(np.searchsorted(cum, rank, side="right"))
            rank -= int(cum[b - 1]) if b else 0
            prefix = (prefix << _BITS) | b
            fixed += _BITS
        return np.float64(_value(prefix))


__all__ = ["SPILL_VALUES", "GapSpill"]
