"""Ideal reuse: hand-made cases, brute force on random streams and on Mooncake."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads.registry import build_workload
from workloads.request import HASH_BLOCK_TOKENS, PromptSpec, Request, Workload
from workloads.reuse import RunRadixTree, ideal_reuse, ideal_reuse_hits, sequence_runs
from workloads.spec import WorkloadSpec
from workloads.stats import trace_stats


def ids_req(rid, ids, out=1, t=None, ns=None):
    arr = np.asarray(ids, dtype=np.int64)
    return Request(rid, float(rid if t is None else t), PromptSpec((("ids", arr),)), out,
                   out, output_namespace=ns)


def brute_force(workload: Workload, page_size: int) -> np.ndarray:
    """Token-level, quadratic, obviously right."""
    reqs = workload.nominal_requests()
    seqs, hits = [], []
    for r in reqs:
        p = r.prompt_ids()
        best = 0
        for s in seqs:
            n = min(len(p), len(s))
            neq = np.flatnonzero(p[:n] != s[:n])
            best = max(best, int(neq[0]) if len(neq) else n)
        m = min(best, max(len(p) - 1, 0))
        hits.append(m - m % page_size)
        seqs.append(r.sequence_ids(r.final_len))
    return np.array(hits, dtype=np.int64)


def test_hand_made_cases():
    w = Workload("w", [ids_req(0, range(10)), ids_req(1, range(10))])
    assert ideal_reuse_hits(w, 1).hits.tolist() == [0, 9]  # capped at prompt - 1
    assert ideal_reuse_hits(w, 4).hits.tolist() == [0, 8]  # whole pages only
    assert ideal_reuse(w, 1) == pytest.approx(9 / 20)
    # a follow-up containing the previous output: prompt + output - 1 tokens are cached
    a = ids_req(0, [5, 6, 7], out=4)
    follow = np.concatenate([a.prompt_ids(), a.output_ids(), [1, 2]])
    w = Workload("w", [a, ids_req(1, follow)])
    assert ideal_reuse_hits(w, 1).hits.tolist() == [0, 3 + 4 - 1]
    # different content, empty stream
    assert ideal_reuse(Workload("w", [ids_req(0, [1, 2]), ids_req(1, [3, 1, 2])]), 1) == 0.0
    assert ideal_reuse(Workload("w", []), 16) == 0.0
    # order is by arrival, not list order
    w = Workload("w", [ids_req(0, [1, 2, 3], t=5.0), ids_req(1, [1, 2, 3, 4], t=1.0)])
    assert ideal_reuse_hits(w, 1).hits.tolist() == [0, 2]
    assert ideal_reuse_hits(w, 1).request_ids.tolist() == [1, 0]


def test_partial_hash_blocks():
    def mc(rid, hashes, n):
        return Request(rid, float(rid), PromptSpec((("hash", tuple(hashes), n),)), 1, 1)

    w = Workload("w", [mc(0, [1, 2], 700), mc(1, [1, 2], 600), mc(2, [1, 2, 3], 1100),
                       mc(3, [1, 9], 1000)])
    hits = ideal_reuse_hits(w, 1).hits.tolist()
    assert hits == [0, 599, 700, HASH_BLOCK_TOKENS]
    assert np.array_equal(ideal_reuse_hits(w, 1).hits, brute_force(w, 1))
    assert np.array_equal(ideal_reuse_hits(w, 64).hits, brute_force(w, 64))


def test_runs_and_tree():
    r = ids_req(0, [3, 4, 5, 9, 10, 2])
    assert sequence_runs(r) == [(3, 3), (9, 2), (2, 1)]
    assert sequence_runs(r, 4) == [(3, 3), (9, 1)]
    t = RunRadixTree()
    t.insert([(0, 10)])
    t.insert([(0, 4), (100, 3)])
    assert t.match([(0, 10)]) == 10 and t.match([(0, 4), (100, 5)]) == 7
    assert t.match([(0, 3), (50, 1)]) == 3 and t.match([(1, 3)]) == 0


segments = st.one_of(
    st.lists(st.integers(0, 6), min_size=1, max_size=6).map(
        lambda x: ("ids", np.array(x, dtype=np.int64))),
    st.tuples(st.just("unique"), st.sampled_from([20000, 20001]), st.integers(1, 5),
              st.integers(0, 4)),
)


def _expand(runs: list[tuple[int, int]]) -> list[int]:
    return [s + i for s, n in runs for i in range(n)]


hash_segment = st.lists(st.integers(0, 3), min_size=1, max_size=2).flatmap(
    lambda h: st.tuples(st.just("hash"), st.just(h), st.integers(
        HASH_BLOCK_TOKENS * (len(h) - 1) + 1, HASH_BLOCK_TOKENS * len(h))))


@settings(max_examples=40, deadline=None)
@given(segs=st.lists(st.one_of(segments, hash_segment), min_size=1, max_size=4),
       out=st.integers(0, 5), ns=st.sampled_from([None, 20000]), cut=st.integers(0, 1100))
def test_sequence_runs_are_the_ids_as_maximal_runs(segs, out, ns, cut):
    """Runs (unique segments and the output built in Python ints, ids and hash blocks through
    numpy) expand to exactly `sequence_ids`, for any length up to past the prompt, and are
    maximal: no empty run, none continuing the previous one. About 0.5 s."""
    r = Request(0, 0.0, PromptSpec(tuple(segs)), out, max(out, 1), output_namespace=ns)
    for n in (None, min(cut, r.final_len), r.final_len):
        runs = sequence_runs(r) if n is None else sequence_runs(r, n)
        want = r.prompt_ids() if n is None else r.sequence_ids(n)
        assert _expand(runs) == want.tolist()
        assert all(ln > 0 for _, ln in runs)
        assert all(a[0] + a[1] != b[0] for a, b in pairwise(runs))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(
        st.tuples(st.lists(segments, min_size=1, max_size=4), st.integers(0, 4),
                  st.sampled_from([None, 20000, 20001]), st.integers(0, 3)),
        min_size=1, max_size=12,
    ),
    page_size=st.sampled_from([1, 2, 3, 4]),
)
def test_matches_brute_force_on_random_streams(reqs, page_size):
    w = Workload("w", [
        Request(i, float(t), PromptSpec(tuple(segs)), out, max(out, 1), output_namespace=ns)
        for i, (segs, out, ns, t) in enumerate(reqs)
    ])
    assert np.array_equal(ideal_reuse_hits(w, page_size).hits, brute_force(w, page_size))


@pytest.mark.parametrize("name", ["chat", "tot", "kshot", "parallel-sampling"])
def test_generators_match_brute_force(name):
    w = build_workload(WorkloadSpec(name=name, num_requests=30, input_len=64, question_len=16,
                                    prefix_len=40, turn_input_min=8, turn_input_max=16,
                                    output_len=8, lengths="fixed"))
    for ps in (1, 16):
        assert np.array_equal(ideal_reuse_hits(w, ps).hits, brute_force(w, ps))
    assert ideal_reuse(w, 1) > 0.3


def _block_reference(workload: Workload) -> int:
    """Independent block-level computation for hash-only prompts (page size 1)."""
    best: dict[tuple, int] = {}
    total = 0
    for r in workload.nominal_requests():
        (_, hashes, n), = r.prompt.segments
        lens = [min(HASH_BLOCK_TOKENS, n - k * HASH_BLOCK_TOKENS) for k in range(len(hashes))]
        m = 0
        for k in range(len(hashes)):
            got = best.get(tuple(hashes[: k + 1]))
            if got is None:
                break
            m += min(got, lens[k])
            if got < lens[k] or lens[k] < HASH_BLOCK_TOKENS:
                break
        total += min(m, n - 1)
        for k in range(len(hashes)):
            key = tuple(hashes[: k + 1])
            best[key] = max(best.get(key, 0), lens[k])
    return total


def test_mooncake_first_3000_page_1(mooncake):
    w = Workload("mc3000", mooncake.requests[:3000])
    res = ideal_reuse_hits(w, 1)
    assert int(res.hits.sum()) == _block_reference(w)
    small = Workload("mc120", mooncake.requests[:120])
    assert np.array_equal(ideal_reuse_hits(small, 1).hits, brute_force(small, 1))
    assert np.array_equal(ideal_reuse_hits(small, 16).hits, brute_force(small, 16))


def test_mooncake_full_matches_readme(mooncake):
    # README: matched leading blocks x 512 capped at input_length: 54,098,411 / 144,793,823.
    # Ours also caps at prompt - 1 and counts partial last blocks, so it is within a hair.
    s = trace_stats(mooncake, 1)
    assert s["input_tokens"] == 144_793_823
    assert s["ideal_reuse"] == pytest.approx(54_098_411 / 144_793_823, abs=5e-4)
    assert s["rows"] == 12031 and s["rate"] == pytest.approx(3.401, abs=1e-3)
    assert s["input"]["p50"] == 6909 and s["output"]["p99"] == pytest.approx(1118.5)


def test_timed_reuse_in_nominal_order_is_the_ideal():
    """Each request admitted after the previous one finished: the timed infinite cache is the
    nominal one, at every page size; admitted all at once, before anything is cached, it
    finds nothing."""
    from workloads.arrivals import fixed_arrivals
    from workloads.generators import shared_prefix
    from workloads.lengths import UniformLengths
    from workloads.reuse import ideal_reuse_hits, timed_reuse_hits

    w = shared_prefix(fixed_arrivals(2.0, 30), 100, 20, UniformLengths(4, 40), seed=2,
                      num_prefixes=3)
    order = [r.request_id for r in w.nominal_requests()]
    admit = {rid: 2.0 * i for i, rid in enumerate(order)}
    done = {rid: 2.0 * i + 1 for i, rid in enumerate(order)}
    for ps in (1, 8, 64):
        ideal = ideal_reuse_hits(w, ps)
        timed = timed_reuse_hits(w, ps, admit, done, done)
        assert [timed[int(r)] for r in ideal.request_ids] == ideal.hits.tolist()
        assert sum(timed.values()) > 0
    at_once = timed_reuse_hits(w, 1, dict.fromkeys(order, 0.0), dict.fromkeys(order, 1.0),
                               dict.fromkeys(order, 2.0))
    assert set(at_once.values()) == {0}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(
        st.tuples(st.lists(segments, min_size=1, max_size=3), st.integers(0, 4),
                  st.sampled_from([None, 20000]), st.integers(0, 3), st.integers(0, 2),
                  st.integers(0, 2)),
        min_size=1, max_size=10,
    ),
    page_size=st.sampled_from([1, 3]),
)
def test_solo_requests_skipped_change_no_hit(reqs, page_size):
    """Leaving out of both passes the requests whose sequence starts with an id no other's
    does (`solo_requests`) gives every hit the full passes give, in the same order, also when
    a prefill takes no time (its own prompt inserted at its admission: then it is walked).
    About 0.5 s."""
    from workloads.reuse import timed_reuse_hits_columns

    w = Workload("w", [
        Request(i, float(t), PromptSpec(tuple(segs)), out, max(out, 1), output_namespace=ns)
        for i, (segs, out, ns, t, _, _) in enumerate(reqs)
    ])
    ids = np.arange(len(reqs), dtype=np.int64)
    admit = np.array([r[3] for r in reqs], dtype=float)
    done = admit + np.array([r[4] for r in reqs], dtype=float)  # 0: a prefill of no time
    finish = done + np.array([r[5] for r in reqs], dtype=float)
    cols = ((ids, admit), (ids, done), (ids, finish))
    fast, full = (ideal_reuse_hits(w, page_size, solo=s) for s in (True, False))
    assert np.array_equal(fast.hits, full.hits) and np.array_equal(fast.hits,
                                                                   brute_force(w, page_size))
    a, b = (timed_reuse_hits_columns(w, page_size, *cols, solo=s) for s in (True, False))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_a_solo_request_with_an_instant_prefill_matches_its_own_prompt():
    from workloads.reuse import solo_requests, timed_reuse_hits

    w = Workload("w", [ids_req(0, [5, 6, 7, 8], out=3), ids_req(1, [900, 901], out=2)])
    assert solo_requests(w.nominal_order()).tolist() == [True, True]
    # request 0's prompt is cached at the instant it is admitted (inserts sort first)
    got = timed_reuse_hits(w, 1, {0: 1.0, 1: 2.0}, {0: 1.0, 1: 3.0}, {0: 4.0, 1: 5.0})
    assert got == {0: 3, 1: 0}
