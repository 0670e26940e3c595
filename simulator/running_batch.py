"""`RunningBatch`: the engine's running requests, in order, with their decode state in numpy
columns, so that a decode step or a stretch of k steps updates every request in a few array
operations instead of a Python loop over the batch.

Why columns: a run of the whole Azure conversation trace makes about 90,000 engine passes over
batches of tens to hundreds of requests; per-request Python (attribute reads and writes, tiny
numpy arrays built from lists) was most of the engine's own time. The stretch planner, the
latency model, the admission budget and the inter-token gaps read the columns directly.

While a request is in the batch its `written`, `decoded` and `last_token_s` live in the
columns and the `SimRequest` fields are stale. They are written back when the request leaves
(`remove`, `remove_done`) and before anything reads the requests themselves (iterating the
batch, indexing it: `sync`), so code that walks the running list as before sees exact values.
The other columns (rid, output_len, max_new) never change while running.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from simulator.request import CLIP_MAX_NEW_TOKENS, SimRequest

_INITIAL = 64
_INT_COLUMNS = ("rid", "written", "decoded", "output_len", "max_new")


class RunningBatch:
    """The running list (order kept: it is the batch order of every decode call)."""

    __slots__ = ("_dirty", "_ints", "_left", "_rem_sum", "_same_last", "decoded", "last_token_s",
                 "max_new", "n", "output_len", "reqs", "rid", "written")

    def __init__(self) -> None:
        self.reqs: list[SimRequest] = []
        self.n = 0
        # the integer columns as the rows of one matrix, so that a request leaving moves
        # every column in one operation; rid, written, ... are views of its rows
        self._ints = np.zeros((len(_INT_COLUMNS), _INITIAL), dtype=np.int64)
        self.last_token_s = np.zeros(_INITIAL, dtype=float)
        self._views()
        self._dirty = False  # columns changed since the requests' fields were written
        # every row's last_token_s when they are known to be one value (after a step of the
        # whole batch they are), else None: the gaps of a step are then one value n times
        self._same_last: float | None = None
        # the smallest output_len - decoded over the rows, or None when not known: kept
        # through appends and whole-batch steps, so that most passes answer the stretch's
        # horizon and "did anyone finish" without an array reduction
        self._left: int | None = None
        # the sum of remaining_new() while no row's decoded count and no membership changed
        # (None: not known): an admission round asks it for every candidate, and the
        # fast-forward asked it for the head just before, with nothing changed between
        self._rem_sum: int | None = None

    def _views(self) -> None:
        self.rid, self.written, self.decoded, self.output_len, self.max_new = self._ints

    # -- membership ------------------------------------------------------------------------
    def append(self, s: SimRequest) -> None:
        """`s` starts running (its fields are current): copy them into a new last row."""
        i = self.n
        if i == len(self.last_token_s):
            self._grow()
        self._ints[:, i] = (s.rid, s.written, s.decoded, s.output_len, s.max_new)
        self.last_token_s[i] = s.last_token_s
        left = s.output_len - s.decoded
        if i == 0 or (self._left is not None and left < self._left):
            self._left = left
        if i == 0:
            self._same_last = s.last_token_s
        elif self._same_last is not None and s.last_token_s != self._same_last:
            self._same_last = None
        self.reqs.append(s)
        self.n = i + 1
        self._rem_sum = None

    def _grow(self) -> None:
        n, cap = self.n, 2 * len(self.last_token_s)
        ints = np.zeros((len(_INT_COLUMNS), cap), dtype=np.int64)
        ints[:, :n] = self._ints[:, :n]
        last = np.zeros(cap, dtype=float)
        last[:n] = self.last_token_s[:n]
        self._ints, self.last_token_s = ints, last
        self._views()

    def remove(self, s: SimRequest) -> None:
        """`s` leaves (preempted or finished): its fields written back, later rows move up."""
        i = self.reqs.index(s)
        self._write_back(i)
        self._left = self._rem_sum = None
        del self.reqs[i]
        n = self.n
        self._ints[:, i: n - 1] = self._ints[:, i + 1: n]
        self.last_token_s[i: n - 1] = self.last_token_s[i + 1: n]
        self.n = n - 1

    def remove_done(self, upto: int) -> list[SimRequest]:
        """Those of the first `upto` rows that decoded their whole output leave, in batch
        order, their fields written back; returns them (to finish, in that order)."""
        if self._left is not None and self._left > 0:
            return []  # nobody has decoded its whole output
        idx = (self.decoded[:upto] >= self.output_len[:upto]).nonzero()[0].tolist()
        if not idx:
            return []
        out = [self.reqs[i] for i in idx]
        if len(idx) == 1:
            self.remove(out[0])
            return out
        for i in idx:
            self._write_back(i)
        n = self.n
        keep = np.ones(n, dtype=bool)
        keep[idx] = False
        m = n - len(idx)
        self._ints[:, :m] = self._ints[:, :n][:, keep]
        self.last_token_s[:m] = self.last_token_s[:n][keep]
        self._left = self._rem_sum = None
        gone = set(idx)
        self.reqs = [s for i, s in enumerate(self.reqs) if i not in gone]
        self.n = m
        return out

    def _write_back(self, i: int) -> None:
        s = self.reqs[i]
        s.written = int(self.written[i])
        s.decoded = int(self.decoded[i])
        s.last_token_s = float(self.last_token_s[i])

    def sync(self) -> None:
        """Write every request's columns back to its fields (before code reads them)."""
        if not self._dirty:
            return
        n = self.n
        for s, w, d, t in zip(self.reqs, self.written[:n].tolist(), self.decoded[:n].tolist(),
                              self.last_token_s[:n].tolist(), strict=True):
            s.written, s.decoded, s.last_token_s = w, d, t
        self._dirty = False

    # -- decode steps ----------------------------------------------------------------------
    def stepped(self, upto: int, k: int, first: float, last: float
                ) -> tuple[np.ndarray, int]:
        """The first `upto` rows decoded k tokens each, the first at `first`, the last at
        `last`. Returns their inter-token gaps (previous token to `first`) as (values, count):
        each value `count` times (one value when all rows had the same previous token)."""
        n = self.n
        if upto == n and self._same_last is not None:
            gaps = (np.array([first - self._same_last]), n)
        else:
            gaps = (first - self.last_token_s[:upto], 1)
        self.last_token_s[:upto] = last
        self.decoded[:upto] += k
        self._rem_sum = None
        if upto == n and self._left is not None:
            self._left -= k
        elif upto:
            self._left = None
        self._dirty = True
        if upto == n or (self.last_token_s[upto:n] == last).all():
            self._same_last = last
        else:
            self._same_last = None
        return gaps

    def wrote(self, upto: int, k: int) -> None:
        """The first `upto` rows wrote k more tokens each (the policy allocated them)."""
        self.written[:upto] += k
        self._dirty = True

    # -- reads -----------------------------------------------------------------------------
    def rids(self) -> list[int]:
        return self.rid[: self.n].tolist()

    def remaining_new(self) -> np.ndarray:
        """SGLang's estimate of each one's remaining output (request.remaining_new_tokens)."""
        n = self.n
        return np.minimum(np.maximum(self.max_new[:n] - self.decoded[:n], 0),
                          CLIP_MAX_NEW_TOKENS)

    def remaining_new_sum(self) -> int:
        """The sum of `remaining_new()`, kept until a row decodes or the rows change."""
        if self._rem_sum is None:
            self._rem_sum = int(self.remaining_new().sum())
        return self._rem_sum

    def min_remaining_output(self) -> int:
        if self._left is None:
            n = self.n
            self._left = int((self.output_len[:n] - self.decoded[:n]).min())
        return self._left

    # -- the running list's own interface (callers that walk the requests) -------------------
    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __iter__(self) -> Iterator[SimRequest]:
        self.sync()
        return iter(list(self.reqs))

    def __getitem__(self, i: int) -> SimRequest:
        self.sync()
        return self.reqs[i]

    def __contains__(self, s: object) -> bool:
        return s in self.reqs
