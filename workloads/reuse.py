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

Both passes hold only what they must for a day of traffic: each request's runs are built as
the pass reaches it (the timed pass keeps a request's from its first event to its last), the
tree is stored in compact columns (workloads/run_tree.py), and the timed pass's events are
numpy columns; a columnar workload (workloads/columns.py) builds each request then, too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workloads.columns import id_column
from workloads.errors import WorkloadError
from workloads.request import (
    HASH_BLOCK_TOKENS,
    NAMESPACE_SPAN,
    OUTPUT_TAG,
    Request,
    Workload,
    namespace_of,
)
from workloads.run_tree import RunRadixTree

__all__ = ["ReuseResult", "RunRadixTree", "final_runs", "first_id", "ideal_reuse",
           "ideal_reuse_hits", "request_runs", "sequence_runs", "solo_requests",
           "timed_reuse_hits", "timed_reuse_hits_columns"]


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


def sequence_runs(req: Request, n_tokens: int | None = None) -> list[tuple[int, int]]:
    """The first `n_tokens` (default: the prompt) of prompt + output ids, as maximal runs.
    Synthetic segments and the output are one run each, built in Python ints (a request of
    the Azure trace is one such segment, and numpy's fixed cost per call would outweigh the
    work); explicit
    ids and hash blocks go through `_segment_runs`."""
    plen = req.prompt_len
    n = plen if n_tokens is None else n_tokens
    take = min(n, plen)  # prompt tokens still to take (a shorter n truncates)
    out: list[tuple[int, int]] = []
    for seg in req.prompt.segments:
        if take <= 0:
            break
        if seg[0] == "unique":
            pairs: list[tuple[int, int]] | zip = [
                (int(seg[1]) * NAMESPACE_SPAN + int(seg[3]), int(seg[2]))]
        else:
            starts, lens = _segment_runs(seg)
            pairs = zip(starts.tolist(), lens.tolist(), strict=True)
        for start, length in pairs:
            if take <= 0:
                break
            length = min(length, take)
            take -= length
            _append_run(out, start, length)
    if n > plen:
        _append_run(out, _output_start(req), n - plen)
    return out


def _output_start(req: Request) -> int:
    """The first id of the request's output tokens (one run in its own namespace)."""
    ns = req.output_namespace
    if ns is None:
        ns = namespace_of(req.seed, req.request_id, OUTPUT_TAG)
    return ns * NAMESPACE_SPAN


def _append_run(out: list[tuple[int, int]], start: int, length: int) -> None:
    """Append a run, dropping an empty one and joining one that continues the last."""
    if length <= 0:
        return
    if out and out[-1][0] + out[-1][1] == start:
        out[-1] = (out[-1][0], out[-1][1] + length)
    else:
        out.append((start, length))


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


def final_runs(req: Request, prompt_runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`sequence_runs(req, req.final_len)` from the prompt's runs already built: the output
    run appended (and joined to the last prompt run if it continues it), as `_merge` would."""
    extra = max(req.output_len, 1) - 1  # final_len - prompt_len, without two prompt sums
    out = list(prompt_runs)
    if extra > 0:
        _append_run(out, _output_start(req), extra)
    return out


def _runs(r: Request, runs: dict[int, tuple[list, list]] | None) -> tuple[list, list]:
    got = runs.get(r.request_id) if runs is not None else None
    if got is not None:
        return got
    prompt = sequence_runs(r)
    return prompt, final_runs(r, prompt)


def ideal_reuse_hits(workload: Workload, page_size: int = 1,
                     runs: dict[int, tuple[list, list]] | None = None,
                     solo: bool = True) -> ReuseResult:
    """Per-request ideal prefix hits (see the module docstring for the definition and order);
    `runs` as `request_runs` returns them, when the caller has them already. One pass in
    nominal order that builds each request's runs as it reaches it (a columnar workload
    builds each request then, too), so what it holds is the compact tree and three columns.
    `solo`: requests whose sequence starts with an id no other request's does
    (`solo_requests`) hit 0 without building their runs or entering the tree (False: every
    request walks the tree, the same hits; the tests compare both)."""
    if not isinstance(page_size, int) or page_size < 1:
        raise WorkloadError(f"page_size must be a positive integer, got {page_size!r}")
    reqs = workload.nominal_order()
    alone = solo_requests(reqs) if solo else np.zeros(len(reqs), dtype=bool)
    tree = RunRadixTree()
    hits = np.zeros(len(reqs), dtype=np.int64)
    plens = np.zeros(len(reqs), dtype=np.int64)
    ids = np.zeros(len(reqs), dtype=np.int64)
    for i, (r, skip) in enumerate(zip(reqs, alone.tolist(), strict=True)):
        plen = r.prompt_len
        plens[i] = plen
        ids[i] = r.request_id
        if skip:  # shares no first id: matches nothing, and nothing will match it
            continue
        prompt, final = _runs(r, runs)
        m = min(tree.match(prompt), max(plen - 1, 0))
        hits[i] = m - m % page_size
        tree.insert(final)
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
    recomputing them when the caller has them already. The dict form of
    `timed_reuse_hits_columns`."""
    def column(times: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
        return (np.array(list(times), dtype=np.int64),
                np.array(list(times.values()), dtype=np.float64))

    hits = timed_reuse_hits_columns(workload, page_size, column(admit_s),
                                    column(prompt_done_s), column(finish_s), runs)
    return dict(zip(*(a.tolist() for a in hits), strict=True))


Times = tuple[np.ndarray, np.ndarray]  # (request ids, times), one row per request


def timed_reuse_hits_columns(workload: Workload, page_size: int, admit: Times,
                             prompt_done: Times, finish: Times,
                             runs: dict[int, tuple[list, list]] | None = None,
                             solo: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """`timed_reuse_hits` over columns: (ids, times) for the admissions, the prompts done and
    the finishes; returns (ids matched, their hits) in event order. The events are sorted as
    arrays (time, then inserts before matches, then id, then prompt before whole sequence),
    and a request's runs are built at its first event and dropped after its last, so the pass
    holds the tree plus the requests in flight at each moment, not every request's runs.
    `solo` as in `ideal_reuse_hits` (a request that inserts its own prompt before its match
    is never solo)."""
    if not isinstance(page_size, int) or page_size < 1:
        raise WorkloadError(f"page_size must be a positive integer, got {page_size!r}")
    reqs = workload.nominal_order()
    known = id_column(reqs)
    t, key, pos = _events(known, admit, prompt_done, finish)
    order = np.lexsort((key, t))
    del t
    key, pos = key[order], pos[order]
    del order
    is_match = key >= _MATCH
    out_ids = known[pos[is_match]]  # one row per match, in event order
    out_hits = np.zeros(len(out_ids), dtype=np.int64)
    rank = np.cumsum(is_match) - 1  # a match event's row in the output
    if solo:  # their matches hit 0; their inserts serve no one: leave their events out
        alone = solo_requests(reqs) & ~_inserted_first(pos, is_match, len(reqs))
        keep = ~alone[pos]
        key, pos, rank = key[keep], pos[keep], rank[keep]
        del keep
    del is_match
    left = np.bincount(pos, minlength=len(reqs)).astype(np.int8)  # events per request
    live: dict[int, tuple[Request, list, list]] = {}
    tree = RunRadixTree()
    for lo in range(0, len(key), _EVENT_CHUNK):  # Python ints a chunk at a time
        chunk = zip(key[lo:lo + _EVENT_CHUNK].tolist(), pos[lo:lo + _EVENT_CHUNK].tolist(),
                    rank[lo:lo + _EVENT_CHUNK].tolist(), strict=True)
        for k, p, row in chunk:
            got = live.get(p)
            if got is None:
                r = reqs[p]
                got = live[p] = (r, *_runs(r, runs))
            if k < _MATCH:
                tree.insert(got[1 + (k & 1)])
            else:
                m = min(tree.match(got[1]), max(got[0].prompt_len - 1, 0))
                out_hits[row] = m - m % page_size
            left[p] -= 1
            if left[p] == 0:
                del live[p]
    return out_ids, out_hits


def _inserted_first(pos: np.ndarray, is_match: np.ndarray, n: int) -> np.ndarray:
    """Per request position: one of its inserts comes before a match of its own in the event
    order (a prefill that took no time): it then matches its own prompt, so it is not solo."""
    idx = np.arange(len(pos))
    first_insert = np.full(n, len(pos), dtype=np.int64)
    last_match = np.full(n, -1, dtype=np.int64)
    np.minimum.at(first_insert, pos[~is_match], idx[~is_match])
    np.maximum.at(last_match, pos[is_match], idx[is_match])
    return first_insert < last_match


def first_id(req: Request) -> int | None:
    """The first token id of the request's prompt + output up to `final_len` (None when that
    is empty): the key of the root edge its sequence takes in a `RunRadixTree`."""
    for seg in req.prompt.segments:
        kind = seg[0]
        if kind == "unique":
            if seg[2] > 0:
                return int(seg[1]) * NAMESPACE_SPAN + int(seg[3])
        elif kind == "hash":
            if seg[2] > 0:
                return int(seg[1][0]) * HASH_BLOCK_TOKENS
        elif len(seg[1]):
            return int(seg[1][0])
    return _output_start(req) if req.output_len > 1 else None


def solo_requests(reqs: Sequence[Request]) -> np.ndarray:
    """Per request (in the order given): its sequence is empty or starts with an id that no
    other request's starts with. In an infinite radix cache over these requests such a
    request's sequence takes a root edge no other takes, so it matches nothing and nothing
    matches into it: its ideal hit is 0, and leaving it out of the tree changes no other
    request's (the bundled Azure traces give every request its own content)."""
    firsts = [first_id(r) for r in reqs]
    empty = np.fromiter((f is None for f in firsts), dtype=bool, count=len(firsts))
    ids = np.fromiter((-1 if f is None else f for f in firsts), dtype=np.int64,
                      count=len(firsts))
    _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    return empty | (counts[inverse.ravel()] == 1)


_EVENT_CHUNK = 1 << 16
_MATCH = 1 << 62  # event key: kind (insert 0, match 1) << 62 | request id << 1 | which runs


def _events(known: np.ndarray, admit: Times, prompt_done: Times, finish: Times
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The timed pass's events as three columns: time, a key that sorts as (kind, request
    id, which runs) does, and the request's position in `known`; events of requests not in
    `known` are left out. 24 bytes an event, built in place."""
    sorter = np.argsort(known, kind="stable")
    ids_sorted = known[sorter]
    sources = ((0, 0, prompt_done), (0, 1, finish), (1, 0, admit))
    total = sum(len(times) for _, _, (_, times) in sources)
    t = np.empty(total, dtype=np.float64)
    key = np.empty(total, dtype=np.int64)
    pos = np.empty(total, dtype=np.int64)
    n = 0
    for kind, which, (rids, times) in sources:
        rids = np.asarray(rids, dtype=np.int64)
        if len(rids) and (rids.min() < 0 or rids.max() >= 1 << 60):
            raise WorkloadError("timed reuse: request ids must be in [0, 2**60)")
        k = np.minimum(np.searchsorted(ids_sorted, rids), max(len(ids_sorted) - 1, 0))
        ok = (ids_sorted[k] == rids) if len(ids_sorted) else np.zeros(len(rids), bool)
        m = int(ok.sum())
        t[n:n + m] = np.asarray(times, dtype=np.float64)[ok]
        key[n:n + m] = (kind << 62) | (rids[ok] << 1) | which
        pos[n:n + m] = sorter[k[ok]]
        n += m
    return t[:n], key[:n], pos[:n]


def request_runs(workload: Workload, skip: np.ndarray | None = None
                 ) -> dict[int, tuple[list, list]]:
    """Request id -> (its prompt's runs, its prompt + output's runs up to final_len);
    `skip`: per request in nominal order, leave it out (the passes skip solo requests)."""
    reqs = workload.nominal_order()
    if skip is None:
        return {r.request_id: _runs(r, None) for r in reqs}
    return {r.request_id: _runs(r, None)
            for r, s in zip(reqs, skip.tolist(), strict=True) if not s}
