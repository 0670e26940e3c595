"""Recorder: time-weighted memory breakdown, per-request rows and a bounded timeline.

Averages are integrals over the measurement window [start, end] divided by its length, so an
engine that sits idle holding only cache and free memory counts that time too. When the engine
advances many decode steps at once it hands over one breakdown row per step with its start and
end times (`add_profile`), so the integral is the same as if it had stepped.

Memory stays bounded on a day-long run: finished requests' rows go, every `CHUNK_ROWS`, into
columns (simulator/request_table.py) and, when the run streams them (`request_sink`), to the
sink, keeping in memory only the columns the summary reads. The timeline keeps at most
`max_timeline_rows` samples: when full, every other *periodic* sample is dropped and the
sampling interval doubles; the forced samples (the engine going idle: what the pool holds
while nothing runs) are kept, so the memory figures still drop to what is held in each idle
gap, until they alone fill half the rows (then they are halved too, oldest pairs first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvcore.contract.breakdown import PARTS, mean_share_pct
from simulator.gap_spill import SPILL_VALUES, GapSpill, linear_percentiles
from simulator.request_table import (
    CHUNK_ROWS,
    REQUEST_COLUMNS,  # noqa: F401  (re-exported: the table's columns)
    SUMMARY_COLUMNS,
    RequestColumns,
    RequestTable,
    chunk_columns,
)

SCALAR_PROFILE = 24  # add_steps: up to this many steps, Python floats beat numpy's calls
TIMELINE_COLUMNS = ("time_s", *PARTS, "batch_size", "waiting", "running", "host_used")


@dataclass
class Recorder:
    capacity: int
    window_start: float
    window_end: float
    timeline_interval_s: float
    max_timeline_rows: int
    # streamed runs: each chunk of finished rows, one array per column (request_table)
    request_sink: Callable[[dict[str, np.ndarray]], None] | None = None
    part_seconds: np.ndarray = field(default_factory=lambda: np.zeros(len(PARTS)))
    over_seconds: float = 0.0
    peak_token_states: int = 0
    frag_index_seconds: float = 0.0
    page_entry_seconds: float = 0.0
    iterations: int = 0
    batch_sum: int = 0
    peak_batch: int = 0
    request_rows: list[tuple] = field(default_factory=list)  # the chunk being filled
    table: RequestTable | None = None  # the finished chunks' columns (set in __post_init__)
    timeline: list[tuple] = field(default_factory=list)
    _forced: list[bool] = field(default_factory=list)  # timeline row i was a forced sample
    _last_sample: float = -1e300
    # the host KV tier now (slots used, of which locked by loads in flight), set by the engine
    # when there is one; integrated like the device parts
    host: tuple[int, int] = (0, 0)
    host_seconds: np.ndarray = field(default_factory=lambda: np.zeros(2))
    # inter-token gaps (s), each array's values `count` times over (a decode stretch hands one
    # step's time once for all its requests): pooled over requests, as the benchmarks do
    gaps: list[tuple[np.ndarray, Any]] = field(default_factory=list)
    gap_spill: GapSpill | None = None  # merged gaps moved to disk (a long run, _merge_gaps)
    # a hybrid policy's pools (its PoolKinds.pool_usage), set by the run; each kind's
    # (used, cached) bytes integrated over the window like the parts (simulator/pool_columns.py)
    pools: Callable[[], Mapping[str, Any]] | None = None
    pool_seconds: dict[str, np.ndarray] = field(default_factory=dict)
    # a hybrid policy with decode stretches: each kind's (used, cached) bytes after each step
    # of the stretch just applied (kvcore/vllm/stretch.py), set by the run
    pool_steps: Callable[[], Mapping[str, np.ndarray]] | None = None

    def _add_pools(self, w: float) -> None:
        """The pools as they are now held for `w` seconds of the window."""
        assert self.pools is not None
        for kind, u in self.pools().items():
            acc = self.pool_seconds.setdefault(kind, np.zeros(2))
            acc += (u.used_bytes * w, u.cached_bytes * w)

    def __post_init__(self) -> None:
        if self.table is None:
            self.table = RequestTable(SUMMARY_COLUMNS if self.request_sink is not None
                                      else None)

    def _clip(self, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
        return np.maximum(np.minimum(t1, self.window_end) - np.maximum(t0, self.window_start), 0.0)

    def add_interval(self, t0: float, t1: float, parts: np.ndarray, frag_index: float,
                     page_entries: int, over_reservation: int) -> None:
        """The pool held `parts` from t0 to t1."""
        w = max(min(t1, self.window_end) - max(t0, self.window_start), 0.0)
        if w > 0:
            self.part_seconds += parts * w
            if self.host[0]:
                self.host_seconds += np.array(self.host) * w
            self.over_seconds += over_reservation * w
            self.frag_index_seconds += frag_index * w
            self.page_entry_seconds += page_entries * w
            if self.pools is not None:
                self._add_pools(w)
        if t1 > self.window_start and t0 < self.window_end:
            self.peak_token_states = max(self.peak_token_states, int(parts[0]))

    def add_profile(self, starts: np.ndarray, ends: np.ndarray, parts: np.ndarray,
                    frag_index: float, page_entries: np.ndarray, over_reservation: int) -> None:
        """One breakdown row per step (rows of `parts`), step i lasting starts[i]..ends[i].
        Over-reservation does not change during decode steps, so it comes as one number."""
        ws, we = self.window_start, self.window_end
        if starts[0] >= ws and ends[-1] <= we:
            w = ends - starts  # all inside the window: what _clip returns, without its calls
            some = ends[-1] > starts[0]  # a step of nonzero length (the ends never go back)
        else:
            w = self._clip(starts, ends)
            some = bool(w.any())
        if some:
            if self.host[0]:  # step by step, as stepping adds them
                self.host_seconds = _accumulate(
                    self.host_seconds, np.array(self.host, dtype=float)[None, :] * w[:, None])
            # accumulate step by step, in order, so the sums round exactly as stepping's do:
            # one (1 + steps) x (parts + 3) matrix, the running totals in its first row,
            # accumulated down its columns (each column is a separate left-to-right sum)
            p = parts.shape[1]
            m = np.empty((len(w) + 1, p + 3))
            m[0, :p] = self.part_seconds
            m[0, p:] = (self.over_seconds, self.frag_index_seconds, self.page_entry_seconds)
            np.multiply(parts, w[:, None], out=m[1:, :p])
            np.multiply(over_reservation, w, out=m[1:, p])
            np.multiply(frag_index, w, out=m[1:, p + 1])
            np.multiply(page_entries, w, out=m[1:, p + 2])
            total = np.add.accumulate(m, axis=0)[-1]
            self.part_seconds = total[:p]
            self.over_seconds, self.frag_index_seconds, self.page_entry_seconds = \
                total[p:].tolist()
            if self.pool_steps is not None:  # step by step, as stepping adds them
                for kind, rows in self.pool_steps().items():
                    acc = self.pool_seconds.setdefault(kind, np.zeros(2))
                    self.pool_seconds[kind] = _accumulate(acc, rows * w[:, None])
            elif self.pools is not None:  # a stretch hands the pools as they end it
                self._add_pools(float(w.sum()))
        if starts[0] > ws and starts[-1] < we:  # every step overlaps the window
            self.peak_token_states = max(self.peak_token_states, int(parts[:, 0].max()))
            return
        inside = (ends > ws) & (starts < we)
        if inside.any():
            self.peak_token_states = max(self.peak_token_states, int(parts[inside, 0].max()))

    def add_steps(self, starts: list[float], ends: list[float], rows: list[list[int]],
                  frag_index: float, page_entries: list[int], over_reservation: int) -> None:
        """`add_profile` of a short stretch (at most SCALAR_PROFILE steps) from Python lists:
        the same products added to the same running totals in the same order (step by step,
        each column its own left-to-right sum), so the same doubles, without the dozen numpy
        calls on a few rows that cost more than the arithmetic
        (tests/simulator/test_short_stretch.py compares both). A run with a host tier or
        hybrid pools, or a stretch across a window edge, takes the array form."""
        ws, we = self.window_start, self.window_end
        if (len(rows) > SCALAR_PROFILE or self.host[0] or self.pools is not None
                or self.pool_steps is not None or starts[0] < ws or ends[-1] > we):
            self.add_profile(np.array(starts), np.array(ends), np.array(rows, dtype=np.int64),
                             frag_index, np.array(page_entries, dtype=np.int64),
                             over_reservation)
            return
        if ends[-1] > starts[0]:  # a step of nonzero length (the ends never go back)
            acc = self.part_seconds.tolist()
            over, frag, entry = self.over_seconds, self.frag_index_seconds, \
                self.page_entry_seconds
            for s, e, row, n_entries in zip(starts, ends, rows, page_entries, strict=True):
                w = e - s
                acc = [a + x * w for a, x in zip(acc, row, strict=True)]
                over += over_reservation * w
                frag += frag_index * w
                entry += n_entries * w
            self.part_seconds = np.array(acc)
            self.over_seconds, self.frag_index_seconds, self.page_entry_seconds = \
                over, frag, entry
        if starts[0] > ws and starts[-1] < we:  # every step overlaps the window
            peak = max([row[0] for row in rows])
        else:
            peak = max([row[0] for s, e, row in zip(starts, ends, rows, strict=True)
                        if e > ws and s < we], default=0)
        if peak > self.peak_token_states:
            self.peak_token_states = peak

    def add_iterations(self, t0: float | np.ndarray | list[float], count: int,
                       batch: int) -> None:
        """`count` iterations of `batch` requests starting at t0 (or at each of the times in
        t0); only those that start inside the window count."""
        if isinstance(t0, (np.ndarray, list)):  # the starts of a stretch's steps, in order
            if t0[0] >= self.window_start and t0[-1] <= self.window_end:
                count = len(t0)
            else:
                t = np.asarray(t0)
                count = int(((t >= self.window_start) & (t <= self.window_end)).sum())
            if count:
                self.iterations += count
                self.batch_sum += count * batch
                self.peak_batch = max(self.peak_batch, batch)
            return
        if self.window_start <= t0 <= self.window_end:
            self.iterations += count
            self.batch_sum += count * batch
            self.peak_batch = max(self.peak_batch, batch)

    def sample(self, now: float, parts: np.ndarray | list[int], batch: int, waiting: int,
               running: int, force: bool = False) -> None:
        if not force and now - self._last_sample < self.timeline_interval_s:
            return
        if len(self.timeline) >= self.max_timeline_rows:
            self._thin_timeline()
        self._last_sample = now
        row = parts if isinstance(parts, list) else np.asarray(parts, dtype=np.int64).tolist()
        self.timeline.append((now, *row, batch, waiting, running, self.host[0]))
        self._forced.append(force)

    def sample_steps(self, starts: list[float] | np.ndarray, rows: list[list[int]] | np.ndarray,
                     batch: int, waiting: int, running: int) -> None:
        """`sample` at the start of each step of a stretch (`rows`: the breakdown after each
        step), as stepping samples each iteration: the same rows at the same instants."""
        times = starts if isinstance(starts, list) else starts.tolist()
        if times[-1] - self._last_sample < self.timeline_interval_s:
            return  # the starts only grow: no earlier one is due either
        for i, t in enumerate(times):
            if t - self._last_sample >= self.timeline_interval_s:
                self.sample(t, rows[i], batch, waiting, running)

    def _thin_timeline(self) -> None:
        """Keep memory bounded (the rule in the module docstring): drop every other periodic
        sample and double the interval; forced (idle) samples stay unless they fill half the
        rows themselves."""
        forced = sum(self._forced)
        thin_forced = forced * 2 >= self.max_timeline_rows
        keep, periodic, idle = [], 0, 0
        for i, f in enumerate(self._forced):
            if f and not thin_forced:
                keep.append(i)
            elif f:
                idle += 1
                if idle % 2:
                    keep.append(i)
            else:
                periodic += 1
                if periodic % 2:
                    keep.append(i)
        self.timeline = [self.timeline[i] for i in keep]
        self._forced = [self._forced[i] for i in keep]
        self.timeline_interval_s = max(self.timeline_interval_s * 2, 1e-3)

    def add_gaps(self, values: np.ndarray, count: int = 1) -> None:
        """Inter-token gaps: every gap between two consecutive output tokens of a request.
        Every GAP_GROUPS groups the list is merged into one (distinct values, counts) group,
        so a day-long run holds its distinct gap values, not one array per decode step."""
        if len(values):
            if len(values) > 1 and values[0] == values[-1] and (values == values[0]).all():
                values, count = values[:1], count * len(values)  # the same multiset
            self.gaps.append((values, count))
            if len(self.gaps) >= GAP_GROUPS:
                self._merge_gaps()

    def _merge_gaps(self) -> None:
        """The groups as one; past SPILL_VALUES distinct values, to the spill file instead
        (simulator/gap_spill.py: a day-long run's gaps on disk, percentiles still exact)."""
        merged = merge_gap_groups(self.gaps)
        if len(merged[0]) < SPILL_VALUES:
            self.gaps = [merged]
            return
        if self.gap_spill is None:
            self.gap_spill = GapSpill()
        self.gap_spill.write(*merged)
        self.gaps = []

    def itl_percentiles(self, qs: tuple[float, ...]) -> list[float]:
        """Percentiles of the pooled gaps (numpy's linear rule over the gaps listed one by
        one); equal for any grouping of the same gaps, so stretches and stepping agree."""
        if self.gap_spill is not None:
            memory = None
            if self.gaps:
                values, counts = merge_gap_groups(self.gaps)
                memory = (values, np.cumsum(counts))
            return self.gap_spill.percentiles(memory, qs)
        return weighted_percentiles(self.gaps, qs)

    def add_request(self, row: tuple) -> None:
        self.request_rows.append(row)
        if len(self.request_rows) >= CHUNK_ROWS:
            self.flush_requests()

    def flush_requests(self) -> None:
        """The rows so far as a chunk of columns: to the sink (streamed runs) and the table."""
        if not self.request_rows:
            return
        chunk = chunk_columns(self.request_rows)
        self.request_rows = []
        if self.request_sink is not None:
            self.request_sink(chunk)
        assert self.table is not None
        self.table.add(chunk)

    def requests_columns(self) -> RequestColumns:
        """The kept columns of every finished request (all of them without a sink), as
        numpy columns (`.frame()` for pandas)."""
        self.flush_requests()
        assert self.table is not None
        return self.table.finished()

    @property
    def window_length(self) -> float:
        return max(self.window_end - self.window_start, 0.0)

    def averages(self) -> dict[str, float]:
        """Mean share of capacity per part over the window, in percent."""
        shares = mean_share_pct(self.part_seconds, self.window_length, self.capacity)
        return dict(zip(PARTS, (float(x) for x in shares), strict=True))


def _accumulate(total, terms: np.ndarray):
    """total + terms[0] + terms[1] + ..., added left to right (rows of a 2-D `terms`)."""
    first = np.asarray(total, dtype=float)[None, ...]
    return np.add.accumulate(np.concatenate([first, np.asarray(terms, dtype=float)]), axis=0)[-1]


GAP_GROUPS = 8192  # gap groups kept before they are merged (Recorder.add_gaps)


def _group_counts(groups: list[tuple[np.ndarray, Any]]) -> np.ndarray:
    """Each gap's count, in the groups' order: a merged group's own counts, and a run of
    groups with one count each as one `np.repeat` (thousands of groups per merge: one
    `np.full` each was most of a merge's time)."""
    parts: list[np.ndarray] = []
    counts: list[int] = []
    sizes: list[int] = []
    for v, c in groups:
        if isinstance(c, np.ndarray):
            if counts:
                parts.append(np.repeat(np.array(counts, dtype=np.int64), sizes))
                counts, sizes = [], []
            parts.append(c)
        else:
            counts.append(c)
            sizes.append(len(v))
    if counts:
        parts.append(np.repeat(np.array(counts, dtype=np.int64), sizes))
    return np.concatenate(parts)


def merge_gap_groups(groups: list[tuple[np.ndarray, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """The groups as one: each distinct value once with its total count. The percentiles of
    the values listed one by one depend only on that multiset, so they are unchanged
    (tests/simulator/test_request_table.py compares them)."""
    values = np.concatenate([v for v, _ in groups])
    uniq, inverse = np.unique(values, return_inverse=True)
    counts = np.bincount(inverse.ravel(), weights=_group_counts(groups), minlength=len(uniq))
    return uniq, np.rint(counts).astype(np.int64)


def weighted_percentiles(groups: list[tuple[np.ndarray, Any]], qs: tuple[float, ...]
                         ) -> list[float]:
    """np.percentile(linear) of the values each repeated its group's count (an int, or one
    per value), without building that array (a long run has one gap per output token)."""
    if not groups:
        return [float("nan")] * len(qs)
    values = np.concatenate([v for v, _ in groups])
    counts = _group_counts(groups)
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(counts[order])
    return linear_percentiles(int(cum[-1]), qs,
                              lambda rank: values[np.searchsorted(cum, rank, side="right")])
