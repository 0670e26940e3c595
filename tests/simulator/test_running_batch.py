"""The engine's running batch in columns (simulator/running_batch.py) against a plain list of
requests with their fields, and the closed forms the fast-forward and the latency model use
instead of per-request loops and step x request grids, against those grids (bit for bit).
Hypothesis, no simulation: about a second in all."""

from __future__ import annotations

import numpy as np
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvcore.model.presets import get_gpu, get_model
from simulator import latency as latency_mod
from simulator.fastforward.steps import entries_at_steps
from simulator.latency import make_latency_model
from simulator.request import SimRequest, remaining_new_tokens
from simulator.running_batch import RunningBatch
from workloads.request import PromptSpec, Request

_ENV = simpy.Environment()


def _request(rid: int, prompt: int, output: int, max_new: int) -> SimRequest:
    req = Request(rid, 0.0, PromptSpec((("unique", 7, prompt, 0),)), output, max_new)
    s = SimRequest(req, 1 << 20, _ENV)
    s.written, s.decoded, s.last_token_s = prompt, 1, float(rid)
    return s


class BatchMachine(RuleBasedStateMachine):
    """Every operation on the batch and on a model list of (request, written, decoded, last
    token time); after each, the batch's rows and the synced requests equal the model."""

    def __init__(self) -> None:
        super().__init__()
        self.batch = RunningBatch()
        self.model: list[list] = []  # [request, written, decoded, last_token_s]
        self.next_rid = 0

    @rule(prompt=st.integers(1, 50), output=st.integers(1, 9), max_new=st.integers(1, 6000),
          same=st.booleans())
    def append(self, prompt: int, output: int, max_new: int, same: bool) -> None:
        s = _request(self.next_rid, prompt, output, max_new)
        if same and self.model:  # joins with the batch's last token time (a first token)
            s.last_token_s = self.model[-1][3]
        self.next_rid += 1
        self.batch.append(s)
        self.model.append([s, s.written, s.decoded, s.last_token_s])

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.model) - 1))
        s, w, d, t = self.model.pop(i)
        self.batch.remove(s)
        assert (s.written, s.decoded, s.last_token_s) == (w, d, t)  # written back on leaving

    @precondition(lambda self: self.model)
    @rule(data=st.data(), k=st.integers(1, 4), dt=st.floats(0.001, 1.0))
    def step(self, data: st.DataObject, k: int, dt: float) -> None:
        upto = data.draw(st.integers(0, len(self.model)))
        first = float(self.next_rid) + dt
        last = first + dt
        self.batch.wrote(upto, k)
        values, count = self.batch.stepped(upto, k, first, last)
        want = [first - row[3] for row in self.model[:upto]]
        assert np.repeat(values, count).tolist() == want  # one value n times, or each one
        for row in self.model[:upto]:
            row[1] += k
            row[2] += k
            row[3] = last
        done = self.batch.remove_done(upto)
        expect = [row for row in self.model[:upto] if row[2] >= row[0].output_len]
        assert done == [row[0] for row in expect]
        for row in expect:
            assert (row[0].written, row[0].decoded, row[0].last_token_s) == tuple(row[1:])
            self.model.remove(row)

    @invariant()
    def rows_equal_model(self) -> None:
        b = self.batch
        assert len(b) == len(self.model)
        assert b.rids() == [row[0].rid for row in self.model]
        assert b.written[: b.n].tolist() == [row[1] for row in self.model]
        assert b.remaining_new().tolist() == [
            min(max(row[0].max_new - row[2], 0), 4096) for row in self.model]
        if self.model:
            assert b.min_remaining_output() == min(r[0].output_len - r[2] for r in self.model)
        synced = list(b)  # iterating syncs the requests' own fields
        assert [(s.written, s.decoded, s.last_token_s) for s in synced] == [
            tuple(row[1:]) for row in self.model]
        assert [remaining_new_tokens(s) for s in synced] == b.remaining_new().tolist()


BatchMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=20,
                                          deadline=None)
TestRunningBatch = BatchMachine.TestCase


@settings(max_examples=25, deadline=None)
@given(w0=st.lists(st.integers(0, 300), min_size=1, max_size=30), k=st.integers(1, 70),
       ps=st.sampled_from([1, 2, 16, 64]), other=st.integers(0, 1000))
def test_entries_at_steps_equal_the_grid(w0: list[int], k: int, ps: int, other: int) -> None:
    """The page-table entries after each step of a stretch: the closed form equals the sum
    over the step x request grid of ceil((w0 + j) / ps)."""
    w = np.array(w0, dtype=np.int64)
    grid = (-(-(w[None, :] + np.arange(1, k + 1)[:, None]) // ps)).sum(axis=1)
    now = other + int(grid[-1])  # the entries after the k-th step
    assert entries_at_steps(now, w, k, ps).tolist() == (other + grid).tolist()


@settings(max_examples=30, deadline=None)
@given(ctx=st.lists(st.integers(1, 5000), min_size=1, max_size=40), steps=st.integers(1, 24),
       ps=st.sampled_from([1, 16, 64]),
       model=st.sampled_from(["llama-3.1-8b", "mixtral-8x7b", "deepseek-v3"]),
       tp=st.sampled_from([1, 2]))
def test_short_decode_step_times_equal_the_array_formula(ctx: list[int], steps: int, ps: int,
                                                         model: str, tp: int) -> None:
    """Short stretches price each step with Python floats: the same doubles as numpy's
    formula over all steps (dense, MoE, MLA; one rank and two)."""
    lat = make_latency_model("roofline", get_model(model), get_gpu("h100"), tp=tp)
    c = np.array(ctx, dtype=np.int64)
    scalar = lat.decode_step_times(c, ps, steps)
    saved = latency_mod.SCALAR_STEPS
    latency_mod.SCALAR_STEPS = 0
    try:
        arrays = lat.decode_step_times(c, ps, steps)
    finally:
        latency_mod.SCALAR_STEPS = saved
    assert scalar.tolist() == arrays.tolist()
    assert lat.iteration_time((), c + steps - 1, ps) == scalar[-1]


@settings(max_examples=30, deadline=None)
@given(ctx=st.lists(st.integers(1, 5000), min_size=1, max_size=30), steps=st.integers(1, 70),
       ps=st.sampled_from([1, 16]), now=st.floats(0, 1e4),
       cut=st.one_of(st.none(), st.integers(0, 80)),
       model=st.sampled_from(["llama-3.1-8b", "mixtral-8x7b"]))
def test_decode_step_ends_stop_at_the_arrival(ctx: list[int], steps: int, ps: int, now: float,
                                              cut: int | None, model: str) -> None:
    """A stretch's plan prices its steps only up to the next arrival: the ends equal the
    accumulated `decode_step_times` (as SimPy adds timeouts) up to and including the first
    end at or past `due`, across the scalar / array boundary (SCALAR_STEPS). About 0.5 s."""
    lat = make_latency_model("roofline", get_model(model), get_gpu("h100"))
    c = np.array(ctx, dtype=np.int64)
    full = np.add.accumulate(np.concatenate(([now], lat.decode_step_times(c, ps, steps))))[1:]
    # due: none, exactly one step's end (the boundary case), or between two ends
    due = float("inf") if cut is None else (
        float(full[cut]) if cut < steps else float(full[-1]) + 1.0)
    want = full if cut is None or cut >= steps else full[: cut + 1]
    assert lat.decode_step_ends(c, ps, steps, now, due).tolist() == want.tolist()
    # the base class's reference (every step priced, then cut) agrees
    assert super(type(lat), lat).decode_step_ends(c, ps, steps, now, due).tolist() \
        == want.tolist()


@settings(max_examples=30, deadline=None)
@given(ctx=st.lists(st.integers(1, 1 << 17), min_size=0, max_size=90),
       chunks=st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 1 << 16)), max_size=3),
       ps=st.sampled_from([1, 16, 64]),
       model=st.sampled_from(["llama-3.1-8b", "mixtral-8x7b", "deepseek-v3"]))
def test_small_decode_batches_price_as_numpy_does(ctx: list[int], chunks, ps: int,
                                                  model: str) -> None:
    """An iteration's decode sums in Python ints below SCALAR_DECODE contexts: the same
    time as numpy's sums (the same integers), with and without prefill chunks. About 0.3 s."""
    lat = make_latency_model("roofline", get_model(model), get_gpu("h100"))
    c = np.array(ctx, dtype=np.int64)
    small = lat.iteration_time(chunks, c, ps)
    saved = latency_mod.SCALAR_DECODE
    latency_mod.SCALAR_DECODE = -1
    try:
        assert lat.iteration_time(chunks, c, ps) == small
        new = np.array([n for n, _ in chunks], dtype=np.int64)
        before = np.array([b for _, b in chunks], dtype=np.int64)
        assert lat.iteration_time_arrays(new, before, c, ps) == small
    finally:
        latency_mod.SCALAR_DECODE = saved
