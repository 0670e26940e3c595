"""`kvsim plan --target-hit-rate X`: the host KV tier a workload needs for a total prefix hit
rate, found by simulating it (the hit rate of a tiered cache depends on the arrival order, the
device pool and the eviction order, which no closed form captures).

The search: the device pool alone first (ratio 0); then the host tier doubles (1x, 2x, 4x the
device pool ...) until the target is met or the host holds every token the workload writes
(where the hit rate is the trace's ideal reuse); then a few bisection steps between the last
miss and the first hit. A target above the ideal reuse can never be met: it is refused before
anything runs.

With `--at-sustainable-rate` the search runs at the highest sustainable rate of the options
(experiments/answers/capacity.py, the device pool alone: a host tier only adds hits, so the tier
found there is enough at that rate); `--find-rate` reports that rate and searches at the requested
one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.options.run_options import RunOptions

if TYPE_CHECKING:
    from experiments.answers.capacity import Probe
    from experiments.answers.plan_modes import CapacityAnswer, PlanRequest

GiB = 2**30
BISECTIONS = 4
#: host memory a typical 8-GPU server gives each GPU: NVIDIA DGX H100 datasheet, 2 TB of system
#: memory for 8 H100s (the DGX H200 datasheet lists the same 2 TB), i.e. 250 GB = 232.8 GiB
TYPICAL_HOST_GIB_PER_GPU = 2e12 / 8 / GiB


@dataclass(frozen=True)
class SizingStep:
    """One simulation of the search: the host tier (x the device pool, GiB per rank) and the
    hit rates and TTFT it gave."""

    ratio: float
    host_gib: float
    prefix_hit_rate: float
    host_hit_rate: float
    ttft_p50_s: float
    overloaded: bool = False


@dataclass(frozen=True)
class HostSizing:
    """The answer: the smallest host tier tried that met the target (None: not met even
    unbounded), the trace's ideal reuse, and every step."""

    target: float
    ideal_reuse: float
    needed: SizingStep | None
    steps: tuple[SizingStep, ...]
    rows: tuple[dict[str, Any], ...] = field(default=(), repr=False)  # summary rows, in order
    capacity: CapacityAnswer | None = None  # --find-rate / --at-sustainable-rate: the search

    @property
    def overloaded(self) -> bool:
        """Some probe was overloaded: its hit rate measures a queue, not the tier."""
        return any(s.overloaded for s in self.steps)

    def notes(self) -> list[str]:
        """Why the answer may not hold: overloaded probes, a host tier above what a server
        gives one GPU (TYPICAL_HOST_GIB_PER_GPU)."""
        out = []
        n = sum(s.overloaded for s in self.steps)
        if n:
            out.append(f"{n} of {len(self.steps)} probes were overloaded (TTFT p50 up to "
                       f"{max(s.ttft_p50_s for s in self.steps if s.overloaded):.3g} s): their "
                       "hit rates measure the queue; rerun with --at-sustainable-rate to size "
                       "the tier at the highest rate this GPU serves")
        if self.needed is not None and self.needed.host_gib > TYPICAL_HOST_GIB_PER_GPU:
            out.append(f"the host tier needs {self.needed.host_gib:,.0f} GiB per rank, more "
                       f"than the {TYPICAL_HOST_GIB_PER_GPU:.0f} GiB of host memory a typical "
                       "8-GPU server gives each GPU (NVIDIA DGX H100: 2 TB for 8 GPUs); "
                       "consider a storage tier (--storage-size) or more ranks")
        return out

    def report_lines(self, out: str | None = None) -> list[str]:
        """`plan --target-hit-rate`'s answer in words: a table of the steps, the host memory
        needed, the notes, and where the rows went."""
        lines = list(self.capacity.lines) if self.capacity is not None else []
        lines += [f"ideal reuse of the workload: {self.ideal_reuse:.4f}; target {self.target:.4f}",
                 "host tier (x pool) | host GiB/rank | hit rate | host hit | TTFT p50 (s)"]
        lines += [f"{s.ratio:18.3g} | {s.host_gib:13.2f} | {s.prefix_hit_rate:8.4f} | "
                  f"{s.host_hit_rate:8.4f} | {s.ttft_p50_s:.3f}" for s in self.steps]
        if self.needed is None:
            lines.append("not reached even with an unbounded host tier")
        else:
            lines.append(f"host memory needed: {self.needed.host_gib:.2f} GiB per rank "
                         f"(--hicache-ratio {self.needed.ratio:g})")
        lines += [f"note: {line}" for line in self.notes()]
        if out:
            lines.append(f"results: {out}/summary.csv")
        return lines

    def to_dict(self) -> dict:
        doc = {"target_hit_rate": self.target, "ideal_reuse": self.ideal_reuse,
               "needed": None if self.needed is None else vars(self.needed),
               "steps": [vars(s) for s in self.steps], "overloaded": self.overloaded,
               "notes": self.notes()}
        if self.capacity is not None:  # as plan --json gives them with a study
            doc["capacity"] = self.capacity.result.to_dict()
            if self.capacity.study_rate is not None:
                doc["sizing_rate"] = self.capacity.study_rate
        return doc


def host_gib(opts: RunOptions, ratio: float) -> float:
    """GiB per rank of a host tier `ratio` x the device pool."""
    per_token = opts.memory.model_preset().kv_bytes_per_token(opts.memory.kv_dtype,
                                                              opts.memory.tp)
    return ratio * opts.resolved_kv_tokens() * per_token / GiB


def size_host_tier(opts: RunOptions, target: float) -> HostSizing:
    """Search the host tier that reaches `target` (see the module docstring)."""
    from experiments.answers.runner import simulate_options
    from workloads import build_workload
    from workloads.reuse import ideal_reuse

    if not 0 < target <= 1:
        raise ValueError(f"--target-hit-rate must be in (0, 1], got {target}")
    ps = opts.policy.page_size
    workload = build_workload(opts.workload_spec())
    ideal = ideal_reuse(workload, ps)
    if target > ideal:
        raise ValueError(f"--target-hit-rate {target} is above the workload's ideal reuse "
                         f"{ideal:.4f} at page size {ps}: no cache can reach it")
    written = sum(r.prompt_len + r.output_len for r in workload.nominal_requests())
    unbounded = max(written / opts.resolved_kv_tokens(), 1.0)
    steps: list[SizingStep] = []
    rows: list[dict[str, Any]] = []

    def run(ratio: float) -> SizingStep:
        cell = RunOptions.from_mapping({"hicache_ratio": ratio, "hicache_size": 0.0}, opts)
        row, _ = simulate_options(cell)
        step = SizingStep(ratio, host_gib(opts, ratio), float(row["prefix_hit_rate"]),
                          float(row["host_hit_rate"]), float(row["ttft_p50_s"]),
                          bool(row["overloaded"]))
        steps.append(step)
        rows.append(row)
        return step

    def done(needed: SizingStep | None) -> HostSizing:
        return HostSizing(target, ideal, needed, tuple(steps), tuple(rows))

    low = run(0.0)
    if low.prefix_hit_rate >= target:
        return done(low)
    ratio, high = 1.0, None
    while high is None:
        step = run(min(ratio, unbounded))
        if step.prefix_hit_rate >= target:
            high = step
        elif ratio >= unbounded:
            return done(None)
        else:
            low, ratio = step, ratio * 2
    for _ in range(BISECTIONS):
        mid = run((low.ratio + high.ratio) / 2)
        if mid.prefix_hit_rate >= target:
            high = mid
        else:
            low = mid
    return done(high)


def plan_host_tier(opts: RunOptions, req: PlanRequest,
                   on_probe: Callable[[Probe], None] | None = None,
                   announce: Callable[[str], None] | None = None) -> HostSizing:
    """`plan --target-hit-rate`: the search on the options' workload (one must be given; at
    the sustainable rate with --at-sustainable-rate), every probe's summary row written to
    --out/summary.csv as a sweep writes them."""
    from dataclasses import replace

    from experiments.answers.plan_modes import plan_capacity

    target = req.target_hit_rate
    assert target is not None
    if not req.study:
        raise ValueError(f"--target-hit-rate {target} needs --trace or --workload to simulate")
    req.check()
    if opts.tier.enabled:
        given = "--hicache-size" if opts.tier.hicache_size else "--hicache-ratio"
        raise ValueError(f"{given}: --target-hit-rate searches the host tier's size itself; "
                         "drop it")
    out = opts.output.out
    if out:
        from reports.io import check_writable

        check_writable(out)
    cap = None
    if req.find_rate or req.at_sustainable_rate:
        opts.sim_config()  # a user mistake before the first simulation
        if announce is not None:
            announce("searching the highest sustainable rate ...")
        cap, opts = plan_capacity(opts, req.steps, req.at_sustainable_rate, on_probe,
                                  what="the host-tier search")
    res = replace(size_host_tier(opts, target), capacity=cap)
    if out:
        import pandas as pd

        from reports.io import write_csv_atomic

        Path(out).mkdir(parents=True, exist_ok=True)
        write_csv_atomic(Path(out) / "summary.csv", pd.DataFrame(list(res.rows)))
    return res


__all__ = ["TYPICAL_HOST_GIB_PER_GPU", "HostSizing", "SizingStep", "host_gib", "plan_host_tier",
           "size_host_tier"]
