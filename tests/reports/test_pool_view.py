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


def test_a_shared_pool_is_shown_once_with_each_kinds_share() -> None:
    """vLLM's KV cache groups draw from one block pool: the run's row says so
    (`pools_shared`), and the table shows that pool's bytes once, then each kind's share of
    it, never the pool's bytes on every kind's line as if each had them (kvsim issue 38.6)."""
    row = {"policy": "vllm", "page_size": 16, "pools_shared": True, "prefix_hit_rate": 0.3,
           "full_pool_capacity_bytes": 10 * 2**30, "full_pool_used_pct": 20.0,
           "full_pool_cached_pct": 5.0, "full_pool_hit_rate": 0.4,
           "mamba_pool_capacity_bytes": 10 * 2**30, "mamba_pool_used_pct": 30.0,
           "mamba_pool_cached_pct": 10.0, "mamba_pool_hit_rate": 0.3}
    assert pool_rows([row]) == [
        ["vllm", "16", "shared pool", "10.00", "50.0", "15.0", "0.300"],
        ["vllm", "16", "  full share", "shared", "20.0", "5.0", "0.400"],
        ["vllm", "16", "  mamba share", "shared", "30.0", "10.0", "0.300"]]
    separate = {**row, "pools_shared": False}
    assert [line[3] for line in pool_rows([separate])] == ["10.00", "10.00"]


def test_a_vllm_hybrid_run_reports_one_shared_pool() -> None:
    from experiments.answers.runner import simulate_options
    from experiments.options.run_options import RunOptions

    opts = RunOptions.from_mapping({"model": "qwen3.5-4b", "policy": "vllm", "budget": "vllm",
                                    "workload": "chat", "num_requests": 6})
    row, _ = simulate_options(opts)
    assert row["pools_shared"] is True
    lines = pool_rows([row])
    assert [ln[2] for ln in lines] == ["shared pool", "  full share", "  mamba share"]
    assert sum(ln[3] != "shared" for ln in lines) == 1  # the pool's bytes appear once
    paged, _ = simulate_options(RunOptions.from_mapping(
        {"model": "qwen3.5-4b", "policy": "paged", "page_size": 1, "workload": "chat",
         "num_requests": 6}))
    assert paged["pools_shared"] is False  # SGLang's pools are separate
