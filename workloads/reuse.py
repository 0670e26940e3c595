"""Ideal prefix reuse of a request stream, defined once for the whole project.

    ideal_reuse(W, ps) = sum_i floor_ps(min(max_j<i LCP(prompt_i, seq_j), len(prompt_i) - 1))
                         / sum_i len(prompt_i)

over requests i in nominal arrival order (`Workload.nominal_requests`: open-loop requests by
arrival, closed-loop turn k+1 after turn k), where `seq_j` is the first `final_len` tokens of
request j's prompt + output ids (`final_len = prompt + output - 1`). That is exactly what an
infinite radix cache holds after j finishes: the last sampled token is never written to KV.
(The issue says "prompt + output"; one token less is the precise version.) The cap at prompt - 1
is the engine's rule that at least one prompt token is computed to get logits; floor_ps rounds
down to whole pages, as a paged cache only shares full pages.

Exact at token level, yet cheap: sequences are never expanded to tokens. Every segment kind is
a run of consecutive ids (a 512-token hash block h is h*512 .. h*512+511, synthetic content is
namespace*2^24 + start .. ; explicit ids are split into maximal consecutive runs), so each
sequence becomes a short list of maximal (first id, length) runs and a radix tree whose edges
are such runs answers longest-common-prefix queries. On the full Mooncake trace (144 M prompt
tokens) that is ~300 k runs, well under a second and a few tens of MB.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workloads.errors import WorkloadError
from workloads.request import (
    HASH_BLOCK_TOKENS,
    NAMESPACE_SPAN,
    OUTPUT_TAG,
    Request,
    Workload,
    namespace_of,
)


def _segment_runs(seg: tuple) -> tuple[np.ndarray, np.ndarray]:
    kind = seg[0]
    if kind == "ids":
        ids = np.asarray(seg[1], dtype=np.int64)
        if len(ids) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        cuts = np.flatnonzero(np.diff(ids) != 1) + 1
        bounds = np.concatenate([[0], cuts, [len(ids)]])
        return ids[bounds[:-1]], np.diff(bounds)
    if kind == "hash":
        length = int(seg[2])
        nblocks = -(-length // HASH_BLOCK_TOKENS)
        hashes = np.asarray(seg[1][:nblocks], dtype=np.int64)
        lens = np.full(len(hashes), HASH_BLOCK_TOKENS, dtype=np.int64)
        if len(lens):
            lens[-1] = length - HASH_BLOCK_TOKENS * (len(lens) - 1)
        return hashes * HASH_BLOCK_TOKENS, lens
    if kind == "unique":
        n = int(seg[2])
        return (np.array([int(seg[1]) * NAMESPACE_SPAN + int(seg[3])], dtype=np.int64),
                np.array([n], dtype=np.int64))
    raise WorkloadError(f"unknown prompt segment kind {kind!r}")


def _merge(starts: np.ndarray, lens: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs: drop empty ones, join a run to the previous one when it continues it."""
    keep = lens > 0
    starts, lens = starts[keep], lens[keep]
    if len(starts) == 0:
        return []
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] != starts[:-1] + lens[:-1]
    idx = np.flatnonzero(new)
    merged = np.add.reduceat(lens, idx)
    return list(zip(starts[idx].tolist(), merged.tolist(), strict=True))


def sequence_runs(req: Request, n_tokens: int | None = None) -> list[tuple[int, int]]:
    """The first `n_tokens` (default: the prompt) of prompt + output ids, as maximal runs."""
    parts = [_segment_runs(s) for s in req.prompt.segments]
    plen = req.prompt_len
    n = plen if n_tokens is None else n_tokens
    if n > plen:
        ns = req.output_namespace
        if ns is None:
            ns = namespace_of(req.seed, req.request_id, OUTPUT_TAG)
        parts.append((np.array([ns * NAMESPACE_SPAN], np.int64),
                      np.array([n - plen], np.int64)))
    if not parts:
        return []
    starts = np.concatenate([p[0] for p in parts])
    lens = np.concatenate([p[1] for p in parts])
    if n < plen:  # truncate
        ends = np.cumsum(lens)
        k = int(np.searchsorted(ends, n, side="left"))
        starts, lens = starts[: k + 1].copy(), lens[: k + 1].copy()
        lens[-1] -= int(ends[k]) - n
    return _merge(starts, lens)


class RunRadixTree:
    """A radix tree over token ids whose every edge is one run of consecutive ids."""

    def __init__(self) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.edge_start: list[int] = [0]
        self.edge_len: list[int] = [0]

    def match(self, runs: list[tuple[int, int]]) -> int:
        """Longest prefix of `runs` (in tokens) present in the tree."""
        node, matched = 0, 0
        children, elen = self.children, self.edge_len
        for s, n in runs:
            while n > 0:
                c = children[node].get(s)
                if c is None:
                    return matched
                common = min(elen[c], n)
                matched += common
                if common < elen[c]:
                    return matched
                node, s, n = c, s + common, n - common
        return matched

    def _new(self, start: int, length: int) -> int:
        self.children.append({})
        self.edge_start.append(start)
        self.edge_len.append(length)
        return len(self.edge_len) - 1

    def insert(self, runs: list[tuple[int, int]]) -> None:
        node = 0
        children, elen, estart = self.children, self.edge_len, self.edge_start
        for s, n in runs:
            while n > 0:
                c = children[node].get(s)
                if c is None:
                    leaf = self._new(s, n)
                    children[node][s] = leaf
                    node, n = leaf, 0
                    break
                common = min(elen[c], n)
                if common < elen[c]:  # split edge c at `common`
                    mid = self._new(s, common)
                    children[node][s] = mid
                    estart[c] += common
                    elen[c] -= common
                    children[mid][estart[c]] = c
                    c = mid
                node, s, n = c, s + common, n - common

    @property
    def num_nodes(self) -> int:
        return len(self.edge_len)


@dataclass
class ReuseResult:
    """Per-request ideal hits (tokens, page-aligned), in nominal order."""

    page_size: int
    request_ids: np.ndarray
    prompt_lens: np.ndarray
    hits: np.ndarray

    @property
    def ratio(self) -> float:
        total = int(self.prompt_lens.sum())
        return float(self.hits.sum()) / total if total else 0.0


def ideal_reuse_hits(workload: Workload, page_size: int = 1) -> ReuseResult:
    """Per-request ideal prefix hits (see the module docstring for the definition and order)."""
    if not isinstance(page_size, int) or page_size < 1:
        raise WorkloadError(f"page_size must be a positive integer, got {page_size!r}")
    reqs = workload.nominal_requests()
    tree = RunRadixTree()
    hits = np.zeros(len(reqs), dtype=np.int64)
    plens = np.zeros(len(reqs), dtype=np.int64)
    for i, r in enumerate(reqs):
        plen = r.prompt_len
        plens[i] = plen
        m = min(tree.match(sequence_runs(r)), max(plen - 1, 0))
        hits[i] = m - m % page_size
        tree.insert(sequence_runs(r, r.final_len))
    ids = np.array([r.request_id for r in reqs], dtype=np.int64)
    return ReuseResult(page_size, ids, plens, hits)


def ideal_reuse(workload: Workload, page_size: int = 1) -> float:
    """Ideal prefix-reuse fraction of all prompt tokens at `page_size` (0 for an empty stream)."""
    return ideal_reuse_hits(workload, page_size).ratio
