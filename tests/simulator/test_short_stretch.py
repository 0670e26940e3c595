"""A short decode stretch recorded from Python lists (`Recorder.add_steps`,
`entries_at_steps_short`), a small batch's step sums in Python ints (`decode_step_ends`
below SCALAR_DECODE) and the running batch's kept remaining-output sum: bit for bit the
array forms they stand in for; the gap groups' counts by runs; a request's ids built once
to its final length. About 2.5 s in all."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant

import simulator.latency as latency_mod
from kvcore.model.presets import get_gpu, get_model
from simulator.fastforward.steps import entries_at_steps, entries_at_steps_short
from simulator.latency import make_latency_model
from simulator.metrics import SCALAR_PROFILE, Recorder, _group_counts
from simulator.request import SimRequest
from tests.simulator.test_running_batch import _ENV, BatchMachine
from workloads.request import PromptSpec, Request


def _recorder(ws: float, we: float) -> Recorder:
    return Recorder(capacity=1 << 20, window_start=ws, window_end=we,
                    timeline_interval_s=1.0, max_timeline_rows=100)


def _state(rec: Recorder) -> tuple:
    return (rec.part_seconds.tolist(), rec.over_seconds, rec.frag_index_seconds,
            rec.page_entry_seconds, rec.peak_token_states, rec.host_seconds.tolist())


_TIMES = st.floats(0.0, 50.0, allow_nan=False)


@settings(max_examples=150, deadline=None)
@given(start=_TIMES, steps=st.lists(st.floats(0.0, 0.2, allow_nan=False), min_size=1,
                                    max_size=SCALAR_PROFILE + 4),
       rows_seed=st.integers(0, 2**32 - 1), window=st.tuples(_TIMES, _TIMES),
       frag=st.floats(0.0, 1.0), over=st.integers(0, 1 << 20), host=st.booleans(),
       before=st.lists(st.floats(0.0, 1e6), min_size=4, max_size=4))
def test_add_steps_is_add_profile(start: float, steps: list[float], rows_seed: int,
                                  window: tuple[float, float], frag: float, over: int,
                                  host: bool, before: list[float]) -> None:
    """The list form accumulates the same doubles as the matrix form, inside the window,
    across its edges, past SCALAR_PROFILE steps and with a host tier (those two take the
    array form); the running totals start from earlier sums."""
    ends = np.add.accumulate(np.array([start, *steps]))[1:]
    starts = np.concatenate(([start], ends[:-1]))
    rng = np.random.default_rng(rows_seed)
    k = len(steps)
    rows = rng.integers(0, 1 << 20, size=(k, 6), dtype=np.int64)
    entries = np.cumsum(rng.integers(0, 40, size=k)) + int(rng.integers(0, 1 << 16))
    ws, we = min(window), max(window)
    a, b = _recorder(ws, we), _recorder(ws, we)
    for rec in (a, b):
        rec.part_seconds = np.array([*before, before[0] * 3.7, 0.1], dtype=float)
        rec.over_seconds, rec.frag_index_seconds, rec.page_entry_seconds = before[1:]
        rec.peak_token_states = int(before[0]) % 1000
        rec.host = (12345, 7) if host else (0, 0)
    a.add_profile(starts, ends, rows, frag, entries, over)
    b.add_steps(starts.tolist(), ends.tolist(), rows.tolist(), frag, entries.tolist(), over)
    assert _state(b) == _state(a)


@given(w0=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=80),
       k=st.integers(1, 40), ps=st.sampled_from([1, 2, 16, 64, 256]),
       now=st.integers(10_000, 1 << 20))
def test_entries_short_is_the_array_form(w0: list[int], k: int, ps: int, now: int) -> None:
    """Page-table entries after each step, in Python ints: the array form's numbers."""
    expect = entries_at_steps(now, np.array(w0, dtype=np.int64), k, ps).tolist()
    assert entries_at_steps_short(now, w0, k, ps) == expect


@settings(max_examples=80, deadline=None)
@given(ctx=st.lists(st.integers(1, 1 << 17), min_size=1, max_size=90),
       steps=st.integers(1, 60), ps=st.sampled_from([1, 16, 64]),
       due=st.floats(0.0, 3.0), model=st.sampled_from(["llama-3.1-8b", "deepseek-v3"]))
def test_small_batch_step_ends_are_numpys(ctx: list[int], steps: int, ps: int, due: float,
                                          model: str) -> None:
    """A stretch's plan from a small batch's sums in Python ints (below SCALAR_DECODE) ends
    its steps at the same instants as from numpy's sums."""
    lat = make_latency_model("roofline", get_model(model), get_gpu("h100"))
    c = np.array(ctx, dtype=np.int64)
    small = lat.decode_step_ends(c, ps, steps, 1.5, 1.5 + due).tolist()
    saved = latency_mod.SCALAR_DECODE
    latency_mod.SCALAR_DECODE = -1
    try:
        assert lat.decode_step_ends(c, ps, steps, 1.5, 1.5 + due).tolist() == small
    finally:
        latency_mod.SCALAR_DECODE = saved


@given(x=st.floats(0.0, 1e9, allow_nan=False, allow_infinity=False))
def test_math_nextafter_is_numpys(x: float) -> None:
    """wait_until steps with math.nextafter: numpy's neighbouring doubles, as floats."""
    assert math.nextafter(x, math.inf) == float(np.nextafter(x, np.inf))
    assert math.nextafter(x, -math.inf) == float(np.nextafter(x, -np.inf))


class KeptSumMachine(BatchMachine):
    """The batch machine's operations (appends, removals, steps of some or all rows, the
    finished leaving); after each, the kept sum equals the model's, so a change that did not
    drop it shows."""

    @invariant()
    def kept_sum_equals_model(self) -> None:
        want = sum(min(max(row[0].max_new - row[2], 0), 4096) for row in self.model)
        assert self.batch.remaining_new_sum() == want
        assert self.batch.remaining_new_sum() == int(self.batch.remaining_new().sum())


KeptSumMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=20,
                                            deadline=None)
TestKeptSum = KeptSumMachine.TestCase


@settings(max_examples=60)
@given(groups=st.lists(st.tuples(st.integers(1, 6), st.one_of(
    st.integers(1, 1 << 20), st.lists(st.integers(1, 1 << 20), min_size=6, max_size=6))),
    min_size=1, max_size=30))
def test_group_counts_by_runs_are_one_full_per_group(groups) -> None:
    """Each gap's count in order (merged groups' arrays between runs of one-count groups):
    what one np.full per group gave."""
    built = [(np.zeros(n), np.array(c[:n], dtype=np.int64) if isinstance(c, list) else c)
             for n, c in groups]
    want = np.concatenate([c if isinstance(c, np.ndarray) else np.full(len(v), c, np.int64)
                           for v, c in built])
    got = _group_counts(built)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


@st.composite
def _segment(draw: st.DrawFn) -> tuple:
    """One prompt segment of each kind PromptSpec builds: unique content, hash blocks (the
    last one partial) or explicit ids."""
    kind = draw(st.sampled_from(["unique", "hash", "ids"]))
    if kind == "unique":
        return ("unique", draw(st.integers(1 << 14, 1 << 30)), draw(st.integers(0, 300)),
                draw(st.integers(0, 50)))
    if kind == "hash":
        blocks = tuple(draw(st.lists(st.integers(0, 1 << 20), min_size=1, max_size=2)))
        return ("hash", blocks, draw(st.integers(1, 512 * len(blocks))))
    return ("ids", np.array(draw(st.lists(st.integers(0, 1 << 14), max_size=40)),
                            dtype=np.int64))


@given(segments=st.lists(_segment(), min_size=1, max_size=3), output=st.integers(0, 300),
       max_new=st.integers(1, 400), asks=st.lists(st.integers(0, 1500), max_size=5))
def test_ids_built_once_are_the_prefixes_asked(segments: list[tuple], output: int,
                                               max_new: int, asks: list[int]) -> None:
    """A request's ids are built once to its final length; each later ask (admission's
    prompt, the cache insert's and finish's written length) gets exactly the ids that
    building to that length gave."""
    req = Request(7, 0.0, PromptSpec(tuple(segments)), output, max_new)
    sreq = SimRequest(req, 1 << 20, _ENV)
    for n in [sreq.prompt_len, *asks, sreq.final_len]:
        n = min(n, sreq.final_len)
        assert sreq.seq_ids(n).tolist() == req.sequence_ids(n).tolist()
