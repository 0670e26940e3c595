"""Open-loop requests held as columns, each `Request` built when it is asked for.

A day of generated traffic is a million requests. As `Request` objects (slotted, with their
`PromptSpec` and its segment tuple) they take about 460 bytes each before a simulation even
starts, and the engine only ever needs the one arriving now. Independent requests with
unique prompts (`generators.independent_requests`, the ShareGPT-like and fixed-length
workloads) are fully determined by (request id, arrival, prompt length, output length,
max_new_tokens, seed), so `GeneratedRequests` keeps those as numpy columns (32 bytes a
request) and builds the identical `Request` on indexing or iteration. The engine's arrivals
take them one at a time as they become due (simulator/arrivals.py) and drop each with its
finished request, so a run holds only the requests in flight.

It is a read-only `Sequence[Request]`: `len`, iteration, an index or a contiguous slice
(`w.requests[:n]` stays columnar); `arrivals` gives the arrival column without building any
request. Pickles small (a sweep hands one to its workers, experiments/execution/shared.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import overload

import numpy as np

from workloads.request import Request, unique_prompt


class GeneratedRequests(Sequence[Request]):
    """Request i: id `first_id + i`, arriving at `arrivals[i]`, a unique prompt of
    `prompt_lens[i]` tokens named by (seed, id), `output_lens[i]` and `max_new[i]` (what
    `generators.independent_requests` would have built as objects)."""

    __slots__ = ("arrivals", "first_id", "max_new", "output_lens", "prompt_lens", "seed")

    def __init__(self, arrivals: np.ndarray, prompt_lens: np.ndarray, output_lens: np.ndarray,
                 max_new: np.ndarray, seed: int = 0, first_id: int = 0) -> None:
        n = len(arrivals)
        for name, col in (("prompt_lens", prompt_lens), ("output_lens", output_lens),
                          ("max_new", max_new)):
            if len(col) != n:
                raise ValueError(f"GeneratedRequests: {name} has {len(col)} values for {n} "
                                 "arrivals")
        self.arrivals = np.asarray(arrivals, dtype=np.float64)
        self.prompt_lens = np.asarray(prompt_lens, dtype=np.int64)
        self.output_lens = np.asarray(output_lens, dtype=np.int64)
        self.max_new = np.asarray(max_new, dtype=np.int64)
        self.seed = int(seed)
        self.first_id = int(first_id)

    def __len__(self) -> int:
        return len(self.arrivals)

    def _build(self, i: int) -> Request:
        rid = self.first_id + i
        return Request(rid, float(self.arrivals[i]), unique_prompt(self.seed, rid,
                                                                    int(self.prompt_lens[i])),
                       int(self.output_lens[i]), int(self.max_new[i]), seed=self.seed)

    @overload
    def __getitem__(self, i: int) -> Request: ...

    @overload
    def __getitem__(self, i: slice) -> GeneratedRequests: ...

    def __getitem__(self, i: int | slice) -> Request | GeneratedRequests:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                raise ValueError("GeneratedRequests: only contiguous slices (step 1)")
            stop = max(stop, start)
            return GeneratedRequests(self.arrivals[start:stop], self.prompt_lens[start:stop],
                                     self.output_lens[start:stop], self.max_new[start:stop],
                                     self.seed, self.first_id + start)
        n = len(self)
        k = int(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"GeneratedRequests index {i} out of range ({n} requests)")
        return self._build(k)

    def __iter__(self) -> Iterator[Request]:
        for k in range(len(self)):
            yield self._build(k)

    def __add__(self, other: Sequence[Request]) -> list[Request]:
        """Concatenated with other requests: a plain list (as `list + list` gives)."""
        return [*self, *other]

    def __radd__(self, other: Sequence[Request]) -> list[Request]:
        return [*other, *self]

    def request_ids(self) -> np.ndarray:
        return np.arange(self.first_id, self.first_id + len(self), dtype=np.int64)

    def nominal(self) -> Sequence[Request]:
        """`Workload.nominal_requests` of these requests alone (by arrival, ties in list
        order), as a view: itself when generated in that order."""
        return open_loop_nominal(self)

    def in_arrival_order(self) -> bool:
        """Sorted by (arrival, request id) already (what the generators produce)."""
        return bool(np.all(self.arrivals[1:] >= self.arrivals[:-1]))

    def __reduce__(self):
        return (GeneratedRequests, (self.arrivals, self.prompt_lens, self.output_lens,
                                    self.max_new, self.seed, self.first_id))


class Reordered(Sequence[Request]):
    """`base` read in the order `order` (positions into it): a sorted view of a columnar
    sequence that builds nothing up front."""

    __slots__ = ("base", "order")

    def __init__(self, base: Sequence[Request], order: np.ndarray) -> None:
        self.base, self.order = base, np.asarray(order, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return Reordered(self.base, self.order[i])
        return self.base[int(self.order[i])]

    def __iter__(self) -> Iterator[Request]:
        for k in self.order.tolist():
            yield self.base[k]


def _column(requests: Sequence[Request], own: Callable[[object], np.ndarray | None],
            field: str, dtype: type) -> np.ndarray:
    """One per-request field of `requests` in their order: the column a columnar sequence
    holds (`own`), a reordered view's base column taken in its order, or else read from each
    built request (a plain list)."""
    col = own(requests)
    if col is not None:
        return col
    if isinstance(requests, Reordered):
        return _column(requests.base, own, field, dtype)[requests.order]
    return np.fromiter((getattr(r, field) for r in requests), dtype=dtype, count=len(requests))


def _held(name: str) -> Callable[[object], np.ndarray | None]:
    """A columnar sequence's own array attribute `name` (None where there is none)."""
    def own(requests: object) -> np.ndarray | None:
        col = getattr(requests, name, None)
        return col if isinstance(col, np.ndarray) else None
    return own


def _generated_ids(requests: object) -> np.ndarray | None:
    return requests.request_ids() if isinstance(requests, GeneratedRequests) else None


def arrival_column(requests: Sequence[Request]) -> np.ndarray:
    """The arrival times of `requests` in their order, as float64 (no request built for a
    columnar sequence)."""
    return _column(requests, _held("arrivals"), "arrival_s", np.float64)


def prompt_len_column(requests: Sequence[Request]) -> np.ndarray:
    """The prompt lengths of `requests` in their order (int64)."""
    return _column(requests, _held("prompt_lens"), "prompt_len", np.int64)


def id_column(requests: Sequence[Request]) -> np.ndarray:
    """The request ids of `requests` in their order (int64)."""
    return _column(requests, _generated_ids, "request_id", np.int64)


def arrival_order(requests: Sequence[Request]) -> Sequence[Request]:
    """`requests` sorted by (arrival, request id), the order the engine releases them in: a
    list is sorted as it always was; a columnar sequence already in that order is itself,
    else a `Reordered` view (nothing built)."""
    if isinstance(requests, GeneratedRequests):
        if requests.in_arrival_order():  # ids rise with position: ties keep id order
            return requests
        return Reordered(requests, np.lexsort((requests.request_ids(), requests.arrivals)))
    return sorted(requests, key=lambda r: (r.arrival_s, r.request_id))


def open_loop_nominal(requests: Sequence[Request]) -> Sequence[Request]:
    """Open-loop requests in nominal order (`Workload.nominal_requests` without sessions: by
    arrival, ties in list order), lazily for a columnar sequence."""
    if isinstance(requests, GeneratedRequests):
        if requests.in_arrival_order():
            return requests
        return Reordered(requests, np.argsort(requests.arrivals, kind="stable"))
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    return [requests[i] for i in order]


__all__ = ["GeneratedRequests", "Reordered", "arrival_column", "arrival_order", "id_column",
           "open_loop_nominal", "prompt_len_column"]
