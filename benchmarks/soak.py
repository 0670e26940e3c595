"""Soak run: a long synthetic stream through `paged` + radix cache, checking that nothing
breaks and nothing grows.

200,000 short requests (by default) with prefix sharing (k-shot groups: a shared prefix + a
private question) mixed with unique prompts, Poisson arrivals, the roofline latency model.
The policy's invariants are checked every `--check-every` engine iterations (or decode
stretches); per-request rows are streamed to a Parquet file in chunks as the run goes, so the
simulator holds no per-request results in memory; RSS is sampled once a second by a background
thread and at every chunk of rows written.

Prints (and writes as JSON next to the RSS series): requests completed / rejected, invariant
checks and violations, RSS after warm-up and at the end, RSS growth per 100,000 requests after
warm-up (slope of a least-squares fit of RSS against requests finished), wall time.

    python benchmarks/soak.py [--num-requests 200000] [--check-every 1000]
        [--rss-csv docs/reliability_rss.csv] [--rss-png docs/reliability_rss.png]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvcore.contract.validation import InvariantError
from kvcore.sglang.policy import SGLangPolicy
from simulator.config import SimConfig
from simulator.request_table import COLUMN_KINDS, REQUEST_COLUMNS
from simulator.run import simulate
from workloads.request import (
    PROMPT_TAG,
    SHARED_TAG,
    PromptSpec,
    Request,
    Workload,
    namespace_of,
)

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20

# the recorder's columns (simulator/request_table.py), as requests.parquet types them
ROW_SCHEMA = pa.schema([(c, {"i": pa.int64(), "f": pa.float64(), "s": pa.string()}[k])
                        for c, k in COLUMN_KINDS.items()])
assert tuple(ROW_SCHEMA.names) == REQUEST_COLUMNS


def rss_bytes() -> int:
    """Resident set size now (not the peak): the second field of /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_BYTES


def soak_workload(n: int, rate: float, seed: int, groups: int, shared_frac: float) -> Workload:
    """`n` short requests: a `shared_frac` share are k-shot (one of `groups` shared prefixes of
    96-256 tokens + a private 8-48 token question), the rest unique 16-160 token prompts;
    outputs 1-48 tokens, max_new_tokens a little above; Poisson arrivals at `rate`."""
    rng = np.random.default_rng([seed, 0x50A])
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    shared = rng.random(n) < shared_frac
    group = rng.integers(0, groups, n)
    prefix_len = rng.integers(96, 257, groups)
    question = rng.integers(8, 49, n)
    unique = rng.integers(16, 161, n)
    out = rng.integers(1, 49, n)
    slack = rng.integers(0, 17, n)
    prefixes = [("unique", namespace_of(seed, g, SHARED_TAG), int(prefix_len[g]), 0)
                for g in range(groups)]
    reqs = []
    for rid in range(n):
        own = namespace_of(seed, rid, PROMPT_TAG)
        if shared[rid]:
            segs = (prefixes[group[rid]], ("unique", own, int(question[rid]), 0))
        else:
            segs = (("unique", own, int(unique[rid]), 0),)
        o = int(out[rid])
        reqs.append(Request(rid, float(arrivals[rid]), PromptSpec(segs), o, o + int(slack[rid]),
                            seed=seed))
    return Workload("soak", reqs, seed=seed)


class RowSink:
    """Appends each chunk of per-request rows to a Parquet file (one row group per chunk) and
    samples RSS against the number of requests finished so far."""

    def __init__(self, path: Path, t0: float) -> None:
        self.path = path
        self.writer = pq.ParquetWriter(path, ROW_SCHEMA)
        self.rows = 0
        self.t0 = t0
        self.samples: list[tuple[float, int, float, str]] = []
        self.lock = threading.Lock()

    def __call__(self, chunk: dict[str, np.ndarray]) -> None:
        """One chunk of finished requests, one array per column (NaN = missing)."""
        arrays = []
        for f in ROW_SCHEMA:
            v = chunk[f.name]
            if pa.types.is_integer(f.type):
                missing = np.isnan(v)
                arrays.append(pa.array(np.where(missing, 0, v).astype(np.int64),
                                       mask=missing if missing.any() else None))
            else:
                arrays.append(pa.array(v, type=f.type, from_pandas=True))
        self.writer.write_table(pa.Table.from_arrays(arrays, schema=ROW_SCHEMA))
        self.rows += len(arrays[0])
        self.sample("sink")

    def sample(self, source: str) -> None:
        with self.lock:
            self.samples.append((time.perf_counter() - self.t0, self.rows,
                                 rss_bytes() / MIB, source))

    def close(self) -> None:
        self.writer.close()


class Sampler(threading.Thread):
    """Samples RSS every `interval` seconds until stopped."""

    def __init__(self, sink: RowSink, interval: float) -> None:
        super().__init__(daemon=True)
        self.sink = sink
        self.interval = interval
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.sink.sample("timer")


class CountingChecks:
    """Counts the policy's invariant checks (and violations) for the report."""

    def __init__(self) -> None:
        self.checks = 0
        self.violations: list[str] = []
        self.original = SGLangPolicy.check_invariants

    def install(self) -> None:
        original = self.original
        counter = self

        def check(policy) -> None:
            counter.checks += 1
            try:
                original(policy)
            except InvariantError as e:
                counter.violations.append(str(e))
                raise

        SGLangPolicy.check_invariants = check  # type: ignore[method-assign]

    def uninstall(self) -> None:
        SGLangPolicy.check_invariants = self.original  # type: ignore[method-assign]


def growth_per_100k(samples: list[tuple[float, int, float, str]], warmup: int) -> float:
    """MiB per 100,000 requests: least-squares slope of RSS against requests finished, over
    the sink samples after `warmup` requests."""
    pts = np.array([(n, rss) for _, n, rss, src in samples if src == "sink" and n >= warmup])
    if len(pts) < 2 or np.ptp(pts[:, 0]) == 0:
        return float("nan")
    slope = np.polyfit(pts[:, 0], pts[:, 1], 1)[0]
    return float(slope * 100_000)


def write_series(samples, csv_path: Path, png_path: Path | None, warmup: int) -> None:
    import pandas as pd

    df = pd.DataFrame(samples, columns=["wall_s", "requests_done", "rss_mib", "source"])
    df = df.sort_values("wall_s", kind="stable")
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = csv_path.with_suffix(".csv.tmp")
    df.to_csv(tmp, index=False, float_format="%.3f")
    os.replace(tmp, csv_path)
    if png_path is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    ax.plot(df.wall_s, df.rss_mib, lw=1.2, color="tab:blue", label="RSS (MiB)")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("RSS (MiB)")
    ax2 = ax.twinx()
    ax2.plot(df.wall_s, df.requests_done / 1000, lw=1.0, color="tab:gray", ls="--",
             label="requests finished (k)")
    ax2.set_ylabel("requests finished (thousands)")
    hit = df[df.requests_done >= warmup]
    if len(hit):
        ax.axvline(hit.wall_s.iloc[0], color="tab:red", lw=0.8, ls=":", label="end of warm-up")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower right", fontsize=8)
    ax.set_title("Soak run: RSS over time (paged + radix)")
    fig.tight_layout()
    tmp_png = png_path.with_suffix(".png.tmp")
    fig.savefig(tmp_png, format="png")
    plt.close(fig)
    os.replace(tmp_png, png_path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=200_000)
    ap.add_argument("--rate", type=float, default=100.0, help="arrivals per second")
    ap.add_argument("--groups", type=int, default=16, help="distinct shared prefixes")
    ap.add_argument("--shared-frac", type=float, default=0.6)
    ap.add_argument("--kv-tokens", type=int, default=6144)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--check-every", type=int, default=1000)
    ap.add_argument("--warmup-requests", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows-out", type=Path, default=None,
                    help="Parquet file for per-request rows (default: a temporary file)")
    ap.add_argument("--rss-csv", type=Path, default=Path("docs/reliability_rss.csv"))
    ap.add_argument("--rss-png", type=Path, default=Path("docs/reliability_rss.png"))
    ap.add_argument("--no-png", action="store_true")
    args = ap.parse_args()

    rss_before_workload = rss_bytes() / MIB
    t_build = time.perf_counter()
    wl = soak_workload(args.num_requests, args.rate, args.seed, args.groups, args.shared_frac)
    build_s = time.perf_counter() - t_build
    cfg = SimConfig.of(policy="paged", page_size=args.page_size, kv_tokens=args.kv_tokens,
                    model="llama-3.1-8b", gpu="h100", latency="roofline",
                    max_context_len=2048, check_invariants=True, check_every=args.check_every,
                    seed=args.seed)

    tmpdir = None
    if args.rows_out is None:
        tmpdir = tempfile.TemporaryDirectory(prefix="kvsim-soak-")
        rows_out = Path(tmpdir.name) / "requests.parquet"
    else:
        rows_out = args.rows_out
        rows_out.parent.mkdir(parents=True, exist_ok=True)
    partial = rows_out.with_suffix(".parquet.partial")

    t0 = time.perf_counter()
    sink = RowSink(partial, t0)
    sink.sample("start")
    sampler = Sampler(sink, 1.0)
    checks = CountingChecks()
    checks.install()
    sampler.start()
    try:
        res = simulate(wl, cfg, request_sink=sink)
    finally:
        sampler.stop.set()
        sampler.join()
        checks.uninstall()
        sink.close()
    wall = time.perf_counter() - t0
    sink.sample("end")
    os.replace(partial, rows_out)

    # conservation, read back from disk: every request exactly once, completed or rejected
    # with a reason
    written = pq.read_table(rows_out, columns=["request_id", "status", "reject_reason"])
    ids = written.column("request_id").to_numpy()
    status = written.column("status").to_pylist()
    reasons = written.column("reject_reason").to_pylist()
    conserved = (len(ids) == args.num_requests and len(np.unique(ids)) == len(ids)
                 and all(s in ("completed", "rejected") for s in status)
                 and all(r for s, r in zip(status, reasons, strict=True) if s == "rejected"))
    s = res.summary
    timer = [x for x in sink.samples if x[3] == "sink" and x[1] >= args.warmup_requests]
    rss_warm = timer[0][2] if timer else float("nan")
    rss_end = sink.samples[-1][2]
    out = {
        "requests": args.num_requests,
        "completed": s["requests_completed"],
        "rejected": s["requests_rejected"],
        "rows_on_disk": len(ids),
        "conserved": bool(conserved),
        "iterations": s["iterations"],
        "timeline_rows": len(res.timeline),
        "invariant_checks": checks.checks,
        "violations": len(checks.violations),
        "rss_before_workload_mib": rss_before_workload,
        "rss_start_mib": sink.samples[0][2],
        "rss_after_warmup_mib": rss_warm,
        "rss_end_mib": rss_end,
        "rss_peak_mib": max(x[2] for x in sink.samples),
        "growth_mib_per_100k": growth_per_100k(sink.samples, args.warmup_requests),
        "warmup_requests": args.warmup_requests,
        "prefix_hit_rate": s["prefix_hit_rate"],
        "preemptions": s["preemptions"],
        "simulated_s": s["sim_end_s"],
        "workload_build_s": build_s,
        "wall_s": wall,
    }
    write_series(sink.samples, args.rss_csv, None if args.no_png else args.rss_png,
                 args.warmup_requests)
    summary_path = args.rss_csv.with_suffix(".json")
    tmp = summary_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    os.replace(tmp, summary_path)
    for k, v in out.items():
        print(f"{k:>22}: {v:.2f}" if isinstance(v, float) else f"{k:>22}: {v}")
    if tmpdir is not None:
        tmpdir.cleanup()
    if not conserved or checks.violations:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
