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
The other columns (rid, output_len, max_new, prompt_len) never change while running.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from simulator.request import CLIP_MAX_NEW_TOKENS, SimRequest

_INITIAL = 64


class RunningBatch:
    """The running list (order kept: it is the batch order of every decode call)."""

    __slots__ = ("_dirty", "decoded", "last_token_s", "max_new", "n", "output_len",
                 "prompt_len", "reqs", "rid", "written")

    def __init__(self) -> None:
        self.reqs: list[SimRequest] = []
        self.n = 0
        self.rid = np.zeros(_INITIAL, dtype=np.int64)
        self.written = np.zeros(_INITIAL, dtype=np.int64)
        self.decoded = np.zeros(_INITIAL, dtype=np.int64)
        self.output_len = np.zeros(_INITIAL, dtype=np.int64)
        self.max_new = np.zeros(_INITIAL, dtype=np.int64)
        self.prompt_len = np.zeros(_INITIAL, dtype=np.int64)
        self.last_token_s = np.zeros(_INITIAL, dtype=float)
        self._dirty = False  # columns changed since the requests' fields were written

    # -- membership ------------------------------------------------------------------------
    def append(self, s: SimRequest) -> None:
        """`s` starts running (its fields are current): copy them into a new last row."""
        i = self.n
        if i == len(self.rid):
            self._grow()
        self.rid[i] = s.rid
        self.written[i] = s.written
        self.decoded[i] = s.decoded
        self.output_len[i] = s.output_len
        self.max_new[i] = s.max_new
        self.prompt_len[i] = s.prompt_len
        self.last_token_s[i] = s.last_token_s
        self.reqs.append(s)
        self.n = i + 1

    def _grow(self) -> None:
        for name in ("rid", "written", "decoded", "output_len", "max_new", "prompt_len",
                     "last_token_s"):
            col = getattr(self, name)
            new = np.zeros(2 * len(col), dtype=col.dtype)
            new[: self.n] = col[: self.n]
            setattr(self, name, new)

    def remove(self, s: SimRequest) -> None:
        """`s` leaves (preempted or finished): its fields written back, later rows move up."""
        i = self.reqs.index(s)
        self._write_back(i)
        del self.reqs[i]
        n = self.n
        for col in (self.rid, self.written, self.decoded, self.output_len, self.max_new,
                    self.prompt_len, self.last_token_s):
            col[i: n - 1] = col[i + 1: n]
        self.n = n - 1

    def remove_done(self, upto: int) -> list[SimRequest]:
        """Those of the first `upto` rows that decoded their whole output leave, in batch
        order, their fields written back; returns them (to finish, in that order)."""
        n = self.n
        done = self.decoded[:upto] >= self.output_len[:upto]
        if not done.any():
            return []
        idx = np.flatnonzero(done).tolist()
        out = []
        for i in idx:
            self._write_back(i)
            out.append(self.reqs[i])
        keep = np.ones(n, dtype=bool)
        keep[idx] = False
        m = n - len(idx)
        for col in (self.rid, self.written, self.decoded, self.output_len, self.max_new,
                    self.prompt_len, self.last_token_s):
            col[:m] = col[:n][keep]
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
    def stepped(self, upto: int, k: int, first: float, last: float) -> np.ndarray:
        """The first `upto` rows decoded k tokens each, the first at `first`, the last at
        `last`: returns each one's gap from its previous token to `first` (inter-token gaps)."""
        gaps = first - self.last_token_s[:upto]
        self.last_token_s[:upto] = last
        self.decoded[:upto] += k
        self._dirty = True
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

    def min_remaining_output(self) -> int:
        n = self.n
        return int((self.output_len[:n] - self.decoded[:n]).min())

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
