"""Sweep figures group lines by the swept axes, never by a resolved column (the default memory
rule gives a pool one slot different per page size); rows order by policy then page size."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from reports.plots import left_out, spans_decades, vs_page_size_figure
from reports.series import label, ordered, series_keys, with_axis_values

SIZES = (1, 4, 16, 64)


def sweep_rows(policies=("vllm", "paged"), sizes=SIZES, seeds=(0,)) -> pd.DataFrame:
    """Summary rows as the default memory rule makes them: kv_tokens differs per page size."""
    rows = []
    for pol in policies:
        for ps in sizes:
            for seed in seeds:
                rows.append({"policy": pol, "page_size": ps, "seed": seed,
                             "kv_tokens": 410485 // ps * ps, "memory_rule": "sglang",
                             "normalized_latency_s": 0.01 * ps + (seed + 1) * 1e-3,
                             "prefix_hit_rate": 0.0, "throughput_tok_s": 100.0 + ps,
                             "internal_frag_pct": 0.1 * ps, "token_states_pct": 50.0})
    return pd.DataFrame(rows)


def test_resolved_pool_does_not_split_lines():
    df = sweep_rows()
    assert df["kv_tokens"].nunique() > 1
    assert series_keys(df, "page_size") == ["policy"]
    assert series_keys(df, "page_size", {"page_size": list(SIZES),
                                         "policy": ["vllm", "paged"]}) == ["policy"]
    fig = vs_page_size_figure(df, "normalized_latency_s", {"page_size": list(SIZES)})
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["paged", "vllm"]
    assert all(len(line.get_xdata()) == len(SIZES) for line in ax.get_lines())


def test_swept_pool_is_a_line_by_its_given_value():
    rows = pd.concat([sweep_rows(sizes=(1, 16)).assign(kv_tokens=lambda d: 5000 // d.page_size
                                                       * d.page_size),
                      sweep_rows(sizes=(1, 16)).assign(kv_tokens=lambda d: 9000 // d.page_size
                                                       * d.page_size)])
    axes = {"kv_tokens": [5000, 9000], "page_size": [1, 16]}
    named = with_axis_values(rows, axes)
    assert sorted(named["kv_tokens"].unique()) == [5000, 9000]
    keys = series_keys(named, "page_size", axes)
    assert keys == ["policy", "kv_tokens"]
    assert {label(r, keys) for _, r in named.iterrows()} == {
        "paged, kv_tokens=5000", "paged, kv_tokens=9000", "vllm, kv_tokens=5000",
        "vllm, kv_tokens=9000"}


def test_rows_ordered_by_policy_then_page_size():
    df = sweep_rows().sample(frac=1.0, random_state=3)
    alpha = ordered(df)
    assert list(alpha["policy"]) == ["paged"] * 4 + ["vllm"] * 4
    assert list(alpha["page_size"]) == [*SIZES, *SIZES]
    listed = ordered(df, {"policy": ["vllm", "paged"], "page_size": [64, 1, 4, 16]})
    assert list(listed["policy"]) == ["vllm"] * 4 + ["paged"] * 4
    assert list(listed["page_size"])[:4] == list(SIZES)  # numbers sort as numbers


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(8)),
       st.lists(st.sampled_from(["paged", "vllm", "contiguous-max"]), min_size=1,
                max_size=3, unique=True))
def test_order_does_not_depend_on_input_order(perm, policies):
    df = sweep_rows(policies=tuple(policies), sizes=(1, 2, 4, 8))
    perm = [p for p in perm if p < len(df)]
    shuffled = df.iloc[perm + [i for i in range(len(df)) if i not in perm]]
    a = ordered(shuffled, {"policy": policies})
    b = ordered(df, {"policy": policies})
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    assert list(dict.fromkeys(a["policy"])) == list(policies)
    for _, g in a.groupby("policy"):
        assert g["page_size"].is_monotonic_increasing


def test_log_axis_when_values_span_decades():
    assert spans_decades([0.05, 6320.0])
    assert not spans_decades([0.05, 0.5])
    assert not spans_decades([0.0, 100.0])  # a log axis cannot show 0
    df = sweep_rows()
    df["normalized_latency_s"] = [0.01, 0.02, 50.0, 6000.0] * 2
    ax = vs_page_size_figure(df, "normalized_latency_s").axes[0]
    assert ax.get_yscale() == "log"
    assert vs_page_size_figure(sweep_rows(), "throughput_tok_s").axes[0].get_yscale() == "linear"


def test_all_zero_metric_is_left_out_with_a_reason():
    skipped = left_out(sweep_rows())
    assert set(skipped) == {"prefix_hit_rate_vs_page_size.png"}
    assert "0 in every run" in skipped["prefix_hit_rate_vs_page_size.png"]
    assert left_out(sweep_rows().assign(prefix_hit_rate=0.3)) == {}
