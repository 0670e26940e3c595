"""`kvsim plan` with a workload: the capacity search and the page-size study, as one result.

The static plan (experiments/answers/planning.py `static_plan`) is what `plan` prints for its
options alone. With `--trace` / `--workload` it also simulates the page sizes and recommends one;
with `--find-rate` it also searches the highest sustainable rate, and with
`--at-sustainable-rate` it runs the study at that rate. `make_plan` does all of that and
returns a `PlanAnswer`, which the command prints (as JSON, or as tables and lines): each part
carries its own lines, so nothing is threaded through helpers. The host-tier mode
(`--target-hit-rate`) is experiments/answers/host_sizing.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from experiments.answers.capacity import CapacityResult, Probe, check_steps
from experiments.options.grid import DEFAULT_PAGE_SIZES, page_sizes_for, parse_list
from experiments.options.run_options import RunOptions
from kvcore.model.planner import PlanResult

if TYPE_CHECKING:
    from experiments.answers.recommend import PageSizeRecommendation

MAX_CONTEXT = 1 << 24
MAX_SEEDS = 64


@dataclass(frozen=True)
class PlanRequest:
    """What `plan` was asked besides the run's options (its own flags)."""

    context_len: int | None = None
    tolerance: float = 0.02
    page_sizes: str | None = DEFAULT_PAGE_SIZES  # None: the default list
    seeds: tuple[int, ...] | None = None  # the seed axis (`--seeds`), else --seed
    jobs: int | None = None  # None: one process per core, one for a small study
    find_rate: bool = False
    at_sustainable_rate: bool = False
    steps: int = 4
    study: bool = False  # a workload was given: simulate the page sizes
    progress: bool = False
    target_hit_rate: float | None = None  # size the host tier instead (host_sizing.py)
    given: frozenset[str] = frozenset()  # the flags the user set (PLAN_FLAGS names)

    def check(self) -> None:
        """Every flag's domain, and that every flag given is read in this mode, before
        anything is simulated (one-line ValueError)."""
        from experiments.answers.recommend import check_tolerance
        from experiments.execution.executors import check_jobs

        check_jobs(self.jobs)
        check_steps(self.steps)
        if self.context_len is not None and not 1 <= self.context_len <= MAX_CONTEXT:
            raise ValueError(f"--context-len must be in [1, {MAX_CONTEXT:,}], got "
                             f"{self.context_len}")
        check_tolerance(self.tolerance)
        if self.study and self.seeds is not None and len(self.seeds) > MAX_SEEDS:
            raise ValueError(f"--seeds: at most {MAX_SEEDS} seeds, got {len(self.seeds)}")
        unread = self.unread_flags()
        if unread:
            name, why = unread[0]
            raise ValueError(f"{PLAN_FLAGS[name]}: {why}; drop it (it would be a silent "
                             "no-op)")


    def mode(self) -> str:
        """What this plan runs: `host` (--target-hit-rate), `study` (a workload's page-size
        study) or `static` (the options alone)."""
        if self.target_hit_rate is not None:
            return "host"
        return "study" if self.study else "static"

    def unread_flags(self) -> list[tuple[str, str]]:
        """The flags given that this mode never reads, each with why (PLAN_FLAGS order)."""
        mode, rate = self.mode(), self.find_rate or self.at_sustainable_rate
        reads: dict[str, tuple[bool, str]] = {
            "context_len": (mode != "host", "--target-hit-rate prints no page-table figure"),
            "tolerance": (mode == "study", _STUDY_ONLY),
            "page_sizes": (mode == "study", _STUDY_ONLY),
            "seeds": (mode == "study", _STUDY_ONLY),
            "jobs": (mode == "study", _STUDY_ONLY),
            "progress": (mode == "study" or not self.progress,
                         "only the page-size study shows a progress bar"),
            "at_sustainable_rate": (mode != "static", "it runs the page-size study or the "
                                    "host-tier search at the rate found: give --trace or "
                                    "--workload (--find-rate searches the rate alone)"),
            "steps": (rate, "the rate search's bisection steps: give --find-rate or "
                      "--at-sustainable-rate"),
        }
        return [(n, why) for n, (read, why) in reads.items() if n in self.given and not read]


#: plan's own flags (PlanRequest / cli.py parameter names) as the user types them
PLAN_FLAGS: dict[str, str] = {
    "context_len": "--context-len", "tolerance": "--tolerance", "page_sizes": "--page-sizes",
    "seeds": "--seeds", "jobs": "--jobs", "find_rate": "--find-rate",
    "at_sustainable_rate": "--at-sustainable-rate", "steps": "--steps",
    "target_hit_rate": "--target-hit-rate", "progress": "--progress",
}
_STUDY_ONLY = ("the page-size study's flag: plan runs no study without --trace / --workload, "
               "nor with --target-hit-rate")


@dataclass(frozen=True)
class CapacityAnswer:
    """`--find-rate`: the search's answer; `study_rate`: the rate the study ran at instead of
    the requested one (`--at-sustainable-rate`, when one was found)."""

    result: CapacityResult
    study_rate: dict[str, Any] | None
    lines: tuple[str, ...]


@dataclass(frozen=True)
class StudyAnswer:
    """The page-size study: the recommendation (never from an overloaded run), the mean rate
    it ran at, its summary rows and what to tell the user."""

    recommendation: PageSizeRecommendation
    rate_req_s: float
    rows: tuple[dict[str, Any], ...]
    lines: tuple[str, ...]


@dataclass(frozen=True)
class PlanAnswer:
    """Everything `plan` prints: the static plan, then the parts that ran."""

    plan: PlanResult
    size_notes: tuple[str, ...] = ()
    capacity: CapacityAnswer | None = None
    study: StudyAnswer | None = None

    def to_dict(self) -> dict[str, Any]:
        """`plan --json`: the static plan, `capacity` / `study_rate` when searched, and the
        recommendation with a study."""
        doc: dict[str, Any] = self.plan.to_dict()
        if self.capacity is not None:
            doc["capacity"] = self.capacity.result.to_dict()
            if self.capacity.study_rate is not None:
                doc["study_rate"] = self.capacity.study_rate
        if self.study is not None:
            rec = self.study.recommendation
            doc.update(recommended_page_size=rec.page_size, overloaded=rec.overloaded,
                       rate_req_s=self.study.rate_req_s, recommendation=rec.to_dict())
        return doc

    def lines(self) -> list[str]:
        """The lines under the tables, in the order the parts ran."""
        out = list(self.size_notes)
        if self.capacity is not None:
            out += self.capacity.lines
        if self.study is not None:
            out += self.study.lines
        return out


def make_plan(opts: RunOptions, req: PlanRequest, *,
              on_probe: Callable[[Probe], None] | None = None,
              announce: Callable[[str], None] | None = None) -> PlanAnswer:
    """The plan of `opts`: static, then (asked for) the capacity search, then (with a
    workload) the page-size study. `on_probe` sees each capacity probe as it finishes;
    `announce` hears that a search starts. Every user mistake is raised before the first
    simulation."""
    from experiments.answers.planning import page_size_grid, static_plan

    req.check()
    text, size_notes = page_sizes_for(opts, req.page_sizes)
    sizes = parse_list(text, int, "--page-sizes") or []
    page_size_grid(opts, sizes)  # a bad page size is an error even for the static plan
    result = static_plan(opts, req.context_len, with_workload=req.study)
    cap = None
    if req.find_rate or req.at_sustainable_rate:
        if announce is not None:
            announce("searching the highest sustainable rate ...")
        cap, opts = plan_capacity(opts, req.steps, req.at_sustainable_rate and req.study,
                                  on_probe)
    study = None
    if req.study:
        study = page_size_recommendation(opts, sizes, req)
    return PlanAnswer(result, tuple(size_notes) if req.study else (), cap, study)


def plan_capacity(opts: RunOptions, steps: int, use_it: bool,
                  on_probe: Callable[[Probe], None] | None = None,
                  what: str = "the page-size study") -> tuple[CapacityAnswer, RunOptions]:
    """`--find-rate` / `--at-sustainable-rate`: the capacity search, and the options `what`
    (the study, or the host-tier search) runs at: the sustainable rate when `use_it` and one
    was found."""
    from experiments.answers.capacity import find_sustainable_rate, scaled
    from reports.overload_view import capacity_lines

    opts.sim_config()
    cap = find_sustainable_rate(opts, steps=steps, on_probe=on_probe)
    lines = [capacity_lines(cap)[-1]]
    if not use_it:
        return CapacityAnswer(cap, None, tuple(lines)), opts
    if cap.flag_value is None:
        lines.append(f"no sustainable rate found: {what} runs at the requested rate")
        return CapacityAnswer(cap, None, tuple(lines)), opts
    start = cap.probes[0]
    lines.append(f"{what} ran at {cap.flag} {cap.flag_value:.4g} "
                 f"({cap.rate_req_s:.4g} req/s), the highest sustainable rate found, instead of "
                 f"{start.flag_value:.4g} ({start.rate_req_s:.4g} req/s)")
    rate = {"flag": cap.flag, "value": cap.flag_value, "rate_req_s": cap.rate_req_s}
    return CapacityAnswer(cap, rate, tuple(lines)), scaled(opts, cap.flag, cap.flag_value)


def page_size_recommendation(opts: RunOptions, sizes: list[int],
                             req: PlanRequest) -> StudyAnswer:
    """`--trace` / `--workload`: the page-size study, its figures and its recommendation (none
    from an overloaded run: the lines say so and at which rate it ran)."""
    from experiments.answers.planning import page_size_study
    from experiments.answers.recommend import (
        recommend_page_size,
        recommendation_notes,
        reuse_line,
    )
    from experiments.execution.executors import check_jobs
    from reports.plots import plot_dir

    out, df = page_size_study(opts, sizes, jobs=check_jobs(req.jobs), progress=req.progress,
                              seeds=req.seeds)
    rec = recommend_page_size(df, req.tolerance)
    figs = plot_dir(out, out / "figures")
    rates = df["rate_req_s"].astype(float)
    rate = float(rates.mean()) if len(rates) else math.nan
    lines: list[str] = []
    if rec.all_overloaded:
        w = opts.workload
        lines.append(f"not recommending: the study ran at {rate:.4g} req/s "
                     f"(--rate-scale {w.rate_scale:g}"
                     f"{'' if w.rate is None else f', --rate {w.rate:g}'}"
                     "), which this GPU cannot serve; rerun with --at-sustainable-rate")
    notes = recommendation_notes(rec)
    if rec.all_overloaded and len(notes) > 1:  # the same story per page size: tell it once
        notes = [notes[0], f"(and {len(notes) - 1} more page sizes, overloaded alike: "
                 "overload_reason in summary.csv)"]
    lines.extend(notes)
    line = reuse_line(rec)
    if line is not None:
        lines.append(line)
    lines.append(f"figures: {', '.join(str(p) for p in figs)}")
    return StudyAnswer(rec, rate, tuple(df.to_dict("records")), tuple(lines))


__all__ = ["CapacityAnswer", "PlanAnswer", "PlanRequest", "StudyAnswer", "make_plan",
           "page_size_recommendation", "plan_capacity"]
