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
    """Maximal runs: drop empty ones, join a run to the previous one when it continues it.
    A plain loop: a prompt has a handful of runs, where numpy's per-call cost dominated."""
    out: list[tuple[int, int]] = []
    for s, n in zip(starts.tolist(), lens.tolist(), strict=True):
        if n <= 0:
            continue
        if out and out[-1][0] + out[-1][1] == s:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((s, n))
    return out


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


def ideal_reuse_hits(workload: Workload, page_size: int = 1,
                     runs: dict[int, tuple[list, list]] | None = None) -> ReuseResult:
    """Per-request ideal prefix hits (see the module docstring for the definition and order);
    `runs` as `request_runs` returns them, when the caller has them already."""
    if not isinstance(page_size, int) or page_size < 1:
        raise WorkloadError(f"page_size must be a positive integer, got {page_size!r}")
    reqs = workload.nominal_requests()
    tree = RunRadixTree()
    hits = np.zeros(len(reqs), dtype=np.int64)
    plens = np.zeros(len(reqs), dtype=np.int64)
    for i, r in enumerate(reqs):
        plen = r.prompt_len
        plens[i] = plen
        prompt, final = (sequence_runs(r), sequence_runs(r, r.final_len)) if runs is None \
            else runs[r.request_id]
        m = min(tree.match(prompt), max(plen - 1, 0))
        hits[i] = m - m % page_size
        tree.insert(final)
    ids = np.array([r.request_id for r in reqs], dtype=np.int64)
    return ReuseResult(page_size, ids, plens, hits)


def ideal_reuse(workload: Workload, page_size: int = 1) -> float:
    """Ideal prefix-reuse fraction of all prompt tokens at `page_size` (0 for an empty stream)."""
    return ideal_reuse_hits(workload, page_size).ratio


def timed_reuse_hits(workload: Workload, page_size: int, admit_s: dict[int, float],
                     prompt_done_s: dict[int, float], finish_s: dict[int, float],
                     runs: dict[int, tuple[list, list]] | None = None) -> dict[int, int]:
    """Ideal hits under a run's own timing: an infinite cache that holds request j's prompt
    from `prompt_done_s[j]` and its whole sequence from `finish_s[j]`, matched by request i at
    `admit_s[i]` (page-aligned, capped at prompt - 1 as above). Requests absent from
    `admit_s` are not matched; absent from the others, never inserted. At equal times the
    inserts come first (an engine frees and caches a finished request before it admits).
    The difference to `ideal_reuse_hits` is reuse lost because the request that would supply
    the prefix had not arrived or not been computed yet when this one was admitted.
    `runs` (request id -> prompt runs, final-length runs; see `request_runs`) saves
    recomputing them when the caller has them already."""
    if not isinstance(page_size, int) or page_size < 1:
        raise WorkloadError(f"page_size must be a positive integer, got {page_size!r}")
    by_id = {r.request_id: r for r in workload.nominal_requests()}
    if runs is None:
        runs = request_runs(workload)
    events: list[tuple[float, int, int, int]] = []  # (time, kind, request id, which runs)
    for which, times in ((0, prompt_done_s), (1, finish_s)):
        events.extend((t, 0, rid, which) for rid, t in times.items() if rid in by_id)
    events.extend((t, 1, rid, 0) for rid, t in admit_s.items() if rid in by_id)
    events.sort()
    tree = RunRadixTree()
    hits: dict[int, int] = {}
    for _, kind, rid, which in events:
        if kind == 0:
            tree.insert(runs[rid][which])
        else:
            m = min(tree.match(runs[rid][0]), max(by_id[rid].prompt_len - 1, 0))
            hits[rid] = m - m % page_size
    return hits


def request_runs(workload: Workload) -> dict[int, tuple[list, list]]:
    """Request id -> (its prompt's runs, its prompt + output's runs up to final_len)."""
    return {r.request_id: (sequence_runs(r), sequence_runs(r, r.final_len))
            for r in workload.nominal_requests()}
