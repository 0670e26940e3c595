"""`RunRadixTree`: a radix tree over token ids whose every edge is one run of consecutive ids,
stored compactly enough to hold a day of traffic.

The ideal-reuse passes (workloads/reuse.py) insert every request's sequence into an infinite
cache, so the tree grows with the trace: two or three edges a request. As Python objects
(a child dict per node, Python ints for each edge's start and length) that was about 500
bytes a request, 500 MB for a million. Here a node is two 8-byte entries of `array('q')`
columns (its edge's first id and length) and an edge from a parent is one row of three
`array('q')` columns sorted by first id (first id, parent, child: 24 bytes), found with
`bisect` (C, no Python objects per entry). New edges go to a small dict first and are
merged into the sorted columns when it holds `max(merge_min, edges / 8)` of them (each
merge a sort of the new edges and one insert pass; the dict stays a fraction of the
tree). The answers are exactly those of the plain tree: the same edges, only stored
differently (tests/workloads/test_columns.py compares the tree merged after every edge with
the tree unmerged; tests/workloads/test_reuse.py both with brute force).

Ids are 64-bit signed (the segments' own dtype, workloads/request.py).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

import numpy as np

MERGE_MIN = 1 << 15  # new edges buffered before the first merge into the sorted columns


class RunRadixTree:
    """A radix tree over token ids whose every edge is one run of consecutive ids."""

    def __init__(self, merge_min: int | None = None) -> None:
        self.edge_start = array("q", [0])  # node -> the first id of the edge into it
        self.edge_len = array("q", [0])  # node -> that edge's length (root: 0)
        # edges (parent, first id) -> child: columns sorted by first id ...
        self._keys = array("q")
        self._parents = array("q")
        self._children = array("q")
        # ... and the ones added since the last merge
        self._recent: dict[tuple[int, int], int] = {}
        self._merge_min = MERGE_MIN if merge_min is None else merge_min

    def _child(self, node: int, s: int) -> int:
        """The child of `node` whose edge starts with id `s`, or -1."""
        c = self._recent.get((node, s))
        if c is not None:
            return c
        keys = self._keys
        i = bisect_left(keys, s)
        n = len(keys)
        while i < n and keys[i] == s:
            if self._parents[i] == node:
                return self._children[i]
            i += 1
        return -1

    def _set_child(self, node: int, s: int, child: int) -> None:
        """Point the edge (node, s) at `child`, adding it if it is new."""
        if (node, s) not in self._recent:
            keys = self._keys
            i = bisect_left(keys, s)
            while i < len(keys) and keys[i] == s:
                if self._parents[i] == node:
                    self._children[i] = child
                    return
                i += 1
        self._recent[(node, s)] = child
        if len(self._recent) >= max(self._merge_min, len(self._keys) >> 3):
            self._merge()

    def _merge(self) -> None:
        """The buffered edges into the sorted columns: sorted by first id among themselves,
        then inserted where they belong (edges with the same first id may sit in any parent
        order: `_child` scans them all), one column at a time so that the merge's transient
        memory is two copies of one column."""
        recent, self._recent = self._recent, {}
        n = len(recent)
        keys = np.fromiter((s for _, s in recent), dtype=np.int64, count=n)
        order = np.argsort(keys, kind="stable")
        parents = np.fromiter((p for p, _ in recent), dtype=np.int64, count=n)[order]
        children = np.fromiter(recent.values(), dtype=np.int64, count=n)[order]
        keys = keys[order]
        del recent, order
        at = np.searchsorted(np.frombuffer(self._keys, dtype=np.int64), keys)
        for name, new in (("_keys", keys), ("_parents", parents), ("_children", children)):
            merged = np.insert(np.frombuffer(getattr(self, name), dtype=np.int64), at, new)
            col = array("q")
            col.frombytes(memoryview(merged).cast("B"))
            setattr(self, name, col)
            del merged

    def match(self, runs: list[tuple[int, int]]) -> int:
        """Longest prefix of `runs` (in tokens) present in the tree."""
        node, matched = 0, 0
        elen = self.edge_len
        for s, n in runs:
            while n > 0:
                c = self._child(node, s)
                if c < 0:
                    return matched
                common = min(elen[c], n)
                matched += common
                if common < elen[c]:
                    return matched
                node, s, n = c, s + common, n - common
        return matched

    def _new(self, start: int, length: int) -> int:
        self.edge_start.append(start)
        self.edge_len.append(length)
        return len(self.edge_len) - 1

    def insert(self, runs: list[tuple[int, int]]) -> None:
        node = 0
        elen, estart = self.edge_len, self.edge_start
        for s, n in runs:
            while n > 0:
                c = self._child(node, s)
                if c < 0:
                    leaf = self._new(s, n)
                    self._set_child(node, s, leaf)
                    node, n = leaf, 0
                    break
                common = min(elen[c], n)
                if common < elen[c]:  # split edge c at `common`
                    mid = self._new(s, common)
                    self._set_child(node, s, mid)
                    estart[c] += common
                    elen[c] -= common
                    self._set_child(mid, estart[c], c)
                    c = mid
                node, s, n = c, s + common, n - common

    @property
    def nbytes(self) -> int:
        """The columns' bytes (the buffered dict not included)."""
        return sum(a.itemsize * len(a) for a in (self.edge_start, self.edge_len, self._keys,
                                                  self._parents, self._children))


__all__ = ["MERGE_MIN", "RunRadixTree"]
