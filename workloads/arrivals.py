"""Open-loop arrival processes: when each request (or session, or prompt group) arrives.

Every process starts at t = 0 (the first arrival is at 0, like a trace shifted to its first
row) and is bounded by `num_requests`, `duration_s`, or both (whichever ends first). Arrivals
at exactly `duration_s` or later are dropped. All randomness comes from the numpy Generator the
caller passes, so a seed fixes the stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workloads.errors import WorkloadError

ARRIVAL_KINDS = ("poisson", "gamma", "fixed", "trace", "diurnal", "ladder", "burst")
_CHUNK = 4096


@dataclass(frozen=True)
class ArrivalConfig:
    """Which process and its parameters; `cv` is only read by `gamma`."""

    kind: str = "poisson"
    rate: float = 1.0  # arrivals per second
    cv: float = 1.0  # coefficient of variation of inter-arrival gaps (gamma); 1 = Poisson
    peak_to_trough: float = 3.0  # diurnal: the rate at its peak over the rate at its trough


def _check_bounds(num_requests: int | None, duration_s: float | None) -> None:
    if num_requests is None and duration_s is None:
        raise WorkloadError("an arrival process needs num_requests or duration_s")
    if num_requests is not None and (not isinstance(num_requests, int) or num_requests < 0):
        raise WorkloadError(f"num_requests must be a non-negative integer, got {num_requests!r}")
    if duration_s is not None and not (duration_s > 0 and math.isfinite(duration_s)):
        raise WorkloadError(f"duration_s must be a positive number, got {duration_s!r}")


def _check_rate(rate: float) -> None:
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise WorkloadError(f"rate must be a positive number of requests/s, got {rate!r}")


def _from_gaps(
    draw, num_requests: int | None, duration_s: float | None
) -> np.ndarray:
    """Cumulate gaps drawn in chunks; the first arrival is forced to 0."""
    if num_requests is not None:
        gaps = draw(max(num_requests - 1, 0))
        times = np.concatenate([[0.0], np.cumsum(gaps)])[:num_requests]
        if duration_s is not None:
            times = times[times < duration_s]
        return times
    assert duration_s is not None
    out = [np.zeros(1)]
    last = 0.0
    while True:
        t = last + np.cumsum(draw(_CHUNK))
        out.append(t)
        last = float(t[-1])
        if last >= duration_s:
            break
    times = np.concatenate(out)
    return times[times < duration_s]


def poisson_arrivals(
    rate: float,
    rng: np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Exponential gaps of mean 1/rate: the memoryless baseline the vLLM paper used."""
    _check_rate(rate)
    _check_bounds(num_requests, duration_s)
    return _from_gaps(lambda n: rng.exponential(1.0 / rate, n), num_requests, duration_s)


def gamma_arrivals(
    rate: float,
    cv: float,
    rng: np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Gamma gaps with mean 1/rate and coefficient of variation `cv`: cv > 1 is burstier than
    Poisson (clumps and lulls at the same mean rate), cv < 1 more regular, cv = 1 is Poisson.
    Shape k = 1/cv^2, scale = 1/(rate k)."""
    _check_rate(rate)
    if not (isinstance(cv, (int, float)) and math.isfinite(cv) and cv > 0):
        raise WorkloadError(f"cv must be a positive number, got {cv!r}")
    _check_bounds(num_requests, duration_s)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    return _from_gaps(lambda n: rng.gamma(shape, scale, n), num_requests, duration_s)


def fixed_arrivals(
    rate: float, num_requests: int | None = None, duration_s: float | None = None
) -> np.ndarray:
    """A deterministic arrival every 1/rate seconds: no queueing from burstiness at all."""
    _check_rate(rate)
    _check_bounds(num_requests, duration_s)
    if num_requests is None:
        assert duration_s is not None
        num_requests = math.ceil(duration_s * rate) + 1
    times = np.arange(num_requests, dtype=np.float64) / rate
    if duration_s is not None:
        times = times[times < duration_s]
    return times


def trace_arrivals(
    timestamps_s: np.ndarray | list[float],
    rate_scale: float = 1.0,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Replay recorded arrival times, shifted to start at 0 and compressed by `rate_scale`
    (2 = the same stream twice as fast); the bounds apply to the scaled times."""
    if not (isinstance(rate_scale, (int, float)) and math.isfinite(rate_scale) and rate_scale > 0):
        raise WorkloadError(f"rate_scale must be a positive number, got {rate_scale!r}")
    t = np.asarray(timestamps_s, dtype=np.float64)
    if len(t) == 0:
        return t
    t = (t - t[0]) / rate_scale
    if num_requests is not None:
        t = t[:num_requests]
    if duration_s is not None:
        t = t[t < duration_s]
    return t


def burst_arrivals(num_requests: int | None = None,
                   duration_s: float | None = None) -> np.ndarray:
    """Every request at t = 0: the benchmark clients' `--request-rate inf` (sglang
    bench_serving's default, vllm bench serve's too), which send the whole dataset at once."""
    if num_requests is None:
        raise WorkloadError("burst arrivals (all at t = 0) need a number of requests")
    _check_bounds(num_requests, duration_s)
    return np.zeros(num_requests)


DAY_S = 86400.0  # the diurnal curve's period


def diurnal_amplitude(peak_to_trough: float) -> float:
    """a in rate(t) = mean x (1 - a cos(2 pi t / day)): peak / trough = (1 + a) / (1 - a)."""
    if not (isinstance(peak_to_trough, (int, float)) and math.isfinite(peak_to_trough)
            and peak_to_trough >= 1):
        raise WorkloadError(f"peak_to_trough must be a number >= 1, got {peak_to_trough!r}")
    return (peak_to_trough - 1.0) / (peak_to_trough + 1.0)


def diurnal_rate(t: np.ndarray | float, rate: float, peak_to_trough: float
                 ) -> np.ndarray | float:
    """The diurnal process's rate at time t (s): mean `rate`, trough at t = 0 (midnight),
    peak at 12 h, period one day."""
    a = diurnal_amplitude(peak_to_trough)
    return rate * (1.0 - a * np.cos(2.0 * np.pi * np.asarray(t) / DAY_S))


def diurnal_arrivals(
    rate: float,
    peak_to_trough: float,
    rng: np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """A non-homogeneous Poisson process with the rate `diurnal_rate` (a day of traffic:
    quiet at night, busy in the afternoon), drawn by thinning (Lewis and Shedler 1979):
    candidates at the peak rate, each kept with probability rate(t) / peak rate. Drawn in
    chunks of candidates, so the only array that grows is the kept times. Unlike the
    homogeneous processes the first arrival is not moved to 0: the clock is the time of day."""
    _check_rate(rate)
    _check_bounds(num_requests, duration_s)
    peak = rate * (1.0 + diurnal_amplitude(peak_to_trough))
    out: list[np.ndarray] = []
    kept, last = 0, 0.0
    while True:
        t = last + np.cumsum(rng.exponential(1.0 / peak, _CHUNK))
        last = float(t[-1])
        t = t[rng.random(_CHUNK) * peak < diurnal_rate(t, rate, peak_to_trough)]
        if duration_s is not None:
            t = t[t < duration_s]
        if num_requests is not None:
            t = t[: num_requests - kept]
        out.append(t)
        kept += len(t)
        if (num_requests is not None and kept >= num_requests) or \
                (duration_s is not None and last >= duration_s):
            break
    return np.concatenate(out)


def arrival_times(
    config: ArrivalConfig,
    rng: np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Dispatch on `config.kind` for the synthetic processes (a trace replays its own times)."""
    kind = config.kind
    if kind == "poisson":
        return poisson_arrivals(config.rate, rng, num_requests, duration_s)
    if kind == "gamma":
        return gamma_arrivals(config.rate, config.cv, rng, num_requests, duration_s)
    if kind == "fixed":
        return fixed_arrivals(config.rate, num_requests, duration_s)
    if kind == "diurnal":
        return diurnal_arrivals(config.rate, config.peak_to_trough, rng, num_requests,
                                duration_s)
    if kind == "burst":
        return burst_arrivals(num_requests, duration_s)
    if kind == "trace":
        raise WorkloadError("arrival 'trace' needs a trace with timestamps")
    if kind == "ladder":
        raise WorkloadError("arrival 'ladder' is generated from its stages (workloads/ladder.py)")
    choices = ", ".join(ARRIVAL_KINDS)
    raise WorkloadError(f"unknown arrival process {kind!r} (choose from {choices})")
