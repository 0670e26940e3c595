"""The published fleet results the fleet validation rows are checked against: each setup
(replicas, model, GPUs, engine flags, the kvsim workload that reproduces its load, the routers
and their configurations) and each figure with its exact source. Data, plus the per-replica
KV pool rows, which need no fleet (`pool_rows`): experiments/validation/fleet_sim.py simulates
the fleets and builds their rows; the figures of a setup it does not simulate are listed in
the report with the reason (`awaiting_rows`).

Every number here was read in its source at the version named (`Source`); none is derived
unless `derived` says so. The knee QPS of each router is derived from the per-QPS tables by
one rule (`knee_qps`).

Sources:

* llm-d kv-cache-manager `benchmarking/73-capacity/README.md` and `37-capacity/README.md` at
  commit d070ea6 (2025-09-21; the 37-capacity text is the same at 2bb0a20, 2025-09-09). The
  vLLM version is not stated; pods' KV sizes are from the profiles' YAML comments.
* lmsys blog `blog/2024-12-04-sglang-v0-4.md` (lm-sys/lm-sys.github.io, the file as stored at
  commit 44576d5): the cache-aware load balancer table; its workload is bench_serving's
  generated-shared-prefix at its v0.4.0 defaults (sglang PR #1990 added the dataset).
* ai-dynamo/dynamo `docs/benchmarks/kv-router-ab-testing.md` (the file at commit 08b41a9,
  image vllm-runtime:1.2.1): "Example Comparison".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from experiments.validation.rows import make_row
from kvcore.model.memory import MemorySpec
from kvcore.model.planner import plan

SECTION = "Fleet pools"


@dataclass(frozen=True)
class Source:
    """Where a figure is printed: a repository file at a commit (or a page), and the table."""

    where: str  # repository : path, or URL
    version: str  # commit / tag and date
    table: str  # the table or passage the figures come from


@dataclass(frozen=True)
class FleetSetup:
    """One published fleet run's hardware and load, in kvsim's terms where kvsim has them."""

    name: str
    replicas: int
    model: str  # kvsim preset
    gpu: str  # kvsim preset
    tp: int
    kv_dtype: str
    engine: str  # the budget rule of the engine the replicas ran
    kv_tokens_per_replica: int | None  # published pool size (None: not published)
    workload: str  # kvsim's named workload (or trace) that sends the same load
    engine_flags: str  # as published
    routers: dict[str, str]  # name in the source -> its configuration as published
    source: Source
    notes: str = ""


@dataclass(frozen=True)
class Figure:
    """One published number: setup, router, metric (with its unit), value, and the stage
    (QPS) it belongs to when it is per stage (None: the whole run)."""

    setup: str
    router: str
    metric: str
    value: float
    qps: float | None = None
    source: Source | None = None
    derived: str = ""  # how it follows from printed numbers, when it is not printed itself


LLMD_73 = Source("llm-d/llm-d-kv-cache-manager : benchmarking/73-capacity/README.md",
                 "commit d070ea6 (2025-09-21)", "Summary across QPS; Per-QPS Results")
LLMD_37 = Source("llm-d/llm-d-kv-cache-manager : benchmarking/37-capacity/README.md",
                 "commit d070ea6 (2025-09-21)", "Summary across QPS; Per-QPS Results")
SGLANG_V04 = Source("https://lmsys.org/blog/2024-12-04-sglang-v0-4/ (lm-sys/lm-sys.github.io "
                    ": blog/2024-12-04-sglang-v0-4.md)", "2024-12-04, file at commit 44576d5",
                    "Cache-Aware Load Balancer table")
DYNAMO_AB = Source("ai-dynamo/dynamo : docs/benchmarks/kv-router-ab-testing.md",
                   "file at commit 08b41a9 (image vllm-runtime:1.2.1)", "Example Comparison")

SETUPS: dict[str, FleetSetup] = {s.name: s for s in (
    FleetSetup(
        "llm-d 73-capacity", 8, "qwen3-32b", "h100", 2, "bf16", "vllm", 307_328,
        "llmd-73-capacity", "vLLM, 2 x H100 per pod (TP2); version not stated",
        {"precise": "prefix-cache-scorer mode cache_tracking (blockSize 64, hashSeed 42) "
                    "weight 3, kv-cache-scorer 2, queue-scorer 2, max-score-picker",
         "estimated": "prefix-cache-scorer (hashBlockSize 64, maxPrefixBlocksToMatch 256, "
                      "lruCapacityPerServer 31250) 1, kv-cache-scorer 1, queue-scorer 1",
         "load": "queue-scorer 1, kv-cache-scorer 1, max-score-picker (1 endpoint)",
         "random": "random-picker"},
        LLMD_73, "Poisson ladder; stages wait for the previous one to drain (inference-perf); "
        "the README's per-QPS tables have one 15 QPS row though the warm-up and stage 3 both "
        "run at 15 QPS"),
    FleetSetup(
        "llm-d 37-capacity", 4, "llama-3.1-70b", "h100", 4, "bf16", "vllm", 461_376,
        "llmd-37-capacity", "vLLM, 4 x H100 per pod (TP4); version not stated",
        {"precise": "prefix-cache-scorer mode cache_tracking (blockSize 64, hashSeed 42) "
                    "weight 2, kv-cache-scorer 1, queue-scorer 1",
         "default": "prefix-cache-scorer 2, kv-cache-scorer 1, queue-scorer 1",
         "load": "queue-scorer 1, kv-cache-scorer 1",
         "random": "random-picker"},
        LLMD_37, "constant ladder (inference-perf load.type constant); 461,376 is the "
        "'effective, min TP rank' KV capacity of the profile's comment"),
    FleetSetup(
        "SGLang v0.4 router", 8, "llama-3.1-8b", "a100-80gb", 1, "bf16", "sglang", None,
        "sglang-v04-router", "python -m sglang_router.launch_server --model-path "
        "meta-llama/Meta-Llama-3.1-8B-Instruct --dp-size 8 (baseline: sglang.launch_server "
        "--dp-size 8, round robin)",
        {"cache-aware (SGLang v0.4)": "sglang_router, its defaults at v0.4",
         "round-robin (SGLang v0.3)": "--dp-size 8 without the router"},
        SGLANG_V04, "bench_serving with no rate given: request rate inf, 1,024 requests; the "
        "blog does not say which throughput (input + output or output) it prints"),
    FleetSetup(
        "Dynamo KV router A/B", 8, "qwen3-32b", "h100", 1, "fp8", "vllm", None,
        "Mooncake FAST'25 toolagent trace, timestamps / 0.80 (not bundled: see "
        "workloads/data/README.md)",
        "python3 -m dynamo.vllm --model Qwen/Qwen3-32B --quantization fp8 --kv-cache-dtype fp8 "
        "--max-model-len 131072 (YaRN x4) --gpu-memory-utilization 0.90 --block-size 64 "
        "--async-scheduling; aiperf 0.10.0 --fixed-schedule --streaming --workers-max 200 "
        "--request-timeout-seconds 1000",
        {"router ON": "DYN_ROUTER_MODE=kv with workers publishing KV events",
         "router OFF": "round robin"},
        DYNAMO_AB, "23,608 requests over about 59 min (about 6.7 req/s, 5.3 after the 0.80 "
        "slow-down); hit rates are not published"),
)}

# Per-QPS tables as printed: (QPS, output tok/s, requests/s, TTFT p90 s, TTFT mean s,
# ITL mean s) per router
PER_QPS: dict[str, dict[str, tuple[tuple[float, ...], ...]]] = {
    "llm-d 73-capacity": {
        "precise": (
            (3.0, 1219.1, 2.62, 0.498, 0.291, 0.011), (10.0, 3902.1, 9.529, 0.6, 0.335, 0.013),
            (15.0, 5761.1, 15.544, 0.4, 0.249, 0.015), (20.0, 9184.5, 20.159, 0.6, 0.363, 0.021),
            (22.0, 9382.0, 22.003, 0.5, 0.3, 0.02), (25.0, 9242.2, 24.268, 0.583, 0.303, 0.021),
            (30.0, 9221.8, 30.992, 0.509, 0.296, 0.021),
            (35.0, 9780.6, 32.861, 0.5, 0.275, 0.021),
            (40.0, 10270.8, 40.431, 0.488, 0.269, 0.027),
            (43.0, 10054.8, 40.521, 0.5, 0.281, 0.028),
            (46.0, 10128.7, 44.63, 0.589, 0.293, 0.028),
            (49.0, 10296.5, 48.942, 0.6, 0.311, 0.029),
            (52.0, 10284.6, 52.371, 0.507, 0.288, 0.029),
            (55.0, 10140.9, 54.41, 0.6, 0.308, 0.029),
            (57.0, 10313.9, 57.655, 0.6, 0.319, 0.029),
            (60.0, 10496.9, 59.242, 0.5, 0.283, 0.029)),
        "estimated": (
            (3.0, 1310.9, 3.093, 0.497, 0.3, 0.011), (10.0, 3842.4, 9.386, 0.499, 0.271, 0.013),
            (15.0, 5152.9, 13.642, 0.4, 0.232, 0.015), (20.0, 8082.6, 19.593, 0.6, 0.329, 0.021),
            (22.0, 8415.7, 23.832, 0.7, 0.407, 0.022), (25.0, 8445.1, 24.51, 0.609, 0.37, 0.022),
            (30.0, 8435.9, 30.242, 0.708, 0.373, 0.023),
            (35.0, 7443.5, 35.05, 2.459, 2.78, 0.026),
            (40.0, 8045.9, 40.212, 43.018, 13.16, 0.027),
            (43.0, 7969.6, 43.12, 43.515, 16.941, 0.026),
            (46.0, 7695.2, 45.986, 44.93, 18.081, 0.026),
            (49.0, 7455.9, 48.461, 46.335, 19.111, 0.026),
            (52.0, 7452.3, 52.162, 47.284, 21.94, 0.026),
            (55.0, 7100.7, 55.86, 50.108, 22.327, 0.026),
            (57.0, 7013.8, 56.362, 49.93, 23.423, 0.026),
            (60.0, 7247.9, 60.508, 50.226, 24.281, 0.026)),
        "random": (
            (3.0, 1314.0, 2.752, 0.82, 0.622, 0.012), (10.0, 3568.5, 9.564, 1.398, 0.826, 0.016),
            (15.0, 3791.1, 16.484, 2.299, 1.278, 0.02),
            (20.0, 4933.1, 18.838, 70.273, 25.073, 0.024),
            (22.0, 4765.4, 21.986, 78.42, 28.185, 0.024),
            (25.0, 4781.3, 23.4, 82.943, 30.689, 0.024),
            (30.0, 4636.3, 30.368, 86.182, 32.212, 0.024),
            (35.0, 4332.6, 36.403, 91.519, 34.043, 0.024),
            (40.0, 4773.8, 41.192, 101.272, 54.196, 0.025),
            (43.0, 4844.6, 42.775, 101.142, 53.247, 0.025),
            (46.0, 4969.5, 47.578, 101.265, 53.572, 0.025),
            (49.0, 4783.2, 48.305, 103.514, 56.13, 0.025),
            (52.0, 4845.1, 51.544, 105.004, 56.035, 0.025),
            (55.0, 4921.7, 53.552, 104.321, 54.844, 0.025),
            (57.0, 4764.2, 55.068, 106.816, 56.803, 0.025),
            (60.0, 4835.2, 56.912, 105.988, 57.426, 0.025)),
        "load": (
            (3.0, 1274.8, 2.997, 1.609, 0.944, 0.012), (10.0, 3607.0, 10.469, 4.124, 2.241, 0.016),
            (15.0, 3348.4, 15.152, 7.002, 4.013, 0.02),
            (20.0, 4902.5, 22.157, 77.707, 29.229, 0.024),
            (22.0, 4785.5, 21.469, 72.972, 28.71, 0.024),
            (25.0, 4872.8, 25.597, 85.979, 32.534, 0.024),
            (30.0, 4888.7, 29.711, 83.806, 32.831, 0.024),
            (35.0, 4660.7, 35.167, 88.086, 33.874, 0.024),
            (40.0, 4946.4, 39.019, 100.911, 53.545, 0.025),
            (43.0, 4973.3, 40.143, 101.524, 53.802, 0.025),
            (46.0, 4723.6, 46.688, 105.884, 56.746, 0.025),
            (49.0, 4004.8, 49.162, 105.015, 55.208, 0.025),
            (52.0, 3991.0, 54.05, 108.572, 58.807, 0.025),
            (55.0, 4671.9, 54.779, 110.681, 58.467, 0.025),
            (57.0, 3866.5, 55.837, 113.278, 61.75, 0.025),
            (60.0, 4745.1, 59.971, 110.184, 58.497, 0.025)),
    },
    "llm-d 37-capacity": {
        "precise": (
            (3.0, 2579.8, 3.003, 0.201, 0.144, 0.013), (4.0, 3366.8, 4.007, 0.277, 0.182, 0.014),
            (5.0, 3940.5, 5.017, 0.281, 0.188, 0.015), (6.0, 4665.9, 6.0, 0.281, 0.195, 0.016),
            (8.0, 5675.9, 8.008, 0.28, 0.199, 0.018), (10.0, 6456.9, 10.0, 0.282, 0.202, 0.02),
            (12.0, 7062.0, 12.036, 0.282, 0.202, 0.021),
            (15.0, 7807.3, 14.994, 0.288, 0.21, 0.024),
            (20.0, 9295.2, 20.003, 0.29, 0.201, 0.029)),
        "default": (
            (3.0, 2595.6, 3.004, 0.399, 0.207, 0.014), (4.0, 3386.2, 4.0, 0.7, 0.236, 0.015),
            (5.0, 3912.1, 5.021, 0.9, 0.307, 0.017), (6.0, 4604.2, 6.0, 0.794, 0.254, 0.018),
            (8.0, 5529.6, 8.017, 1.11, 0.399, 0.022), (10.0, 6021.8, 10.013, 1.309, 0.466, 0.025),
            (12.0, 6667.0, 12.018, 1.199, 0.42, 0.026),
            (15.0, 6401.2, 15.001, 1.9, 1.294, 0.029),
            (20.0, 6748.0, 20.04, 43.568, 7.609, 0.033)),
        "random": (
            (3.0, 2518.0, 3.003, 1.502, 0.852, 0.021), (4.0, 2734.2, 4.002, 23.48, 9.475, 0.027),
            (5.0, 2647.1, 4.997, 41.795, 15.998, 0.027),
            (6.0, 2946.7, 6.031, 62.49, 30.389, 0.029),
            (8.0, 2968.5, 8.008, 78.656, 39.117, 0.029),
            (10.0, 3119.5, 10.014, 83.002, 41.48, 0.029),
            (12.0, 3022.5, 12.02, 98.661, 53.513, 0.029),
            (15.0, 3003.1, 15.028, 139.286, 61.425, 0.028),
            (20.0, 3099.1, 20.002, 176.975, 94.952, 0.029)),
        "load": (
            (3.0, 2567.1, 3.01, 2.4, 1.443, 0.022), (4.0, 2974.3, 4.004, 16.101, 6.367, 0.028),
            (5.0, 3119.7, 5.004, 28.581, 10.158, 0.027),
            (6.0, 3007.5, 6.005, 59.389, 29.175, 0.029),
            (8.0, 3089.7, 8.009, 73.762, 39.076, 0.028),
            (10.0, 3050.4, 10.057, 86.063, 44.587, 0.028),
            (12.0, 3044.0, 12.018, 94.109, 51.247, 0.029),
            (15.0, 3106.0, 15.027, 114.672, 63.407, 0.029),
            (20.0, 3205.6, 20.08, 173.54, 92.947, 0.029)),
    },
}
PER_QPS_COLUMNS = ("qps", "output_tok_s", "requests_s", "ttft_p90_s", "ttft_mean_s",
                   "itl_mean_s")

# "Summary across QPS" as printed: output tok/s, requests/s, TTFT p90 s, TTFT mean s, ITL mean s
SUMMARY: dict[str, dict[str, tuple[float, float, float, float, float]]] = {
    "llm-d 73-capacity": {
        "precise": (8730.0, 35.562, 0.542, 0.298, 0.026),
        "estimated": (6944.4, 36.068, 31.083, 13.316, 0.024),
        "random": (4428.7, 35.671, 92.551, 45.281, 0.025),
        "load": (4266.4, 36.298, 94.865, 46.987, 0.024),
    },
    "llm-d 37-capacity": {
        "precise": (5650.0, 6.914, 0.275, 0.193, 0.020),
        "default": (5096.2, 6.915, 7.536, 1.549, 0.023),
        "load": (3018.3, 6.920, 78.303, 41.058, 0.028),
        "random": (2895.4, 6.914, 84.623, 42.011, 0.028),
    },
}
SUMMARY_COLUMNS = ("output_tok_s", "requests_s", "ttft_p90_s", "ttft_mean_s", "itl_mean_s")

OTHER_FIGURES: tuple[Figure, ...] = (
    Figure("SGLang v0.4 router", "cache-aware (SGLang v0.4)", "throughput (tok/s)", 158_596,
           source=SGLANG_V04),
    Figure("SGLang v0.4 router", "round-robin (SGLang v0.3)", "throughput (tok/s)", 82_665,
           source=SGLANG_V04),
    Figure("SGLang v0.4 router", "cache-aware (SGLang v0.4)", "cache hit rate (%)", 75,
           source=SGLANG_V04),
    Figure("SGLang v0.4 router", "round-robin (SGLang v0.3)", "cache hit rate (%)", 20,
           source=SGLANG_V04),
    Figure("Dynamo KV router A/B", "router OFF", "TTFT avg (ms)", 63_652, source=DYNAMO_AB),
    Figure("Dynamo KV router A/B", "router ON", "TTFT avg (ms)", 2_586, source=DYNAMO_AB),
    Figure("Dynamo KV router A/B", "router OFF", "TTFT p99 (ms)", 332_974, source=DYNAMO_AB),
    Figure("Dynamo KV router A/B", "router ON", "TTFT p99 (ms)", 17_871, source=DYNAMO_AB),
    Figure("Dynamo KV router A/B", "router OFF", "E2E latency avg (ms)", 92_856,
           source=DYNAMO_AB),
    Figure("Dynamo KV router A/B", "router ON", "E2E latency avg (ms)", 19_112,
           source=DYNAMO_AB),
    Figure("Dynamo KV router A/B", "router OFF", "E2E latency p99 (ms)", 411_252,
           source=DYNAMO_AB),
    Figure("Dynamo KV router A/B", "router ON", "E2E latency p99 (ms)", 88_274,
           source=DYNAMO_AB),
)

KNEE_TTFT_P90_S = 10.0  # our rule: a router's knee is its first stage with TTFT p90 above this


def knee_qps(table: tuple[tuple[float, ...], ...], threshold_s: float = KNEE_TTFT_P90_S
             ) -> float | None:
    """The lowest QPS of a per-QPS table whose TTFT p90 exceeds `threshold_s` (None: the
    router never crossed it). 10 s separates the tables cleanly: below the knee every router
    stays under 7.1 s, above it every one is past 16 s."""
    for row in table:
        if row[3] > threshold_s:
            return row[0]
    return None


def figures() -> list[Figure]:
    """Every published figure: the llm-d summaries, their per-QPS tables, the knee of each
    router (derived), then the SGLang and Dynamo figures."""
    out: list[Figure] = []
    for setup, routers in SUMMARY.items():
        src = SETUPS[setup].source
        for router, values in routers.items():
            out += [Figure(setup, router, m, v, source=src)
                    for m, v in zip(SUMMARY_COLUMNS, values, strict=True)]
    for setup, routers in PER_QPS.items():
        src = SETUPS[setup].source
        for router, table in routers.items():
            for row in table:
                out += [Figure(setup, router, m, v, qps=row[0], source=src)
                        for m, v in zip(PER_QPS_COLUMNS[1:], row[1:], strict=True)]
            knee = knee_qps(table)
            out.append(Figure(setup, router, "knee QPS", math.nan if knee is None else knee,
                              source=src, derived=f"first stage with TTFT p90 > "
                              f"{KNEE_TTFT_P90_S:g} s" + ("; never" if knee is None else "")))
    return out + list(OTHER_FIGURES)


def awaiting_rows(skipped: Mapping[str, str] | None = None) -> list[dict]:
    """The headline figures of each setup, one line each, for the report's table of fleet
    figures not simulated (the per-QPS tables stay in this module). `skipped`: setup -> why
    it is not simulated, listing only those setups (None: every setup)."""
    rows = []
    for f in figures():
        if f.qps is not None or f.metric in ("requests_s", "ttft_mean_s", "itl_mean_s"):
            continue
        if skipped is not None and f.setup not in skipped:
            continue
        assert f.source is not None
        note = f.derived if skipped is None else "; ".join(
            n for n in (skipped[f.setup], f.derived) if n)
        rows.append({"setup": f.setup, "router": f.router, "metric": f.metric,
                     "published": f.value, "source": f"{f.source.where}, {f.source.version}",
                     "note": note})
    return rows


@dataclass(frozen=True)
class PoolCheck:
    """kvsim's planner against a published per-replica KV pool."""

    setup: str
    published: int
    kvsim: int
    kv_gib_per_gpu_published: float
    kv_gib_per_gpu_kvsim: float
    notes: list[str] = field(default_factory=list)


def pool_check(name: str) -> PoolCheck:
    """Plan the setup's replica under its engine's rule and compare the KV tokens."""
    s = SETUPS[name]
    assert s.kv_tokens_per_replica is not None
    r = plan(MemorySpec(model=s.model, gpu=s.gpu, tp=s.tp, kv_dtype=s.kv_dtype,
                        budget=s.engine), page_size=16)
    per_token_gpu = r.kv_bytes_per_token / s.tp
    return PoolCheck(name, s.kv_tokens_per_replica, r.kv_tokens,
                     s.kv_tokens_per_replica * per_token_gpu / 2**30,
                     r.kv_tokens * per_token_gpu / 2**30)


def pool_rows() -> list[dict]:
    """The per-pod KV tokens of the llm-d reports against `kvsim plan --budget vllm` (exact:
    vLLM prints its block count, so a pool size is an integer to match)."""
    rows = []
    for name in ("llm-d 73-capacity", "llm-d 37-capacity"):
        c = pool_check(name)
        s = SETUPS[name]
        gap = c.kv_gib_per_gpu_kvsim - c.kv_gib_per_gpu_published
        note = (f"{s.model} on {s.tp} x {s.gpu}, vllm rule at gpu_memory_utilization 0.9 with "
                f"kvsim's default activation peak 2 GiB + non-torch 0.5 GiB per GPU: "
                f"{gap:+.2f} GiB of KV per GPU against the report, i.e. the run kept that much "
                "more for activations, CUDA graphs and NCCL than kvsim's defaults (the report "
                "names no vLLM version or utilization)")
        rows.append(make_row(SECTION, f"{name} KV tokens per pod", c.published, c.kvsim,
                             "exact", c.kvsim == c.published, note=note))
    return rows


__all__ = ["KNEE_TTFT_P90_S", "OTHER_FIGURES", "PER_QPS", "PER_QPS_COLUMNS", "SETUPS",
           "SUMMARY", "SUMMARY_COLUMNS", "Figure", "FleetSetup", "PoolCheck", "Source",
           "awaiting_rows", "figures", "knee_qps", "pool_check", "pool_rows"]
