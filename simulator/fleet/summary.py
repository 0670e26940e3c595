"""A fleet run's numbers: one summary per replica (the single engine's, of what it was sent),
the cluster's summary combined from them, and the fleet's own columns.

The cluster summary has every column of a single run's, each by a declared rule (`RULES`):
the same for all replicas (the options, the window), a sum (requests, tokens, bytes,
capacity), a mean over replicas (shares of a replica's capacity: replicas are equal), a
maximum (peaks), or recomputed from the fleet's pooled requests and counters (hit rates,
throughput, latency percentiles, inter-token gaps, the overload verdict, the reuse gap). A
fleet of one replica is that replica: its summary is the cluster's.

The fleet's own columns (`FLEET_COLUMNS`): how unevenly the router spread requests and KV
(max / mean over replicas), how it decided (share sent where its prefix information pointed,
share that fell back to load), its cost per decision, the resident working set against the
cluster's KV (the "fill %" of llm-d's capacity reports) and the hottest replica.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from simulator.metrics import weighted_percentiles
from simulator.request_table import REQUEST_COLUMNS, RequestColumns, RequestTable, column, nan_mean
from simulator.run import noise_columns

__all__ = ["FLEET_COLUMNS", "REPLICA_COLUMNS", "RULES", "cluster_requests", "combine",
           "fleet_columns", "percentile", "replica_columns"]

# how each column of a single run's summary becomes the cluster's
SAME, SUM, MEAN, MAX, RECOMPUTE = "same", "sum", "mean", "max", "recompute"
RULES: dict[str, str] = {
    **dict.fromkeys(("window_start_s", "window_end_s", "sim_end_s", "latency_profile",
                     "attention_backend", "page_head_overhead_s", "iteration_overhead_s",
                     "kernel_page_size", "effective_page_size", "unloaded_prefill_s"), SAME),
    **dict.fromkeys(("capacity_slots", "requests_completed", "requests_rejected",
                     "failed_allocs", "failed_decode_allocs", "queue_backlog", "iterations",
                     "preemptions", "recomputed_tokens", "swapped_tokens",
                     "generated_tokens", "page_table_bytes", "block_table_entries",
                     "host_capacity_slots", "storage_capacity_slots", "host_to_device_bytes",
                     "device_to_host_bytes", "storage_to_host_bytes", "host_to_storage_bytes",
                     "load_stall_s"), SUM),
    **dict.fromkeys(("token_states_pct", "cached_pct", "reserved_pct", "internal_frag_pct",
                     "internal_overreserve_pct", "internal_rounding_pct", "external_frag_pct",
                     "free_pct", "frag_index", "host_token_states_pct", "host_cached_pct",
                     "host_free_pct"), MEAN),
    **dict.fromkeys(("peak_token_states_pct", "peak_batch_size"), MAX),
    **dict.fromkeys(("requests_total", "prefix_hit_rate", "missed_reuse_pct",
                     "avg_batch_size", "throughput_tok_s", "normalized_latency_s",
                     "normalized_latency_se_s", "prefix_hit_rate_se",
                     "normalized_latency_batches_s", "prefix_hit_rate_batches", "ttft_p50_s",
                     "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s",
                     "device_hit_rate", "host_hit_rate", "storage_hit_rate", "overloaded",
                     "overload_reason", "queue_growth_req_s", "queue_delay_growth",
                     "ttft_over_unloaded", "ideal_hit_rate", "reuse_gap_alignment",
                     "reuse_gap_not_arrived", "reuse_gap_capacity", "sim_wall_s"),
                    RECOMPUTE),
}

# a replica's row: its index, what it was sent, and its own figures
REPLICA_COLUMNS = ("replica", "requests_routed", "requests_completed", "requests_rejected",
                   "prefix_hit_rate", "throughput_tok_s", "ttft_p50_s", "ttft_p90_s",
                   "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "itl_p50_s",
                   "itl_p90_s", "itl_p99_s", "token_states_pct", "cached_pct",
                   "peak_token_states_pct", "avg_batch_size", "queue_backlog", "preemptions",
                   "overloaded")

FLEET_COLUMNS = ("load_imbalance", "kv_imbalance", "router_match_pct", "router_load_pct",
                 "router_us_per_request", "working_set_tokens", "fill_pct", "hot_replica",
                 "hot_replica_share", "hot_replica_overloaded", "ttft_p90_s", "tpot_p90_s",
                 "itl_p90_s", "kv_events")


def percentile(values: np.ndarray, q: float) -> float:
    """np.percentile of the non-NaN values (NaN for none): the single run's rule."""
    s = values[~np.isnan(values)]
    return float(np.percentile(s, q)) if len(s) else float("nan")


def _completed(requests: RequestColumns) -> np.ndarray:
    if not len(requests):
        return np.zeros(0, dtype=bool)
    return column(requests, "status") == "completed"


def replica_columns(i: int, summary: Mapping[str, Any], requests: RequestColumns, routed: int,
                    itl90: float) -> dict[str, Any]:
    """Replica i's row (REPLICA_COLUMNS) from its summary and its requests."""
    done = _completed(requests)
    out: dict[str, Any] = {"replica": i, "requests_routed": int(routed)}
    for c in REPLICA_COLUMNS[2:]:
        if c in summary:
            out[c] = summary[c]
    for m in ("ttft", "tpot"):
        vals = column(requests, f"{m}_s")[done].astype(float) if len(requests) else \
            np.zeros(0)
        out[f"{m}_p90_s"] = percentile(vals, 90)
    out["itl_p90_s"] = itl90
    return {c: out.get(c, math.nan) for c in REPLICA_COLUMNS}


def cluster_requests(tables: Sequence[RequestColumns]) -> tuple[RequestColumns, np.ndarray]:
    """The replicas' request tables as one (replica after replica) and each row's replica."""
    table = RequestTable()
    which = []
    for i, t in enumerate(tables):
        if not len(t):
            continue
        table.add({c: (t[c].astype(np.float64) if t[c].dtype.kind in "iu" else t[c])
                   for c in REQUEST_COLUMNS})
        which.append(np.full(len(t), i, dtype=np.int64))
    rows = np.concatenate(which) if which else np.zeros(0, dtype=np.int64)
    return table.finished(), rows


def combine(summaries: Sequence[Mapping[str, Any]], recomputed: dict[str, Any]
            ) -> dict[str, Any]:
    """The cluster's summary columns (simulator/run_summary.py `RunSummary.from_columns`
    makes them a record): every column of the replicas' by its rule; RECOMPUTE keys from
    `recomputed`. A key without a rule keeps the replicas' value when they all agree, else
    their mean (numbers) or the first replica's."""
    out: dict[str, Any] = {}
    for key in summaries[0]:
        vals = [s[key] for s in summaries]
        rule = RULES.get(key)
        if rule == RECOMPUTE:
            out[key] = recomputed.get(key, math.nan)
        elif rule == SUM:
            out[key] = sum(vals)
        elif rule == MEAN:
            out[key] = float(sum(vals) / len(vals))
        elif rule == MAX:
            out[key] = max(vals)
        elif all(_equal(v, vals[0]) for v in vals):
            out[key] = vals[0]
        elif all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
                 for v in vals):
            out[key] = float(sum(vals) / len(vals))
        else:
            out[key] = vals[0]
    # a replica's summary lacks the columns only a whole run has (the reuse gap)
    for key, value in recomputed.items():
        if RULES.get(key) == RECOMPUTE and key not in out:
            out[key] = value
    return out


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def recompute(requests: RequestColumns, engines: Sequence[Any], recorders: Sequence[Any],
              gaps: list, first_arrival: float, num_requests: int) -> dict[str, Any]:
    """The RECOMPUTE columns that come from the pooled requests and counters (the overload
    verdict and the reuse gap are added by the caller)."""
    done = _completed(requests)
    f = {c: (column(requests, c)[done].astype(float) if len(requests) else np.zeros(0))
         for c in ("request_id", "arrival_s", "ttft_s", "tpot_s", "normalized_latency_s",
                   "cached_tokens", "prompt_len")}
    hit = sum(e.hit_tokens for e in engines)
    token_hit = sum(e.token_hit_tokens for e in engines)
    prompt = sum(e.prompt_tokens for e in engines)
    generated = sum(e.generated_tokens for e in engines)
    makespan = max(e.last_finish_s for e in engines) - first_arrival
    iters = sum(r.iterations for r in recorders)
    tier_tokens = {"host": 0, "storage": 0}
    for e in engines:
        if e.tier is not None:
            tier_tokens["host"] += e.tier.host_tokens
            tier_tokens["storage"] += e.tier.storage_tokens
    n_done = len(f["arrival_s"])
    itl = weighted_percentiles(gaps, (50, 90, 99))
    out = {
        "requests_total": num_requests,
        "prefix_hit_rate": hit / prompt if prompt else 0.0,
        "missed_reuse_pct": (token_hit - hit) / prompt * 100.0 if prompt else 0.0,
        "avg_batch_size": sum(r.batch_sum for r in recorders) / iters if iters else 0.0,
        "throughput_tok_s": generated / makespan if makespan > 0 else 0.0,
        "normalized_latency_s": nan_mean(f["normalized_latency_s"]) if n_done else math.nan,
        **noise_columns(f),
        "device_hit_rate": (hit - tier_tokens["host"] - tier_tokens["storage"]) / prompt
        if prompt else 0.0,
        "host_hit_rate": tier_tokens["host"] / prompt if prompt else 0.0,
        "storage_hit_rate": tier_tokens["storage"] / prompt if prompt else 0.0,
        "itl_p50_s": itl[0], "itl_p90_s": itl[1], "itl_p99_s": itl[2],
    }
    for m in ("ttft", "tpot"):
        for q in (50, 90, 99):
            out[f"{m}_p{q}_s"] = percentile(f[f"{m}_s"], q) if n_done else math.nan
    return out


def imbalance(values: Sequence[float]) -> float:
    """max / mean (1: perfectly even; NaN when the mean is 0)."""
    mean = float(np.mean(values)) if len(values) else 0.0
    return float(max(values) / mean) if mean > 0 else math.nan


def fleet_columns(replica_rows: Sequence[dict], how: dict[str, int], decisions: int,
                  router_s: float, prefix_aware: bool, working: float,
                  replica_capacity: int, kv_events: bool) -> dict[str, Any]:
    """FLEET_COLUMNS but the p90s; `working`: the resident working set in tokens (the
    admitted prompt tokens an infinite cache would compute)."""
    routed = [r["requests_routed"] for r in replica_rows]
    hot = int(np.argmax(routed)) if routed else 0
    total = sum(routed)
    cap = replica_capacity * len(replica_rows)
    return {
        "load_imbalance": imbalance(routed),
        "kv_imbalance": imbalance([r["token_states_pct"] for r in replica_rows]),
        "router_match_pct": 100.0 * how.get("match", 0) / decisions
        if prefix_aware and decisions else math.nan,
        "router_load_pct": 100.0 * how.get("load", 0) / decisions
        if prefix_aware and decisions else math.nan,
        "router_us_per_request": 1e6 * router_s / decisions if decisions else math.nan,
        "working_set_tokens": working,
        "fill_pct": 100.0 * working / cap if cap and not math.isnan(working) else math.nan,
        "hot_replica": hot,
        "hot_replica_share": routed[hot] / total if total else math.nan,
        "hot_replica_overloaded": bool(replica_rows[hot].get("overloaded")) if routed else
        False,
        "kv_events": kv_events,
    }
