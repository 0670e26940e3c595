"""The canonical request: the one form every generator and trace loader produces.

Token ids are produced on demand (`prompt_ids()`), never stored for a whole trace: a one-hour
Mooncake replay has 144 M prompt tokens. Ids live in disjoint namespaces so that unrelated
requests never share a prefix by accident:

* Mooncake-style block hashes: hash id h at offset i in its 512-token block -> h * 512 + i;
* synthetic unique content: `unique_tokens(namespace, n)` -> namespace * 2**24 + arange(n), with
  namespaces drawn from a seeded 62-bit mix (far above any block-hash id);
* explicit token ids from a generic trace are used as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

TOKEN_DTYPE = np.int64
HASH_BLOCK_TOKENS = 512
NAMESPACE_SPAN = 1 << 24  # tokens per synthetic namespace (a 16 M-token sequence at most)
OUTPUT_TAG = 7  # namespace tag of generated (output) tokens
# Namespace tags of synthetic prompt content (the last part given to `namespace_of`), so that
# different roles of content with the same (seed, id) never coincide.
PROMPT_TAG = 1  # a request's own unique prompt (traces without prefix info, generators)
SHARED_TAG = 2  # a prefix shared by many requests (system prompt, k-shot examples)
TURN_TAG = 3  # the new user input of a session turn
STEP_TAG = 4  # the per-node instruction of a tree-of-thought step
QUESTION_TAG = 5  # a question of a benchmark's prompt group (the same text each time the
# harness sends that prompt again, workloads/prompt_groups.py)


def mix64(*parts: int) -> int:
    """A deterministic 64-bit mix of integers (splitmix64 steps), independent of PYTHONHASHSEED."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (int(p) & 0xFFFFFFFFFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x


def namespace_of(*parts: int) -> int:
    """A namespace id for synthetic content, far above block-hash token ids (>= 2**14)."""
    return (1 << 14) + mix64(*parts) % ((1 << 38) - (1 << 14))


_M64 = 0xFFFFFFFFFFFFFFFF


def namespace_column(seed: int, keys: np.ndarray, tag: int) -> np.ndarray:
    """`namespace_of(seed, key, tag)` for every key at once (int64): the same splitmix64
    steps in uint64 columns, whose arithmetic wraps modulo 2**64 as `mix64` masks."""
    golden, m1, m2 = (np.uint64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                             0x94D049BB133111EB))
    shift = (np.uint64(30), np.uint64(27), np.uint64(31))
    x = np.full(len(keys), golden, dtype=np.uint64)
    for part in (np.uint64(int(seed) & _M64), np.asarray(keys, dtype=np.int64).view(np.uint64),
                 np.uint64(int(tag) & _M64)):
        x ^= part
        x += golden
        x = (x ^ (x >> shift[0])) * m1
        x = (x ^ (x >> shift[1])) * m2
        x ^= x >> shift[2]
    span = np.uint64((1 << 38) - (1 << 14))
    return (x % span + np.uint64(1 << 14)).astype(np.int64)


def unique_tokens(namespace: int, n: int, start: int = 0) -> np.ndarray:
    """`n` token ids private to `namespace` (positions start .. start+n-1)."""
    base = namespace * NAMESPACE_SPAN + start
    return np.arange(base, base + n, dtype=TOKEN_DTYPE)


def hash_block_tokens(hash_ids: np.ndarray | list[int], length: int) -> np.ndarray:
    """Expand 512-token prefix-hash blocks to token ids; the last block may be partial."""
    ids = np.asarray(hash_ids, dtype=TOKEN_DTYPE)
    offsets = np.arange(HASH_BLOCK_TOKENS, dtype=TOKEN_DTYPE)
    full = (ids[:, None] * HASH_BLOCK_TOKENS + offsets).ravel()
    return full[:length]


def unique_prompt(seed: int, key: int, n: int, tag: int = PROMPT_TAG) -> PromptSpec:
    """`n` tokens of content private to (seed, key, tag): shares no prefix with anything else."""
    return PromptSpec((("unique", namespace_of(seed, key, tag), int(n), 0),))


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """How to build a prompt's token ids: concatenated segments, each either explicit ids,
    a run of hash blocks, or unique synthetic content. Kept small so a million requests fit."""

    # each: ("ids", ndarray) | ("hash", ids_tuple, length) | ("unique", ns, n, start)
    segments: tuple[tuple, ...]

    @property
    def length(self) -> int:
        segments = self.segments
        if len(segments) == 1:  # most prompts (a trace row's, a generator's): one segment
            seg = segments[0]
            return len(seg[1]) if seg[0] == "ids" else seg[2]
        n = 0
        for seg in segments:
            kind = seg[0]
            if kind == "ids":
                n += len(seg[1])
            elif kind == "hash":
                n += seg[2]
            else:
                n += seg[2]
        return n

    def token_ids(self) -> np.ndarray:
        parts = []
        for seg in self.segments:
            kind = seg[0]
            if kind == "ids":
                parts.append(np.asarray(seg[1], dtype=TOKEN_DTYPE))
            elif kind == "hash":
                parts.append(hash_block_tokens(np.asarray(seg[1]), seg[2]))
            elif kind == "unique":
                parts.append(unique_tokens(seg[1], seg[2], seg[3]))
            else:  # pragma: no cover - constructed only in this package
                raise ValueError(f"unknown prompt segment kind {kind!r}")
        if not parts:
            return np.zeros(0, dtype=TOKEN_DTYPE)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclass(slots=True)
class Request:
    """One request as the simulator sees it.

    Slotted, with no per-request `meta` dict unless a generator has something to say: a day
    of traffic holds a million of them (about 610 bytes each with a `__dict__` and an empty
    dict, measured with tracemalloc on a ShareGPT-like workload; see docs/performance.md).

    `output_len` is the true number of generated tokens: it only ends decoding (and feeds the
    oracle policies and the memory breakdown). Schedulers and admission see `max_new_tokens`.
    Output ids are deterministic from (seed, request id), so a later turn whose prompt contains
    them matches what this request left in the cache.
    """

    request_id: int
    arrival_s: float
    prompt: PromptSpec
    output_len: int
    max_new_tokens: int
    seed: int = 0
    session_id: int | None = None
    turn: int | None = None
    think_time_s: float = 0.0
    output_namespace: int | None = None
    meta: dict | None = None  # where a generator or trace row says more (its line, its group)

    @property
    def prompt_len(self) -> int:
        return self.prompt.length

    @property
    def final_len(self) -> int:
        """KV tokens written by the end: prompt + output - 1 (the last sampled token is never
        written back); a request with no output writes its prompt only."""
        return self.prompt_len + max(self.output_len, 1) - 1

    def prompt_ids(self) -> np.ndarray:
        return self.prompt.token_ids()

    def output_ids(self, n: int | None = None) -> np.ndarray:
        """The first `n` (default all) generated token ids."""
        n = self.output_len if n is None else n
        ns = self.output_namespace
        if ns is None:
            ns = namespace_of(self.seed, self.request_id, OUTPUT_TAG)
        return unique_tokens(ns, n)

    def sequence_ids(self, n: int) -> np.ndarray:
        """The first `n` ids of prompt + output (what the KV pool holds after n written)."""
        p = self.prompt_ids()
        if n <= len(p):
            return p[:n]
        return np.concatenate([p, self.output_ids(n - len(p))])


@dataclass(frozen=True)
class Turn:
    """One turn of a closed-loop session: the user's new input, then the model's answer."""

    new_input: PromptSpec
    output_len: int
    max_new_tokens: int
    think_time_s: float = 0.0  # wait after the previous turn finished (ignored for turn 0)


@dataclass
class Session:
    """A closed-loop conversation: turn k+1 is released `think_time_s` after turn k finishes,
    and its prompt is turn k's prompt + turn k's output ids + the new input. The simulator runs
    each session as a SimPy process and calls `request_for_turn` when a turn is due."""

    session_id: int
    start_s: float
    turns: list[Turn]
    request_ids: list[int]
    seed: int = 0

    def request_for_turn(self, k: int, now_s: float, previous: Request | None) -> Request:
        turn = self.turns[k]
        segments: tuple = ()
        if previous is not None:
            prev_out = previous.output_namespace
            if prev_out is None:
                prev_out = namespace_of(previous.seed, previous.request_id, OUTPUT_TAG)
            segments = (*previous.prompt.segments, ("unique", prev_out, previous.output_len, 0))
        rid = self.request_ids[k]
        return Request(
            request_id=rid,
            arrival_s=now_s,
            prompt=PromptSpec(segments + turn.new_input.segments),
            output_len=turn.output_len,
            max_new_tokens=turn.max_new_tokens,
            seed=self.seed,
            session_id=self.session_id,
            turn=k,
            think_time_s=turn.think_time_s,
        )


@dataclass
class Workload:
    """A request stream: open-loop requests (sorted by arrival) plus closed-loop sessions."""

    name: str
    requests: Sequence[Request]  # a list, or columns built on demand (workloads/columns.py)
    sessions: list[Session] = field(default_factory=list)
    seed: int = 0
    description: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return len(self.requests) + sum(len(s.turns) for s in self.sessions)

    def nominal_requests(self) -> list[Request]:
        """Every request, session turns included, in one nominal arrival order.

        Closed-loop turns have no arrival time before a simulation runs, so here turn k is
        placed at `start_s + sum of think times of turns 1..k` (service time taken as zero):
        turn k+1 always comes after turn k, and its prompt is built from turn k exactly as the
        simulator builds it (`Session.request_for_turn`). Ties keep open-loop requests first
        (in list order), then sessions in list order, then turns in order. Used by
        `ideal_reuse`, `trace_stats` and `to_frame`, so they agree with each other.
        """
        if not self.sessions:  # open loop only: by arrival, ties in list order (stable)
            return sorted(self.requests, key=attrgetter("arrival_s"))
        keyed: list[tuple[float, int, int, int, Request]] = [
            (r.arrival_s, 0, i, 0, r) for i, r in enumerate(self.requests)
        ]
        keyed.extend(self._session_turns())
        keyed.sort(key=lambda x: x[:4])
        return [x[4] for x in keyed]

    def _session_turns(self) -> list[tuple[float, int, int, int, Request]]:
        """Each session turn at its nominal time, keyed as `nominal_requests` sorts them."""
        keyed: list[tuple[float, int, int, int, Request]] = []
        for si, sess in enumerate(self.sessions):
            prev: Request | None = None
            t = sess.start_s
            for k in range(len(sess.turns)):
                if k > 0:
                    t += sess.turns[k].think_time_s
                req = sess.request_for_turn(k, t, prev)
                keyed.append((t, 1, si, k, req))
                prev = req
        return keyed

    def nominal_order(self) -> Sequence[Request]:
        """`nominal_requests`, built lazily where it can be: a workload of open-loop requests
        held as columns gives a view that builds each request when read, so a pass over a
        million requests (the reuse gap) holds one at a time."""
        columns = getattr(self.requests, "nominal", None)  # workloads/columns.py
        if self.sessions or columns is None:
            return self.nominal_requests()
        return columns()

    def open_arrivals(self) -> np.ndarray:
        """The open-loop requests' arrival times, in list order (float64; sessions not
        included), without building the requests of a columnar workload."""
        columns = getattr(self.requests, "arrivals", None)
        if isinstance(columns, np.ndarray):
            return columns
        return np.fromiter((r.arrival_s for r in self.requests), dtype=np.float64,
                           count=len(self.requests))

    def arrivals_and_prompt_lens(self) -> tuple[np.ndarray, np.ndarray]:
        """Every request's nominal arrival time and prompt length, session turns included,
        in no particular order (what the overload verdict counts and takes a median of):
        columns, not a sorted list of every request."""
        arrivals = self.open_arrivals()
        plens = getattr(self.requests, "prompt_lens", None)
        if not isinstance(plens, np.ndarray):
            plens = np.fromiter((r.prompt_len for r in self.requests), dtype=np.int64,
                                count=len(self.requests))
        if not self.sessions:
            return arrivals, plens
        turns = self._session_turns()
        return (np.concatenate([arrivals, np.array([t[0] for t in turns], dtype=float)]),
                np.concatenate([plens, np.array([t[4].prompt_len for t in turns],
                                                dtype=np.int64)]))

    def to_frame(self):
        """One row per request (nominal order, see `nominal_requests`): request_id, arrival_s,
        prompt_len, output_len, max_new_tokens, session_id, turn, closed_loop."""
        import pandas as pd

        reqs = self.nominal_requests()
        closed = {rid for sess in self.sessions for rid in sess.request_ids}
        return pd.DataFrame(
            {
                "request_id": np.array([r.request_id for r in reqs], dtype=np.int64),
                "arrival_s": np.array([r.arrival_s for r in reqs], dtype=np.float64),
                "prompt_len": np.array([r.prompt_len for r in reqs], dtype=np.int64),
                "output_len": np.array([r.output_len for r in reqs], dtype=np.int64),
                "max_new_tokens": np.array([r.max_new_tokens for r in reqs], dtype=np.int64),
                "session_id": pd.array([r.session_id for r in reqs], dtype="Int64"),
                "turn": pd.array([r.turn for r in reqs], dtype="Int64"),
                "closed_loop": np.array([r.request_id in closed for r in reqs], dtype=bool),
            }
        )
