"""`kvsim calibrate`: fit a latency profile's constants to a user's own measurements.

Inputs, each turned into observations (one or more engine iterations and the seconds they
took):

* the JSON `vllm bench serve --save-result --save-detailed` writes, or the JSON lines
  `python -m sglang.bench_serving --output-file F --output-details` appends (the last run is
  read). Both carry per-request `input_lens`, `output_lens`, `ttfts` and `itls` (seconds; the
  gaps between consecutive output tokens) and the run's `max_concurrency`
  (vllm/benchmarks/serve.py; sglang python/sglang/bench_serving.py). A closed-loop run at
  concurrency C is read as C requests decoding together: each request's median gap is one
  decode step of C requests at that request's context then. TTFTs are prefill observations
  only at concurrency 1 (higher, they include queueing);
* a CSV of single steps: `batch_size`, `context_len` (each request's tokens; or
  `context_lens`, `;`-separated), `step_time_s` (or `step_time_ms`), optionally `page_size`
  and `prefill_tokens` (a prefill of that many new tokens in the same step).

The model is the roofline itself (simulator/latency.py): per iteration
`max(F / mfu, B / mbu) + pages x page_cost + requests x request_cost + iteration_cost`,
where F (compute seconds at peak), B (memory seconds at full bandwidth) and the pages term are
read off the real model by evaluating it at extreme constants, so nothing of its formula is
copied here. Each iteration is compute- or memory-bound; the fit alternates between
classifying iterations under the current constants and a linear least-squares fit of
(1/mfu, 1/mbu, page cost, request cost, iteration cost) on relative errors, until the
classes settle. A constant the fit cannot stand behind is **held**, and the result says which
and why (`Fit.held`: constant -> reason):

* the data cannot vary its term: page cost needs two kernel page sizes, request cost two
  batch sizes, compute efficiency an iteration that is compute-bound (a prefill); held at the
  base profile's value;
* its term is (nearly) a combination of the others' in this data, so any split between them
  fits equally well: batch-1 decode at one context length reads the same weights every step,
  so memory time and the per-iteration cost are both constants and only their sum is
  measured. A term whose column lies within `COLLINEAR` (relative) of the span of the other
  free columns, or whose estimate's standard error (least squares, from the residual
  spread) exceeds `MAX_REL_SE` of the estimate, is held at the base profile's value and the
  rest refitted; the efficiencies are held before the costs (`HOLD_FIRST`), so the base's
  efficiency is kept and a constant cost takes up the difference;
* the least-squares value left its domain (an efficiency above 1, a cost below 0): held at
  that bound, the rest refitted. A value at its bound is where the data pushed it, not a
  measurement.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from simulator.latency import RooflineLatency, make_latency_model
from simulator.latency_profiles import (
    LatencyProfile,
    load_profile,
    profile_for_rule,
    roofline_constants,
)

FITTED = ("mfu", "mbu", "page_head_overhead_s", "request_overhead_s", "iteration_overhead_s")
# which of several unidentifiable constants is held first: the efficiencies, at the base's
# value, then the per-page, per-request and per-iteration costs
HOLD_FIRST = ("mbu", "mfu", "page_head_overhead_s", "request_overhead_s",
              "iteration_overhead_s")
COLLINEAR = 1e-3  # a term this close (relative) to a combination of the others is not its own
MAX_REL_SE = 0.25  # an estimate with a standard error above this share of it is not measured
_LOW = dict(zip(FITTED, (1.0, 1.0, 0.0, 0.0, 0.0), strict=True))  # 1/mfu, 1/mbu >= 1; costs >= 0


@dataclass(frozen=True)
class Iteration:
    """One engine iteration: prefill chunks (new tokens, cached before) and decode contexts."""

    prefill: tuple[tuple[int, int], ...]
    decode: tuple[int, ...]
    page_size: int


@dataclass(frozen=True)
class Observation:
    iterations: tuple[Iteration, ...]
    seconds: float
    where: str


@dataclass(frozen=True)
class Fit:
    profile: LatencyProfile
    fitted: tuple[str, ...]
    held: dict[str, str]  # constant -> why it was not fitted (module docstring)
    rms_error: float  # relative, over observations
    max_error: float
    observations: int


# -- reading ---------------------------------------------------------------------------------
def read_measurements(path: str | Path, page_size: int = 16, chunk: int = 8192
                      ) -> tuple[list[Observation], str | None]:
    """Observations from a benchmark JSON / JSON lines file or a step CSV, and the engine the
    file names (None when it does not)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"calibrate: {p}: no such file")
    if p.suffix.lower() == ".csv":
        return _read_csv(p), None
    return _read_bench(p, page_size, chunk)


def _read_bench(p: Path, page_size: int, chunk: int) -> tuple[list[Observation], str | None]:
    text = p.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        try:
            doc = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not JSON or JSON lines ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: expected a benchmark result object")
    need = ("input_lens", "output_lens", "ttfts", "itls")
    for name in need:
        if not isinstance(doc.get(name), list):
            raise ValueError(f"{p}: field {name!r} missing or not a list (save per-request "
                             "details: vllm bench serve --save-result --save-detailed, "
                             "sglang.bench_serving --output-details)")
    n = len(doc["input_lens"])
    for name in need[1:]:
        if len(doc[name]) != n:
            raise ValueError(f"{p}: field {name!r} has {len(doc[name])} entries, input_lens "
                             f"{n}")
    conc = doc.get("max_concurrency")
    if isinstance(conc, bool) or not isinstance(conc, int) or conc < 1:
        raise ValueError(f"{p}: field 'max_concurrency' is {conc!r}: calibrate reads a "
                         "closed-loop run (--max-concurrency N)")
    obs: list[Observation] = []
    for i in range(n):
        where = f"{p}: request {i}"
        inp, ttft, gaps = doc["input_lens"][i], doc["ttfts"][i], doc["itls"][i]
        if isinstance(inp, bool) or not isinstance(inp, int) or inp < 1:
            raise ValueError(f"{where}: field 'input_lens' is {inp!r}, expected tokens >= 1")
        if not isinstance(gaps, list) or not all(_positive(g) for g in gaps):
            raise ValueError(f"{where}: field 'itls' must be a list of seconds > 0")
        if ttft is not None and not _positive(ttft):
            raise ValueError(f"{where}: field 'ttfts' is {ttft!r}, expected seconds > 0")
        if gaps:
            # the median gap; gap j (1-based) decodes at context inp + j; an even count's
            # median is the mean of the two middle gaps: two iterations, twice the time
            m = len(gaps)
            js = [(m + 1) // 2] if m % 2 else [m // 2, m // 2 + 1]
            its = tuple(Iteration((), (inp + j,) * conc, page_size) for j in js)
            obs.append(Observation(its, float(np.median(gaps)) * len(js), where))
        if conc == 1 and ttft:
            step = chunk if chunk > 0 else inp
            its = tuple(Iteration(((min(step, inp - b), b),), (), page_size)
                        for b in range(0, inp, step))
            obs.append(Observation(its, float(ttft), where + " ttft"))
    backend = doc.get("backend")
    engine = backend if backend in ("vllm", "sglang") else None
    return obs, engine


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _read_csv(p: Path) -> list[Observation]:
    with p.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{p}: no rows (columns: batch_size, context_len, step_time_s)")
    cols = set(rows[0])
    if "batch_size" not in cols or not cols & {"context_len", "context_lens"} or not cols & {
            "step_time_s", "step_time_ms"}:
        raise ValueError(f"{p}: needs columns batch_size, context_len (or context_lens) and "
                         f"step_time_s (or step_time_ms); got {', '.join(sorted(cols))}")
    obs = []
    for line, row in enumerate(rows, start=2):
        where = f"{p}:{line}"

        batch = _cell(row, where, "batch_size")
        if "context_lens" in row and (row["context_lens"] or "").strip():
            try:
                ctx = tuple(int(x) for x in row["context_lens"].split(";") if x.strip())
            except ValueError:
                raise ValueError(f"{where}: column 'context_lens' is {row['context_lens']!r},"
                                 " expected ;-separated token counts") from None
            if len(ctx) != batch or min(ctx, default=1) < 1:
                raise ValueError(f"{where}: column 'context_lens' lists {len(ctx)} positive "
                                 f"lengths, batch_size says {batch}")
        else:
            ctx = (_cell(row, where, "context_len"),) * batch
        secs = (_cell(row, where, "step_time_s", float) if "step_time_s" in row
                else _cell(row, where, "step_time_ms", float) / 1e3)
        ps = _cell(row, where, "page_size", int, 16)
        pre = _cell(row, where, "prefill_tokens", int, 0)
        if secs <= 0 or ps < 1 or (batch == 0 and pre == 0):
            raise ValueError(f"{where}: a step needs time > 0, page_size >= 1 and a batch or "
                             "a prefill")
        prefill = ((pre, 0),) if pre else ()
        obs.append(Observation((Iteration(prefill, ctx, ps),), secs, where))
    return obs


def _cell(row: dict, where: str, name: str, kind: type = int, default: Any = None) -> Any:
    """One CSV cell as a number >= 0 (`default` when empty and one is given)."""
    raw = (row.get(name) or "").strip()
    if not raw:
        if default is None:
            raise ValueError(f"{where}: column {name!r} is empty")
        return default
    try:
        v = kind(raw)
    except ValueError:
        raise ValueError(f"{where}: column {name!r} is {raw!r}, expected "
                         f"{kind.__name__}") from None
    if not v >= 0 or (kind is float and not math.isfinite(v)):
        raise ValueError(f"{where}: column {name!r} is {raw!r}, expected >= 0")
    return v


# -- fitting ---------------------------------------------------------------------------------
_TINY = 1e-9


def _probes(lm: RooflineLatency) -> tuple[RooflineLatency, ...]:
    """The model at extreme constants, from which an iteration's terms are read: compute
    seconds at peak, memory seconds at full bandwidth, the rest (tensor-parallel
    all-reduces), pages x heads x layers."""
    zero = {"request_overhead_s": 0.0, "iteration_overhead_s": 0.0,
            "page_head_overhead_s": 0.0}
    return (replace(lm, **zero, mfu=_TINY, mbu=1.0), replace(lm, **zero, mfu=1.0, mbu=_TINY),
            replace(lm, **zero, mfu=1.0, mbu=1.0),
            replace(lm, **{**zero, "page_head_overhead_s": 1.0}, mfu=1.0, mbu=1.0))


def _terms(probes: tuple[RooflineLatency, ...], it: Iteration) -> np.ndarray:
    """(F, B, pages x heads x layers, requests, fixed) of one iteration: F compute seconds at
    peak, B memory seconds at full bandwidth, fixed the all-reduce time (tp > 1)."""
    t = [m.iteration_time(it.prefill, it.decode, it.page_size) for m in probes]
    f, b = t[0] * _TINY, t[1] * _TINY
    fixed = t[2] - max(f, b)
    return np.array([f, b, round(t[3] - t[2]), len(it.prefill) + len(it.decode), fixed])


def fit_profile(obs: list[Observation], base: LatencyProfile, model: str, gpu: str,
                tp: int = 1, kv_dtype: str = "bf16", backend: str | None = None,
                name: str = "calibrated", rounds: int = 30) -> Fit:
    """The base profile's constants refitted to `obs` (see the module docstring)."""
    if len(obs) < 2:
        raise ValueError(f"calibrate: {len(obs)} observation(s); need at least 2")
    pages_seen = {it.page_size for o in obs for it in o.iterations}
    consts = roofline_constants(base, backend, min(pages_seen))
    lm = make_latency_model("roofline", model, gpu, tp, kv_dtype, **consts)
    assert isinstance(lm, RooflineLatency)
    probes = _probes(lm)
    per_it = [[_terms(probes, it) for it in o.iterations] for o in obs]
    y = np.array([o.seconds for o in obs])
    kernel_pages = {lm.kernel_page_size(ps) for ps in pages_seen}
    batches = {len(it.decode) + len(it.prefill) for o in obs for it in o.iterations}
    contexts = {it.decode for o in obs for it in o.iterations}
    if len(contexts) < 2:
        raise ValueError("calibrate: every observation decodes the same contexts; need at "
                         "least two different context lengths")
    held: dict[str, str] = {}
    if not any(it.prefill for o in obs for it in o.iterations):
        held["mfu"] = "no compute-bound iteration (a prefill) in the data"
    if len(kernel_pages) < 2:
        held["page_head_overhead_s"] = "one kernel page size in the data"
    if len(batches) < 2:
        held["request_overhead_s"] = "one batch size in the data"
    free = {k: k not in held for k in FITTED}
    x = {k: consts[k] for k in FITTED}
    at_bound: set[str] = set()
    for _ in FITTED:  # each pass holds one more unidentifiable constant, or stops
        # collinear terms first (no fit needed: any split between them fits alike), then
        # the fit, and the estimates its residuals cannot pin
        compute = _classes(per_it, x)
        weak = _collinear(per_it, compute, y, free)
        if not weak:
            x, compute, at_bound = _classify_and_solve(per_it, y, x, free, rounds)
            weak = _uncertain(per_it, compute, y, x,
                              {k: free[k] and k not in at_bound for k in FITTED})
        if not weak:
            break
        k = next(k for k in HOLD_FIRST if k in weak)
        held[k] = weak[k] + "; held at the base profile's value"
        free[k] = False
        x = {**x, k: consts[k]}
    for k in at_bound:
        held[k] = (f"at its bound {_bound_value(k):g} (the least-squares value "
                   f"{'exceeds 100 % efficiency' if k in ('mfu', 'mbu') else 'is negative'})"
                   ": where the data pushed it, not a measurement")
    profile = LatencyProfile(
        name=name, engine=base.engine, attention_backend=backend or base.attention_backend,
        mfu=round(float(x["mfu"]), 6), mbu=round(float(x["mbu"]), 6),
        request_overhead_s=float(f"{x['request_overhead_s']:.6g}"),
        iteration_overhead_s=float(f"{x['iteration_overhead_s']:.6g}"),
        page_head_overhead_s=float(f"{x['page_head_overhead_s']:.6g}"),
        prefill_attention_factor=base.prefill_attention_factor,
        source=f"kvsim calibrate ({len(obs)} observations, base {base.name})")
    fitted_lm = make_latency_model("roofline", model, gpu, tp, kv_dtype,
                                   **roofline_constants(profile, None, min(pages_seen)))
    pred = np.array([sum(fitted_lm.iteration_time(it.prefill, it.decode, it.page_size)
                         for it in o.iterations) for o in obs])
    rel = pred / y - 1.0
    return Fit(profile, tuple(k for k in FITTED if k not in held),
               {k: held[k] for k in FITTED if k in held}, float(np.sqrt(np.mean(rel ** 2))),
               float(np.max(np.abs(rel))), len(obs))


def _bound_value(k: str) -> float:
    return 1.0 if k in ("mfu", "mbu") else 0.0


def _classes(per_it, x: dict[str, float]) -> list[list[bool]]:
    """Each iteration compute-bound (True) or memory-bound under the constants `x`."""
    return [[tm[0] / x["mfu"] > tm[1] / x["mbu"] for tm in its] for its in per_it]


def _classify_and_solve(per_it, y, x: dict[str, float], free: dict[str, bool], rounds: int
                        ) -> tuple[dict[str, float], list[list[bool]], set[str]]:
    """Alternate between classifying iterations (compute- or memory-bound under the current
    constants) and the least-squares step until the classes settle; the constants, the
    classes and the constants the last step held at a bound."""
    compute = _classes(per_it, x)
    at_bound: set[str] = set()
    for _ in range(rounds):
        x, at_bound = _solve(per_it, compute, y, x, free)
        again = _classes(per_it, x)
        if again == compute:
            break
        compute = again
    return x, compute, at_bound


def _design(per_it, compute) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares columns (1/mfu, 1/mbu, page, request, iteration) per observation,
    and the fixed seconds (tensor-parallel all-reduces) under the classification."""
    rows = []
    for its, cls in zip(per_it, compute, strict=True):
        f = sum(tm[0] for tm, c in zip(its, cls, strict=True) if c)
        b = sum(tm[1] for tm, c in zip(its, cls, strict=True) if not c)
        rows.append([f, b, sum(tm[2] for tm in its), sum(tm[3] for tm in its), len(its)])
    fixed = np.array([sum(tm[4] for tm in its) for its in per_it])
    return np.array(rows, dtype=float), fixed


def _values(x: dict[str, float]) -> np.ndarray:
    return np.array([1 / x["mfu"], 1 / x["mbu"], x["page_head_overhead_s"],
                     x["request_overhead_s"], x["iteration_overhead_s"]])


def _weighted(per_it, compute, y, free: dict[str, bool]
              ) -> tuple[list[str], list[int], np.ndarray]:
    """The free constants, their column indices and their columns weighted by 1 / y."""
    a, _ = _design(per_it, compute)
    names = [k for k in FITTED if free[k]]
    idx = [FITTED.index(k) for k in names]
    return names, idx, a[:, idx] / y[:, None]


def _collinear(per_it, compute, y, free: dict[str, bool]) -> dict[str, str]:
    """The free constants whose weighted column is zero, or within COLLINEAR (relative) of
    the span of the other free columns: the data measures only a combination of them."""
    names, _, cols = _weighted(per_it, compute, y, free)
    out: dict[str, str] = {}
    for j, k in enumerate(names):
        col = cols[:, j]
        norm = float(np.linalg.norm(col))
        if norm == 0:
            out[k] = "not identifiable: its term is zero in every observation"
            continue
        others = np.delete(cols, j, axis=1)
        if not others.shape[1]:
            continue
        sol, *_ = np.linalg.lstsq(others, col, rcond=None)
        r = float(np.linalg.norm(col - others @ sol)) / norm
        if r < COLLINEAR:
            with_ = ", ".join(n for n in names if n != k)
            out[k] = (f"not identifiable: in this data its term is a combination of "
                      f"{with_}'s (to {r:.1e}), so only their sum is measured (e.g. one "
                      "batch size at one context length)")
    return out


def _uncertain(per_it, compute, y, x: dict[str, float], free: dict[str, bool]
               ) -> dict[str, str]:
    """The free constants whose least-squares standard error (from the residual spread of
    the relative errors) exceeds MAX_REL_SE of the estimate."""
    names, idx, cols = _weighted(per_it, compute, y, free)
    dof = len(y) - len(idx)
    if not names or dof <= 0:
        return {}
    a, fixed = _design(per_it, compute)
    vals = _values(x)
    resid = (y - fixed - a @ vals) / y
    cov = float(resid @ resid) / dof * np.linalg.pinv(cols.T @ cols)
    out: dict[str, str] = {}
    for j, k in enumerate(names):
        est = abs(float(vals[idx[j]]))
        se = float(np.sqrt(max(cov[j, j], 0.0)))
        if est > 0 and se > MAX_REL_SE * est:
            out[k] = (f"not identifiable: its standard error is {se / est:.0%} of the "
                      "estimate (the data barely moves its term)")
    return out


def _solve(per_it, compute, y, x: dict[str, float], free: dict[str, bool]
           ) -> tuple[dict[str, float], set[str]]:
    """One weighted linear least-squares step; a free constant that leaves its domain is
    held at its bound and the rest refitted. The constants, and those held at a bound."""
    free = dict(free)
    at_bound: set[str] = set()
    a, fixed = _design(per_it, compute)
    w = 1.0 / y  # relative errors
    while True:
        vals = _values(x)
        mask = np.array([free[k] for k in FITTED])
        rhs = y - fixed - a[:, ~mask] @ vals[~mask]
        if mask.any():
            sol, *_ = np.linalg.lstsq(a[:, mask] * w[:, None], rhs * w, rcond=None)
            vals = vals.copy()
            vals[mask] = sol
        # 1/mfu and 1/mbu are at least 1 (efficiency <= 1), the costs at least 0
        out = [k for i, k in enumerate(FITTED) if mask[i] and vals[i] < _LOW[k]]
        if not out:
            return ({"mfu": 1 / vals[0], "mbu": 1 / vals[1], "page_head_overhead_s": vals[2],
                     "request_overhead_s": vals[3], "iteration_overhead_s": vals[4]},
                    at_bound)
        for k in out:  # held at its bound, the rest refitted
            free[k] = False
            at_bound.add(k)
            x = {**x, k: _bound_value(k)}


# -- the command -----------------------------------------------------------------------------
def profile_text(profile: LatencyProfile, suffix: str) -> str:
    """The profile as TOML (`key = value`, strings JSON-quoted, which TOML reads) or JSON."""
    d = profile.to_dict()
    if suffix == ".json":
        return json.dumps(d, indent=2) + "\n"
    return "".join(f"{k} = {json.dumps(v) if isinstance(v, str) else repr(v)}\n"
                   for k, v in d.items())


def calibrate(path: str | Path, out: str | Path, *, model: str, gpu: str, tp: int = 1,
              kv_dtype: str = "bf16", base: str | None = None, backend: str | None = None,
              page_size: int = 16, chunk: int = 8192) -> Fit:
    """Read `path`, fit, write the profile to `out` (.toml or .json) atomically."""
    from reports.io import atomic_write_text, check_writable

    out = Path(out)
    if out.suffix not in (".toml", ".json"):
        raise ValueError(f"--out {out}: a profile file ends in .toml or .json")
    check_writable(out.parent if str(out.parent) else Path("."))
    obs, engine = read_measurements(path, page_size, chunk)
    # the base: the file's engine's profile (vllm -> vllm-hopper; others, a CSV: sglang's)
    base_profile = load_profile(base or profile_for_rule(engine or "sglang"))
    fit = fit_profile(obs, base_profile, model, gpu, tp, kv_dtype, backend, name=out.stem)
    atomic_write_text(out, profile_text(fit.profile, out.suffix))
    return fit


def fit_lines(fit: Fit) -> list[str]:
    """What `kvsim calibrate` prints."""
    p = fit.profile
    lines = [f"{fit.observations} observations; profile {p.name} ({p.engine}, "
             f"{p.attention_backend})"]
    for k in FITTED:
        v = getattr(p, k)
        why = fit.held.get(k)
        lines.append(f"  {k:<22} {v:.6g}  ({'fitted' if why is None else 'held: ' + why})")
    lines.append(f"fit error: {fit.rms_error:.2%} rms, {fit.max_error:.2%} max (relative)")
    return lines


__all__ = ["FITTED", "Fit", "Iteration", "Observation", "calibrate", "fit_lines", "fit_profile",
           "profile_text", "read_measurements"]
