"""A hybrid run's pools per layer kind in the terminal and the report (reports/pool_view.py);
a full-attention row gives nothing. Cost: < 0.1 s."""

from __future__ import annotations

from reports.pool_view import pool_rows, pool_table


def test_one_line_per_pool_kind_of_a_hybrid_row() -> None:
    row = {"policy": "paged", "page_size": 1, "mamba_pool_capacity_bytes": 3 * 2**30,
           "mamba_pool_used_pct": 12.5, "mamba_pool_cached_pct": 2.0,
           "mamba_pool_hit_rate": 0.25, "full_pool_capacity_bytes": 2**30,
           "full_pool_used_pct": 50.0, "full_pool_cached_pct": 10.0, "full_pool_hit_rate": 0.5}
    assert pool_rows([row]) == [["paged", "1", "full", "1.00", "50.0", "10.0", "0.500"],
                                ["paged", "1", "mamba", "3.00", "12.5", "2.0", "0.250"]]
    table = pool_table([row])
    assert table is not None and table.row_count == 2


def test_a_full_attention_row_has_no_pool_lines() -> None:
    row = {"policy": "paged", "page_size": 16, "prefix_hit_rate": 0.4}
    assert pool_rows([row]) == [] and pool_table([row]) is None
