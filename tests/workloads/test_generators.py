"""Arrival processes, length distributions and prefix-sharing generators."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.arrivals import (
    ArrivalConfig,
    arrival_times,
    fixed_arrivals,
    gamma_arrivals,
    poisson_arrivals,
    trace_arrivals,
)
from workloads.errors import WorkloadError
from workloads.generators import (
    OutputLimits,
    chat_sessions,
    parallel_sampling,
    shared_prefix,
    tree_of_thought,
)
from workloads.lengths import (
    ALPACA_MEANS,
    SHAREGPT_MEANS,
    EmpiricalLengths,
    FixedLengths,
    LogNormalLengths,
    UniformLengths,
    alpaca_lengths,
    length_model,
    rescale_to_mean,
    sharegpt_lengths,
    sharegpt_real_lengths,
)
from workloads.registry import build_workload
from workloads.spec import WorkloadSpec


def rng(seed=0):
    return np.random.default_rng(seed)


def test_poisson_and_gamma_rates():
    t = poisson_arrivals(5.0, rng(), num_requests=20000)
    assert t[0] == 0.0 and len(t) == 20000
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    g = np.diff(gamma_arrivals(5.0, 3.0, rng(), num_requests=20000))
    assert g.mean() == pytest.approx(0.2, rel=0.08)
    assert g.std() / g.mean() == pytest.approx(3.0, rel=0.1)


def test_duration_bound_and_fixed():
    t = poisson_arrivals(10.0, rng(), duration_s=100.0)
    assert t.max() < 100.0 and len(t) == pytest.approx(1000, rel=0.1)
    assert fixed_arrivals(2.0, duration_s=2.0).tolist() == [0.0, 0.5, 1.0, 1.5]
    assert fixed_arrivals(2.0, num_requests=3).tolist() == [0.0, 0.5, 1.0]
    assert len(poisson_arrivals(1.0, rng(), num_requests=1000, duration_s=10.0)) < 1000
    assert trace_arrivals([10.0, 12.0, 14.0], rate_scale=2.0).tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "kwargs",
    [dict(kind="poisson", rate=0.0), dict(kind="gamma", rate=1.0, cv=0.0),
     dict(kind="nope", rate=1.0), dict(kind="trace", rate=1.0)],
)
def test_arrival_errors(kwargs):
    with pytest.raises(WorkloadError):
        arrival_times(ArrivalConfig(**kwargs), rng(), num_requests=5)
    with pytest.raises(WorkloadError, match="num_requests or duration_s"):
        poisson_arrivals(1.0, rng())


def test_seeded_determinism():
    a = poisson_arrivals(3.0, rng(7), num_requests=50)
    b = poisson_arrivals(3.0, rng(7), num_requests=50)
    assert np.array_equal(a, b)
    for name in ("sharegpt", "chat", "tot", "kshot", "parallel-sampling"):
        w1 = build_workload(WorkloadSpec(name=name, seed=3, num_requests=40))
        w2 = build_workload(WorkloadSpec(name=name, seed=3, num_requests=40))
        w3 = build_workload(WorkloadSpec(name=name, seed=4, num_requests=40))
        f1, f2, f3 = w1.to_frame(), w2.to_frame(), w3.to_frame()
        assert f1.equals(f2)
        r1, r2 = w1.nominal_requests(), w2.nominal_requests()
        assert all(np.array_equal(x.sequence_ids(x.final_len), y.sequence_ids(y.final_len))
                   for x, y in zip(r1, r2, strict=True))
        assert not np.array_equal(r1[0].prompt_ids(), w3.nominal_requests()[0].prompt_ids())
        assert not f1.arrival_s.equals(f3.arrival_s) or not f1.prompt_len.equals(f3.prompt_len)


def test_length_distribution_means():
    r = rng(1)
    assert FixedLengths(9).sample(r, 5).tolist() == [9] * 5
    u = UniformLengths(256, 512).sample(r, 20000)
    assert u.min() >= 256 and u.max() <= 512 and u.mean() == pytest.approx(384, rel=0.01)
    ln = LogNormalLengths(300.0, 1.0).sample(r, 50000)
    assert ln.min() >= 1 and ln.mean() == pytest.approx(300, rel=0.04)
    e = EmpiricalLengths(np.array([1, 3])).sample(r, 10000)
    assert set(e.tolist()) == {1, 3} and e.mean() == pytest.approx(2, rel=0.03)
    for name in ("fixed", "uniform", "lognormal"):
        i, o = length_model(name, 200, 50, 0.5, 0.5).sample_pairs(r, 20000)
        assert i.mean() == pytest.approx(200, rel=0.03) and o.mean() == pytest.approx(50, rel=0.03)
    with pytest.raises(WorkloadError):
        length_model("nope")


def test_sharegpt_rescaled_to_paper_means():
    m = sharegpt_lengths()
    assert m.means[0] == pytest.approx(SHAREGPT_MEANS[0], abs=0.01)
    assert m.means[1] == pytest.approx(SHAREGPT_MEANS[1], abs=0.01)
    assert m.inputs.min() >= 1 and m.outputs.min() >= 1
    raw_in, _ = sharegpt_real_lengths()
    # the shape is the file's: the order of rows is kept (rank correlation 1)
    order = np.argsort(raw_in, kind="stable")
    assert np.all(np.diff(m.inputs[order]) >= 0)
    i, o = m.sample_pairs(rng(2), 40000)
    assert i.mean() == pytest.approx(SHAREGPT_MEANS[0], rel=0.03)
    assert o.mean() == pytest.approx(SHAREGPT_MEANS[1], rel=0.03)
    scaled, _ = rescale_to_mean(np.array([1, 2, 3, 10]), 8.0)
    assert scaled.mean() == pytest.approx(8.0, abs=0.26) and scaled.min() >= 1


def test_alpaca_means():
    i, o = alpaca_lengths().sample_pairs(rng(3), 60000)
    assert i.mean() == pytest.approx(ALPACA_MEANS[0], rel=0.03)
    assert o.mean() == pytest.approx(ALPACA_MEANS[1], rel=0.03)


def test_shared_prefix_structure():
    t = np.arange(10, dtype=float)
    w = shared_prefix(t, 100, 20, FixedLengths(5), seed=1, num_prefixes=2)
    ids = [r.prompt_ids() for r in w.requests]
    assert all(len(x) == 120 for x in ids)
    assert np.array_equal(ids[0][:100], ids[2][:100])
    assert not np.array_equal(ids[0][:100], ids[1][:100])
    assert ids[0][100] != ids[2][100]


def test_chat_sessions_turns_extend_previous():
    starts = np.array([0.0, 1.0])
    w = chat_sessions(starts, 4, UniformLengths(256, 512), UniformLengths(10, 20),
                      think_time_s=2.0, system_len=32, seed=5)
    assert len(w.sessions) == 2 and w.num_requests == 8 and w.requests == []
    for sess in w.sessions:
        prev = None
        for k, turn in enumerate(sess.turns):
            req = sess.request_for_turn(k, 100.0 + k, prev)
            assert req.request_id == sess.request_ids[k] and req.turn == k
            new = turn.new_input.token_ids()
            assert 256 <= len(new) <= 512 + (32 if k == 0 else 0)
            if prev is not None:
                expect = np.concatenate([prev.prompt_ids(), prev.output_ids(), new])
                assert np.array_equal(req.prompt_ids(), expect)
                # what the previous turn left in the KV cache is a prefix of this prompt
                kv = prev.sequence_ids(prev.final_len)
                assert np.array_equal(req.prompt_ids()[: len(kv)], kv)
            prev = req
    s0 = [sess.request_for_turn(0, 0.0, None).prompt_ids()[:32] for sess in w.sessions]
    assert np.array_equal(s0[0], s0[1])  # shared system prompt
    reqs = w.nominal_requests()
    for sess in w.sessions:  # nominal order: turn k+1 after turn k
        pos = [next(i for i, r in enumerate(reqs) if r.request_id == rid)
               for rid in sess.request_ids]
        assert pos == sorted(pos)


def test_chat_max_requests_and_limits():
    w = chat_sessions(np.zeros(5), 4, FixedLengths(300), FixedLengths(50), seed=0,
                      limits=OutputLimits(max_context_len=1000), max_requests=10)
    assert w.num_requests == 10 and len(w.sessions[-1].turns) == 2
    t = w.sessions[0].turns
    # prompt lengths 300, 650, 1000 (> context): max_new_tokens = max(1, 1000 - prompt)
    assert [x.max_new_tokens for x in t] == [700, 350, 1, 1]
    assert [x.output_len for x in t] == [50, 50, 1, 1]


def test_tree_of_thought():
    w = tree_of_thought(np.array([0.0]), depth=2, branching=3, root_len=64, step_len=8,
                        output=FixedLengths(4), level_interval_s=1.0, seed=2)
    assert len(w.requests) == 13
    by_id = {r.request_id: r for r in w.requests}
    for r in w.requests:
        p = r.meta["parent"]
        assert r.arrival_s == r.meta["depth"] * 1.0
        if p is None:
            assert r.prompt_len == 64
            continue
        par = by_id[p]
        expect = np.concatenate([par.prompt_ids(), par.output_ids()])
        assert np.array_equal(r.prompt_ids()[: len(expect)], expect)
        assert r.prompt_len == len(expect) + 8


def test_parallel_sampling():
    w = parallel_sampling(np.array([0.0, 1.0]), 3, sharegpt_lengths(), seed=1)
    assert len(w.requests) == 6
    g0 = w.requests[:3]
    assert all(r.arrival_s == 0.0 for r in g0)
    assert all(np.array_equal(r.prompt_ids(), g0[0].prompt_ids()) for r in g0)
    assert not np.array_equal(g0[0].output_ids(3), g0[1].output_ids(3))
    assert not np.array_equal(g0[0].prompt_ids()[:1], w.requests[3].prompt_ids()[:1])
