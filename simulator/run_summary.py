"""`RunSummary`: one run's summary as a typed record, one field per summary.csv column.

`simulate` (simulator/run.py) and a fleet (simulator/fleet/) build it; experiments/answers/runner.py
writes its columns into summary.csv after the resolved options, the metrics of
reports/schema.py `METRICS` first, then the others in the record's order. The record's field
names are the column names (tests/simulator/test_run_summary.py checks them against a
summary.csv header), so readers name a column once, here.

Three parts are flattened as they are rather than declared field by field, because their
names depend on the run: `config` (the engine's echo of its `SimConfig`, flat, first), and
a hybrid run's `pools` (one column group per pool kind, simulator/pool_columns.py). A field
whose value is None is a column this run does not have (a full-attention run has no
`effective_page_size`, a fleet replica no reuse gap, a run without a shared tier no
`shared_tier_*`): `columns()` leaves it out, so each run's column set is what it was.

The record is also a read-only mapping of those columns (`summary["ttft_p99_s"]`), for
code that handles every column alike: the fleet's per-column rules (simulator/fleet/
summary.py), comparisons of two runs (tests/simulator/engine_fuzz.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from kvcore.contract.capabilities import POOL_KINDS
from simulator.config import FLAT_FIELDS
from simulator.pool_columns import POOL_COLUMN_SUFFIXES


@dataclass(frozen=True, kw_only=True, eq=False)
class RunSummary(Mapping[str, Any]):
    """One run's figures, in the order summary.csv shows them (after `config`, which the
    CSV replaces by the resolved options). Percentages are of the pool's capacity and
    time-weighted over the measurement window unless said otherwise."""

    #: the engine's echo of its configuration (SimConfig.to_dict()); the calibration fields
    #: below replace the latency options' entries by the values in effect
    config: dict[str, Any] = field(default_factory=dict)

    # -- the pool and the measurement window
    capacity_slots: int
    window_start_s: float
    window_end_s: float

    # -- requests: offered, completed, rejected (could never fit)
    requests_total: int
    requests_completed: int
    requests_rejected: int

    # -- the memory breakdown (kvcore/contract/breakdown.py): its six parts add up to 100; the
    #    internal part split into over-reservation and page rounding; failed allocations;
    #    the peak of the token states
    token_states_pct: float
    cached_pct: float
    reserved_pct: float
    internal_frag_pct: float
    internal_overreserve_pct: float
    internal_rounding_pct: float
    external_frag_pct: float
    free_pct: float
    frag_index: float
    failed_allocs: int
    failed_decode_allocs: int
    peak_token_states_pct: float

    # -- prefix reuse: prompt tokens served from the cache, and reuse a token-granular cache
    #    would have found beyond it (percent of prompt tokens)
    prefix_hit_rate: float
    missed_reuse_pct: float

    # -- scheduling and throughput: the queue left at the window end, batch sizes,
    #    iterations, preemptions and what they cost, generated tokens per second
    queue_backlog: int
    avg_batch_size: float
    peak_batch_size: int
    iterations: int
    preemptions: int
    recomputed_tokens: int
    swapped_tokens: int
    generated_tokens: int
    throughput_tok_s: float

    # -- latency of the completed requests, with the run's own noise by batch means
    #    (simulator/batch_means.py: the batches `;`-separated), and the percentiles; ITL as
    #    the benchmarks define it: every gap between consecutive output tokens, pooled
    normalized_latency_s: float
    normalized_latency_se_s: float
    prefix_hit_rate_se: float
    normalized_latency_batches_s: str
    prefix_hit_rate_batches: str
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    itl_p50_s: float
    itl_p99_s: float

    # -- the page (block) table's device bytes and mean live entries; the clock at the end
    page_table_bytes: int
    block_table_entries: float
    sim_end_s: float

    # -- lower tiers (zeros without one): where hits came from (prefix_hit_rate is their
    #    sum), the tiers' sizes, the bytes moved, the load stall, the host pool's breakdown
    device_hit_rate: float
    host_hit_rate: float
    storage_hit_rate: float
    host_capacity_slots: int
    storage_capacity_slots: int
    host_to_device_bytes: float
    device_to_host_bytes: float
    storage_to_host_bytes: float
    host_to_storage_bytes: float
    load_stall_s: float
    host_token_states_pct: float
    host_cached_pct: float
    host_free_pct: float

    # -- a hybrid run's pools (None / empty for full attention): the block the policy ran
    #    (vLLM may raise it to fit a Mamba page) and each pool kind's columns
    effective_page_size: int | None = None
    pools: dict[str, float | bool] = field(default_factory=dict)

    # -- the latency calibration in effect (simulator/run.py latency_columns): profile and
    #    attention backend ("" for a model without them), the overridable constants (the
    #    roofline only) and the page size the kernel walks
    latency_profile: str
    attention_backend: str
    page_head_overhead_s: float | None = None
    iteration_overhead_s: float | None = None
    kernel_page_size: int

    # -- the overload verdict (simulator/overload.py)
    overloaded: bool
    overload_reason: str
    queue_growth_req_s: float
    queue_delay_growth: float
    unloaded_prefill_s: float
    ttft_over_unloaded: float

    # -- the reuse gap (simulator/reuse_gap.py; a whole run's, so None in a fleet replica's
    #    summary); the losses to a hybrid's window and state rules where its layout has them
    ideal_hit_rate: float | None = None
    reuse_gap_alignment: float | None = None
    reuse_gap_not_arrived: float | None = None
    reuse_gap_capacity: float | None = None
    reuse_gap_window: float | None = None
    reuse_gap_state: float | None = None

    # -- the run's wall time (None in a fleet replica's summary)
    sim_wall_s: float | None = None

    # -- a fleet's shared KV tier (simulator/shared_tier.py; None without one)
    shared_tier_hit_rate: float | None = None
    shared_tier_read_bytes: float | None = None
    shared_tier_write_bytes: float | None = None
    shared_tier_used_pct: float | None = None

    @cached_property
    def _columns(self) -> dict[str, Any]:
        out = dict(self.config)
        for f in fields(self):
            if f.name == "config":
                continue
            if f.name == "pools":
                out.update(self.pools)
                continue
            value = getattr(self, f.name)
            if value is not None or f.name not in OPTIONAL:
                out[f.name] = value
        return out

    def columns(self) -> dict[str, Any]:
        """Every column, flat, in order: `config`'s entries (the calibration fields in
        their place), then the fields, `pools` flattened where it stands, absent ones left
        out."""
        return dict(self._columns)

    @classmethod
    def from_columns(cls, flat: Mapping[str, Any]) -> RunSummary:
        """The record of flat columns (the inverse of `columns`); ValueError for a column
        the record has no place for."""
        own = {k: v for k, v in flat.items() if k in NAMES}
        pools = {k: v for k, v in flat.items() if is_pool_column(k)}
        config = {k: v for k, v in flat.items() if k in FLAT_FIELDS}
        stray = [k for k in flat if k not in own and k not in pools and k not in config]
        if stray:
            raise ValueError(f"summary columns without a RunSummary field: {stray}")
        return cls(config=config, pools=pools, **own)

    # -- the read-only mapping of the columns
    def __getitem__(self, key: str) -> Any:
        return self._columns[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)


#: the record's own column fields (not `config` and `pools`, which hold columns)
NAMES: tuple[str, ...] = tuple(f.name for f in fields(RunSummary)
                               if f.name not in ("config", "pools"))
#: the fields that are a column only when set (None: this run has no such column)
OPTIONAL: frozenset[str] = frozenset(
    f.name for f in fields(RunSummary) if f.default is None)


def is_pool_column(name: str) -> bool:
    """A hybrid run's per-pool-kind column (simulator/pool_columns.py)."""
    return name == "pools_shared" or any(
        name == f"{kind}_{suffix}" for kind in POOL_KINDS for suffix in POOL_COLUMN_SUFFIXES)


__all__ = ["NAMES", "OPTIONAL", "RunSummary", "is_pool_column"]
