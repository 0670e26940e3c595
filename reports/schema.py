"""What a results directory holds: its file names and the summary's metric columns.

Shared by the writer (experiments.answers.runner builds the rows, reports.results writes them) and
the readers (plots, report); plain constants, so importing them costs nothing.
"""

from __future__ import annotations

SUMMARY_FILE = "summary.csv"
REQUESTS_FILE = "requests.parquet"
TIMELINE_FILE = "timeline.parquet"
CONFIG_FILE = "config.json"

# the metric columns, in the order summary.csv shows them (then any others simulate adds)
METRICS: tuple[str, ...] = (
    "requests_completed", "requests_rejected", "token_states_pct", "cached_pct",
    "reserved_pct", "internal_frag_pct", "internal_overreserve_pct", "internal_rounding_pct",
    "external_frag_pct", "free_pct", "frag_index", "failed_allocs", "peak_token_states_pct",
    "prefix_hit_rate", "missed_reuse_pct", "queue_backlog", "avg_batch_size", "preemptions",
    "throughput_tok_s", "normalized_latency_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
    "tpot_p99_s", "itl_p50_s", "itl_p99_s", "page_table_bytes", "block_table_entries",
    "sim_wall_s", "latency_profile", "attention_backend", "kernel_page_size",
)  # fmt: skip
# the six parts of the memory breakdown, in percent of capacity: they add up to 100
PARTS_PCT: tuple[str, ...] = ("token_states_pct", "cached_pct", "reserved_pct",
                              "internal_frag_pct", "external_frag_pct", "free_pct")
