"""`simulate(workload, config)`: build the policy, latency model and engine, run, summarise."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy
import torch

from kvcore.contract.breakdown import mean_frag_index, mean_share_pct
from kvcore.contract.capabilities import DecodeStretch, LowerTiers, PoolKinds
from kvcore.model.presets import get_gpu, get_model
from kvcore.policies import POLICIES, KVPolicy, PolicyConfig, make_policy, policy_kind
from simulator.batch_means import batch_means, batch_ratios, batch_se, batch_text
from simulator.config import SimConfig
from simulator.engine import Engine
from simulator.hybrid import HYBRID_POLICY_FIELDS
from simulator.latency import LatencyModel, make_latency_model
from simulator.metrics import TIMELINE_COLUMNS, Recorder
from simulator.overload import Unfinished, overload_verdict
from simulator.pool_columns import pool_columns
from simulator.request_table import RequestColumns, column, nan_mean
from simulator.reuse_gap import reuse_gap
from simulator.run_summary import RunSummary
from simulator.transfers import TransferModel, tier_tokens
from workloads.request import Workload

if TYPE_CHECKING:
    import pandas as pd

# torch's intra-op threads cost more than they give on the tiny tensors of one engine step:
# the threads' synchronisation outweighs the work (docs/performance.md, "torch threads").
TORCH_THREADS = 1


@dataclass
class SimResult:
    """A run's summary, per-request table and timeline. A run that streamed its rows
    (`simulate(request_sink=...)`) keeps only the summary's columns in memory (`columns`);
    `requests` is then read from where the sink wrote them when first asked for (`load`).
    The table and the timeline are held as numpy columns and rows and become pandas frames
    when first read, so a caller that reads only the summary never imports pandas."""

    summary: RunSummary
    table: RequestColumns  # the per-request columns kept in memory (all, without a sink)
    timeline_rows: list[tuple]  # the Recorder's timeline samples (TIMELINE_COLUMNS)
    config: SimConfig
    extra: dict = field(default_factory=dict)
    load: Callable[[], pd.DataFrame] | None = None  # the whole table of a streamed run
    _frames: dict = field(default_factory=dict, repr=False)

    @property
    def columns(self) -> pd.DataFrame:
        """The per-request columns kept in memory, as a frame (built once)."""
        if "columns" not in self._frames:
            self._frames["columns"] = self.table.frame()
        return self._frames["columns"]

    @property
    def timeline(self) -> pd.DataFrame:
        """The timeline samples as a frame (built once)."""
        if "timeline" not in self._frames:
            import pandas as pd

            self._frames["timeline"] = pd.DataFrame(self.timeline_rows,
                                                    columns=list(TIMELINE_COLUMNS))
        return self._frames["timeline"]

    @property
    def requests(self) -> pd.DataFrame:
        """Every column of every request (read once from the sink's file, if streamed)."""
        if self.load is not None:
            self._frames["columns"], self.load = self.load(), None
        return self.columns


#: The PolicyConfig fields a spec gives as they are: PolicyConfig's field -> (the SimConfig
#: part, that part's field). Each source is named here once; `policy_config` derives the
#: rest (DERIVED_POLICY_FIELDS), and tests/simulator/test_build_policy.py checks that the two
#: name every PolicyConfig field exactly once. A renamed spec field is an AttributeError
#: here, never PolicyConfig's own default.
POLICY_FROM_SPECS: dict[str, tuple[str, str]] = {
    "kv_tokens": ("pool", "kv_tokens"),
    "page_size": ("policy", "page_size"),
    "max_requests": ("engine", "max_running_requests"),  # page-table rows
    "device": ("engine", "device"),
    "placement": ("policy", "placement"),
    "eviction": ("policy", "eviction"),
    "kv_dtype": ("pool", "kv_dtype"),
    "hicache_write_policy": ("tier", "hicache_write_policy"),
}
#: The PolicyConfig fields `policy_config` derives: the resolved context; the model's KV
#: geometry on one tensor-parallel rank; shape-only KV (no buffer) in simulations; the tier
#: sizes in slots; and a hybrid run's layout, budget, vLLM version and hybrid options
#: (the run's resolved layout, `SimConfig.layout`: simulator/hybrid.py
#: `RunLayout.policy_kwargs`, which leave a full-attention run's config as it always was).
DERIVED_POLICY_FIELDS: tuple[str, ...] = (
    "max_context_len", "num_layers", "num_kv_heads", "head_dim", "store_kv", "host_tokens",
    "storage_tokens", *HYBRID_POLICY_FIELDS)


def policy_config(cfg: SimConfig, max_context_len: int) -> PolicyConfig:
    """The PolicyConfig of `cfg`: the spec fields of POLICY_FROM_SPECS as they are, then the
    derived ones (DERIVED_POLICY_FIELDS)."""
    model = get_model(cfg.pool.model)
    pol, pool, tier = cfg.policy, cfg.pool, cfg.tier
    host, storage = tier_tokens(tier, model, pool.kv_dtype, pool.tp, pool.kv_tokens)
    for name, slots in (("--hicache-size / --hicache-ratio", host), ("--storage-size", storage)):
        if 0 < slots < pol.page_size:
            raise ValueError(f"{name}: a tier of {slots} slots is smaller than one page of "
                             f"{pol.page_size} tokens")
    if host and not policy_kind(pol.policy).supports_tiers:
        tiered = [n for n in POLICIES.names() if POLICIES.get(n).supports_tiers]
        raise ValueError(f"--hicache-size / --hicache-ratio: the host tier is built for "
                         f"--policy {' or '.join(tiered)}, not {pol.policy!r}")
    given = {name: attrgetter(f"{part}.{field}")(cfg)
             for name, (part, field) in POLICY_FROM_SPECS.items()}
    # a hybrid's pools are sized from its budget in bytes: the planner's, or for a pool
    # given in slots, those slots of every layer stored as full attention
    kv_bytes = (pool.kv_bytes or pool.kv_tokens * model.kv_bytes_per_token(pool.kv_dtype, pool.tp)
                if cfg.layout.layout is not None else 0)
    derived = dict(
        max_context_len=max_context_len, num_layers=model.num_layers,
        num_kv_heads=model.kv_heads_per_rank(pool.tp), head_dim=model.head_dim,
        store_kv=False, host_tokens=host if host else 0, storage_tokens=storage if host else 0,
        **cfg.layout.policy_kwargs(pol, kv_bytes, pool.vllm_version))
    return PolicyConfig(**given, **derived)


def build_policy(cfg: SimConfig, max_context_len: int) -> KVPolicy:
    """The policy `cfg` names, built from `policy_config`. A hybrid run must get a policy
    that reports its pools per layer kind (`PoolKinds`): one that silently stored every
    layer as full attention would be the baseline under the hybrid's name."""
    pc = policy_config(cfg, max_context_len)
    policy = make_policy(cfg.policy.policy, pc)
    if pc.is_hybrid and not isinstance(policy, PoolKinds):
        policy.close()
        raise ValueError(f"--policy {cfg.policy.policy} built no hybrid pools for "
                         f"{cfg.pool.model} in this version; use --kv-layout full-attention")
    return policy


def _window(workload: Workload, cfg: SimConfig) -> tuple[float, float]:
    first = first_arrival(workload)
    start = first + cfg.engine.warmup_s
    if cfg.duration_s:
        return start, first + cfg.duration_s
    ladder = workload.meta.get("ladder")
    if workload.sessions or not workload.requests or cfg.engine.max_concurrency or (
            ladder is not None and ladder.drain):
        # closed loop (sessions, requests sent as others finish, ladder stages that wait for
        # the one before to drain): ends with the run
        return start, np.inf
    return start, max(float(workload.open_arrivals().max()), start)


def first_arrival(workload: Workload) -> float:
    """The earliest open-loop arrival or session start (0 for none), read from the arrival
    column (a columnar workload builds no request for it)."""
    times = [s.start_s for s in workload.sessions]
    if len(workload.requests):
        times.append(float(workload.open_arrivals().min()))
    return min(times) if times else 0.0


@dataclass
class EngineParts:
    """One engine built over a workload and what it was built from: a run's single engine,
    or one replica of a fleet (simulator/fleet/)."""

    engine: Engine
    policy: KVPolicy
    latency: LatencyModel
    rec: Recorder
    end: float  # the measurement window's end (inf: it ends with the run)


def build_engine(env: simpy.Environment, workload: Workload, cfg: SimConfig,
                 tick: Callable[[int], None] | None = None,
                 request_sink: Callable[[dict[str, np.ndarray]], None] | None = None,
                 ) -> EngineParts:
    """The policy, latency model, recorder and engine `cfg` names, over `workload`, in
    `env` (not started)."""
    model = get_model(cfg.pool.model)
    gpu = get_gpu(cfg.pool.gpu)
    max_ctx = cfg.pool.max_context_len or model.max_position
    policy = build_policy(cfg, max_ctx)
    latency = make_latency_model(cfg.engine.latency, model, gpu, cfg.pool.tp, cfg.pool.kv_dtype,
                                 **cfg.engine.latency_constants(cfg.policy.page_size),
                                 layout=cfg.layout.layout)
    start, end = _window(workload, cfg)
    interval = cfg.engine.timeline_interval_s or (
        (end - start) / 2000 if np.isfinite(end) and end > start else 0.05
    )
    rec = Recorder(policy.capacity, start, end, interval, cfg.tuning.max_timeline_rows,
                   request_sink)
    if isinstance(policy, PoolKinds):
        rec.pools = policy.pool_usage
        if isinstance(policy, DecodeStretch):  # its stretches hand each step's pools
            rec.pool_steps = policy.stretch_pool_usage
    transfers = (TransferModel.of(cfg.tier, model, gpu, cfg.pool.kv_dtype, cfg.pool.tp,
                                  cfg.policy.page_size) if cfg.tier.enabled else None)
    engine = Engine(env, workload, policy, latency, cfg, max_ctx, rec, progress=tick,
                    transfers=transfers)
    return EngineParts(engine, policy, latency, rec, end)


def simulate(
    workload: Workload,
    cfg: SimConfig,
    progress: bool | Callable[[int], None] = False,
    request_sink: Callable[[dict[str, np.ndarray]], None] | None = None,
    event_sink: Callable[..., None] | None = None,
) -> SimResult:
    """Run one engine over `workload`; deterministic for the same inputs and seed.
    `request_sink`: streams the finished requests' rows in chunks of columns (a day's run in
    bounded memory); the result then keeps only the columns its summary reads."""
    torch.set_num_threads(TORCH_THREADS)
    wall0 = time.perf_counter()
    env = simpy.Environment()
    bar = None
    tick: Callable[[int], None] | None = progress if callable(progress) else None
    if progress and tick is None:
        from tqdm import tqdm

        bar = tqdm(total=workload.num_requests, unit="req", desc="simulating", leave=False)
        tick = bar.update
    try:
        parts = build_engine(env, workload, cfg, tick, request_sink)
    except BaseException:
        if bar is not None:
            bar.close()
        raise
    engine, policy, latency, rec, end = (parts.engine, parts.policy, parts.latency, parts.rec,
                                         parts.end)
    engine.event_sink = event_sink  # optional schedule observer (Engine.event_sink)
    engine.start()
    backlog: dict[str, int] = {}

    def close_window():
        if np.isfinite(end) and end > env.now:
            yield env.timeout(end - env.now)
        backlog["queue"] = len(engine.waiting)

    env.process(close_window())
    try:
        if cfg.engine.drain:
            env.run()
        else:
            env.run(until=end if np.isfinite(end) else None)
    finally:
        if bar is not None:
            bar.close()
    if not np.isfinite(rec.window_end):
        rec.window_end = env.now
    # run(until=end) stops before close_window's event at `end`: count the queue here
    backlog.setdefault("queue", len(engine.waiting))
    engine.close_idle(max(rec.window_end, env.now))
    requests = rec.requests_columns()
    queue = backlog.get("queue", 0)
    summary = summarize(
        engine, rec, cfg, policy, latency, requests, queue,
        overload=overload_columns(workload, cfg, latency, rec, requests, queue,
                                  unfinished_requests(engine)),
        reuse=reuse_gap(workload, requests, prefix_block(cfg, policy),
                        *_rule_losses(engine, policy)))
    summary = replace(summary, sim_wall_s=time.perf_counter() - wall0)
    return SimResult(summary, requests, rec.timeline, cfg, {"latency": latency.describe()})


def _rule_losses(engine: Engine, policy: KVPolicy) -> tuple[dict[str, int] | None, bool]:
    """A hybrid run's reuse lost to its other layer kinds' rules (simulator/reuse_gap.py): a
    column per rule its layout has (sliding window: SWA or chunked pools; state: a Mamba
    pool), and whether the state rule kept no cache at all; (None, False) otherwise."""
    if not isinstance(policy, PoolKinds):
        return None, False
    kinds = set(policy.pool_usage())
    lost = {}
    if kinds & {"swa", "chunked"}:
        lost["reuse_gap_window"] = engine.window_lost_tokens
    if "mamba" in kinds:
        lost["reuse_gap_state"] = engine.state_lost_tokens
    return lost, policy.caches_no_prefix()


def prefix_block(cfg: SimConfig, policy: KVPolicy) -> int:
    """The page size prefixes are shared at: the option's, or a hybrid policy's own block
    (vLLM raises an attention + Mamba model's block to fit the state: 528 for Qwen3.5-4B)."""
    return policy.page_size if isinstance(policy, PoolKinds) else cfg.policy.page_size


def latency_columns(cfg: SimConfig, latency: LatencyModel) -> dict[str, Any]:
    """Which calibration the run used, resolved (a bare config names no profile): the profile,
    the attention backend, the constants that options override, and the page size the
    kernel walks (1 where the backend runs page 1 inside the kernel: there --page-size is a
    memory-only choice)."""
    e = cfg.engine
    if e.latency != "roofline":
        return {"latency_profile": "", "attention_backend": "",
                "kernel_page_size": cfg.policy.page_size}
    return {"latency_profile": e.profile_name, "attention_backend": e.resolved_backend(),
            "page_head_overhead_s": latency.page_head_overhead_s,
            "iteration_overhead_s": latency.iteration_overhead_s,
            "kernel_page_size": latency.kernel_page_size(cfg.policy.page_size)}


def unfinished_requests(engine: Engine) -> Unfinished:
    """The requests the run ended with (queued, prefilling, running), which have no result
    row: the overload verdict counts them (simulator/overload.py)."""
    live = [*engine.waiting, *engine.prefilling, *engine.running]
    return Unfinished(np.array([s.req.arrival_s for s in live], dtype=float),
                      np.array([s.admit_s for s in live], dtype=float))


def overload_columns(workload: Workload, cfg: SimConfig, latency: LatencyModel, rec: Recorder,
                     requests: RequestColumns, backlog: int,
                     unfinished: Unfinished) -> dict[str, Any]:
    """The overload columns (simulator/overload.py) from the run's window, its rows, the
    queue left at the window's end and the requests it ended with."""
    # columns, not every request built and sorted: the verdict counts arrivals in the window
    # and takes the median prompt, neither of which depends on the order
    arrivals, prompt_lens = workload.arrivals_and_prompt_lens()
    return overload_verdict(
        arrivals=arrivals, prompt_lens=prompt_lens,
        requests=requests, start=rec.window_start, end=rec.window_end,
        backlog=int(backlog), latency=latency,
        chunk=cfg.engine.chunked_prefill_size, page_size=cfg.policy.page_size,
        unfinished=unfinished)


def _pct(values: np.ndarray, q: float) -> float:
    s = values[~np.isnan(values)]
    return float(np.percentile(s, q)) if len(s) else float("nan")


def _completed(requests: RequestColumns | pd.DataFrame) -> dict[str, np.ndarray]:
    """The float columns the summary reads, of the completed requests (no rows: empty)."""
    names = ("request_id", "arrival_s", "ttft_s", "tpot_s", "normalized_latency_s",
             "cached_tokens", "prompt_len")
    if not len(requests):
        return {c: np.zeros(0) for c in names}
    done = column(requests, "status") == "completed"
    return {c: column(requests, c)[done].astype(float, copy=False) for c in names}


def summarize(engine: Engine, rec: Recorder, cfg: SimConfig, policy: KVPolicy,
              latency: LatencyModel, requests: RequestColumns | pd.DataFrame, backlog: int,
              *, overload: Mapping[str, Any],
              reuse: Mapping[str, Any] | None = None) -> RunSummary:
    """The run's RunSummary (no wall time yet): its pool, requests, breakdown, latency and
    tier figures from the engine and the recorder, the hybrid pools of a `PoolKinds`
    policy, the calibration in effect, and the `overload` verdict and `reuse` gap computed
    by the caller (a fleet replica's summary has no reuse gap)."""
    avg = rec.averages()
    span = rec.window_length
    cap = policy.capacity
    over = mean_share_pct(rec.over_seconds, span, cap)
    done = _completed(requests)
    n_done = len(done["arrival_s"])
    makespan = engine.last_finish_s - first_arrival(engine.workload)
    b_end = policy.breakdown(engine.head_reservation())
    out = {
        "capacity_slots": cap,
        "window_start_s": rec.window_start,
        "window_end_s": rec.window_end,
        "requests_total": engine.workload.num_requests,
        "requests_completed": engine.completed,
        "requests_rejected": engine.rejected,
        "token_states_pct": avg["token_states"],
        "cached_pct": avg["cached"],
        "reserved_pct": avg["reserved"],
        "internal_frag_pct": avg["internal"],
        "internal_overreserve_pct": over,
        "internal_rounding_pct": avg["internal"] - over,
        "external_frag_pct": avg["external"],
        "free_pct": avg["free"],
        "frag_index": mean_frag_index(rec.frag_index_seconds, span),
        "failed_allocs": b_end.failed_allocs,
        "failed_decode_allocs": engine.failed_decode_allocs,
        "peak_token_states_pct": rec.peak_token_states / cap * 100.0,
        "prefix_hit_rate": engine.hit_tokens / engine.prompt_tokens if engine.prompt_tokens
        else 0.0,
        "missed_reuse_pct": (engine.token_hit_tokens - engine.hit_tokens) / engine.prompt_tokens
        * 100.0 if engine.prompt_tokens else 0.0,
        "queue_backlog": backlog,
        "avg_batch_size": rec.batch_sum / rec.iterations if rec.iterations else 0.0,
        "peak_batch_size": rec.peak_batch,
        "iterations": rec.iterations,
        "preemptions": engine.preemptions,
        "recomputed_tokens": engine.recomputed_tokens,
        "swapped_tokens": engine.swapped_tokens,
        "generated_tokens": engine.generated_tokens,
        "throughput_tok_s": engine.generated_tokens / makespan if makespan > 0 else 0.0,
        "normalized_latency_s": nan_mean(done["normalized_latency_s"]) if n_done else
        float("nan"),
        # the run's own noise (simulator/batch_means.py): what a page-size recommendation
        # from one seed per page size needs to call two page sizes equivalent
        **noise_columns(done),
        "ttft_p50_s": _pct(done["ttft_s"], 50) if n_done else float("nan"),
        "ttft_p99_s": _pct(done["ttft_s"], 99) if n_done else float("nan"),
        "tpot_p50_s": _pct(done["tpot_s"], 50) if n_done else float("nan"),
        "tpot_p99_s": _pct(done["tpot_s"], 99) if n_done else float("nan"),
        # inter-token latency as the benchmarks define it: every gap between consecutive
        # output tokens of a request, pooled over requests
        **dict(zip(("itl_p50_s", "itl_p99_s"), rec.itl_percentiles((50, 99)), strict=True)),
        "page_table_bytes": policy.page_table_bytes(),
        "block_table_entries": rec.page_entry_seconds / span if span > 0 else float("nan"),
        "sim_end_s": engine.env.now,
        **tier_summary(engine, rec, policy),
    }
    if isinstance(policy, PoolKinds):  # hybrids only: full-attention columns stay as they were
        # the page (block) size the policy ran: vLLM raises a hybrid's attention block to fit
        # its Mamba page (kvcore/model/hybrid_plan.py), so it may differ from --page-size
        out["effective_page_size"] = policy.page_size
        out["pools"] = pool_columns(policy.pool_usage(), rec.pool_seconds, span,
                                    policy.shared_pool)
    return RunSummary(config=cfg.to_dict(), **out, **latency_columns(cfg, latency),
                      **overload, **(reuse or {}))


def tier_summary(engine: Engine, rec: Recorder, policy: KVPolicy) -> dict[str, Any]:
    """Where hits came from and what the tiers moved (zeros without a tier, so every summary
    has the same columns). prefix_hit_rate stays the total: device + host + storage."""
    tier, prompt = engine.tier, engine.prompt_tokens
    host_hit = tier.host_tokens if tier is not None else 0
    storage_hit = tier.storage_tokens if tier is not None else 0
    state = policy.tier_state() if isinstance(policy, LowerTiers) else None
    page_bytes = tier.model.page_bytes if tier is not None else 0.0
    cap = state.host_capacity if state is not None else 0
    span = rec.window_length
    used, locked = (rec.host_seconds / (span * cap) * 100.0 if cap and span > 0
                    else np.zeros(2))
    return {
        "device_hit_rate": (engine.hit_tokens - host_hit - storage_hit) / prompt if prompt
        else 0.0,
        "host_hit_rate": host_hit / prompt if prompt else 0.0,
        "storage_hit_rate": storage_hit / prompt if prompt else 0.0,
        "host_capacity_slots": cap,
        "storage_capacity_slots": state.storage_capacity if state is not None else 0,
        "host_to_device_bytes": state.pages_h2d * page_bytes if state is not None else 0.0,
        "device_to_host_bytes": state.pages_d2h * page_bytes if state is not None else 0.0,
        "storage_to_host_bytes": state.pages_s2h * page_bytes if state is not None else 0.0,
        "host_to_storage_bytes": state.pages_h2s * page_bytes if state is not None else 0.0,
        "load_stall_s": tier.load_stall_s if tier is not None else 0.0,
        # the host pool's breakdown: loads in flight hold token states, the rest is cache
        "host_token_states_pct": float(locked),
        "host_cached_pct": float(used - locked),
        "host_free_pct": 100.0 - float(used) if cap else 0.0,
    }


def noise_columns(done: dict[str, np.ndarray]) -> dict:
    """Standard errors, by batch means over completed requests in arrival order (ties by
    request id), of the mean normalized latency and of the prefix hit rate (NaN with too few
    requests), and the batch figures themselves (`;`-separated; '' with too few), which a
    page-size recommendation pairs batch by batch across page sizes; `done`: the completed
    requests' float columns (`_completed`)."""
    arrival, ids = done["arrival_s"], done["request_id"]
    lat = batch_means(arrival, done["normalized_latency_s"], ids)
    hit = batch_ratios(arrival, done["cached_tokens"], done["prompt_len"], ids)
    return {"normalized_latency_se_s": batch_se(lat), "prefix_hit_rate_se": batch_se(hit),
            "normalized_latency_batches_s": batch_text(lat),
            "prefix_hit_rate_batches": batch_text(hit)}
