"""Prompt and output length distributions, and the named `sharegpt` / `alpaca` presets.

A length model samples (input, output) pairs together, because in real traffic the two are
correlated (a long document to summarise gets a short answer); `EmpiricalPairs` keeps the
pairing of a trace row, `IndependentPairs` combines two one-dimensional distributions. Every
sampled length is an integer >= 1: an engine cannot serve an empty prompt, and a request
produces at least one token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from workloads.errors import WorkloadError

DATA_DIR = Path(__file__).resolve().parent / "data"
SHAREGPT_FILE = DATA_DIR / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"

# vLLM paper (SOSP'23), Fig. 11: mean input / output lengths of the datasets it replayed.
SHAREGPT_MEANS = (161.31, 337.99)
ALPACA_MEANS = (19.31, 58.45)
# Our choice (the paper publishes no spread): lognormal sigmas for Alpaca input / output.
ALPACA_SIGMAS = (0.6, 0.9)


class LengthDist(Protocol):
    """A one-dimensional length distribution."""

    @property
    def mean(self) -> float: ...

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray: ...


class LengthModel(Protocol):
    """Samples (input lengths, output lengths), each an int64 array of n values >= 1."""

    def sample_pairs(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]: ...


def _positive_int(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 1):
        raise WorkloadError(f"{name} must be a number >= 1, got {value!r}")


@dataclass(frozen=True)
class FixedLengths:
    """Every sample equals `value`: isolates one length in a sweep."""

    value: int

    def __post_init__(self) -> None:
        _positive_int("fixed length", self.value)

    @property
    def mean(self) -> float:
        return float(int(self.value))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, int(self.value), dtype=np.int64)


@dataclass(frozen=True)
class UniformLengths:
    """Integers uniform on [low, high], both inclusive."""

    low: int
    high: int

    def __post_init__(self) -> None:
        _positive_int("uniform low", self.low)
        if self.high < self.low:
            raise WorkloadError(f"uniform high {self.high} is below low {self.low}")

    @property
    def mean(self) -> float:
        return (int(self.low) + int(self.high)) / 2.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(int(self.low), int(self.high) + 1, size=n, dtype=np.int64)


@dataclass(frozen=True)
class LogNormalLengths:
    """Lognormal with the given arithmetic `mean` (mu = ln(mean) - sigma^2/2), rounded to the
    nearest integer, at least 1 and at most `max_len` when set. The heavy right tail is what
    makes output reservation hard; rounding and clipping move the mean by well under 1 %
    for means above ~10."""

    target_mean: float
    sigma: float
    max_len: int | None = None

    def __post_init__(self) -> None:
        _positive_int("lognormal mean", self.target_mean)
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise WorkloadError(f"lognormal sigma must be >= 0, got {self.sigma!r}")

    @property
    def mean(self) -> float:
        return float(self.target_mean)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.target_mean) - self.sigma**2 / 2
        x = np.rint(rng.lognormal(mu, self.sigma, n))
        hi = self.max_len if self.max_len is not None else np.iinfo(np.int64).max // 4
        return np.clip(x, 1, hi).astype(np.int64)


@dataclass(frozen=True, eq=False)
class EmpiricalLengths:
    """Resample (with replacement) from observed lengths, e.g. one column of a trace."""

    values: np.ndarray

    def __post_init__(self) -> None:
        if len(self.values) == 0:
            raise WorkloadError("empirical lengths need at least one value")

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        idx = rng.integers(0, len(self.values), size=n)
        return np.maximum(np.asarray(self.values, dtype=np.int64)[idx], 1)


@dataclass(frozen=True)
class IndependentPairs:
    """Input and output drawn independently (input first, then output, from one generator)."""

    input: LengthDist
    output: LengthDist

    @property
    def means(self) -> tuple[float, float]:
        return (self.input.mean, self.output.mean)

    def sample_pairs(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.input.sample(rng, n), self.output.sample(rng, n)


@dataclass(frozen=True, eq=False)
class EmpiricalPairs:
    """Resample whole trace rows, keeping each row's input/output pairing."""

    inputs: np.ndarray
    outputs: np.ndarray
    note: str = field(default="")

    def __post_init__(self) -> None:
        if len(self.inputs) == 0 or len(self.inputs) != len(self.outputs):
            raise WorkloadError("empirical pairs need equally many (>= 1) inputs and outputs")

    @property
    def means(self) -> tuple[float, float]:
        return (float(np.mean(self.inputs)), float(np.mean(self.outputs)))

    def sample_pairs(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, len(self.inputs), size=n)
        inp = np.maximum(np.asarray(self.inputs, dtype=np.int64)[idx], 1)
        out = np.maximum(np.asarray(self.outputs, dtype=np.int64)[idx], 1)
        return inp, out


def rescale_to_mean(values: np.ndarray, target_mean: float) -> tuple[np.ndarray, float]:
    """Multiply `values` by one factor f, round half-to-even (np.rint), clip below at 1, with f
    chosen so the mean of the result is as close as possible to `target_mean`.

    f starts at target/mean; rounding and the floor of 1 bias the mean of the result, so f is
    then refined by bisection (60 steps, the mean of the rounded column is monotone in f) and
    the closer of the two bracketing factors is kept. The shape (quantiles up to a constant,
    the correlation with the other column) is the file's. Returns (rescaled ints, f).
    """
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0 or not np.all(np.isfinite(x)) or np.mean(x) <= 0:
        raise WorkloadError("cannot rescale an empty or non-positive column")

    def g(f: float) -> float:
        return float(np.mean(np.maximum(np.rint(x * f), 1.0)))

    f0 = target_mean / float(np.mean(x))
    lo, hi = f0 / 4, f0 * 4
    for _ in range(60):
        mid = (lo + hi) / 2
        if g(mid) < target_mean:
            lo = mid
        else:
            hi = mid
    f = lo if abs(g(lo) - target_mean) <= abs(g(hi) - target_mean) else hi
    return np.maximum(np.rint(x * f), 1.0).astype(np.int64), f


@lru_cache(maxsize=1)
def sharegpt_real_lengths() -> tuple[np.ndarray, np.ndarray]:
    """The bundled ShareGPT length list (Llama-2 tokenizer, <= 8k tokens): (inputs, outputs)."""
    table = np.loadtxt(SHAREGPT_FILE, delimiter=",", skiprows=1, usecols=(0, 1), dtype=np.int64)
    return table[:, 0].copy(), table[:, 1].copy()


@lru_cache(maxsize=1)
def _sharegpt_rescaled() -> tuple[np.ndarray, np.ndarray, float, float]:
    inp, out = sharegpt_real_lengths()
    inp_s, f_in = rescale_to_mean(inp, SHAREGPT_MEANS[0])
    out_s, f_out = rescale_to_mean(out, SHAREGPT_MEANS[1])
    return inp_s, out_s, f_in, f_out


def sharegpt_lengths() -> EmpiricalPairs:
    """ShareGPT at the vLLM paper's means: the real file's rows, each column rescaled
    multiplicatively (see `rescale_to_mean`), resampled by row."""
    inp, out, f_in, f_out = _sharegpt_rescaled()
    note = f"sharegpt rescaled: input x{f_in:.6f}, output x{f_out:.6f}"
    return EmpiricalPairs(inp, out, note=note)


def sharegpt_real_pairs() -> EmpiricalPairs:
    """ShareGPT lengths as they are in the file (means 2,340 / 439)."""
    inp, out = sharegpt_real_lengths()
    return EmpiricalPairs(inp, out, note="sharegpt real lengths")


def alpaca_lengths() -> IndependentPairs:
    """Alpaca at the vLLM paper's means. No per-request Alpaca length file is bundled, so this
    is a documented stand-in: independent lognormals with sigma 0.6 (input) and 0.9 (output)."""
    return IndependentPairs(
        LogNormalLengths(ALPACA_MEANS[0], ALPACA_SIGMAS[0]),
        LogNormalLengths(ALPACA_MEANS[1], ALPACA_SIGMAS[1]),
    )


LENGTH_PRESETS = ("sharegpt", "alpaca", "sharegpt-real", "fixed", "uniform", "lognormal")


def length_model(
    name: str,
    input_len: int = 512,
    output_len: int = 128,
    spread: float = 0.5,
    sigma: float = 1.0,
) -> LengthModel:
    """A length model by name. `fixed`: exactly input_len / output_len; `uniform`: each on
    [mean (1 - spread), mean (1 + spread)]; `lognormal`: those means with the given sigma."""
    if name == "sharegpt":
        return sharegpt_lengths()
    if name == "alpaca":
        return alpaca_lengths()
    if name == "sharegpt-real":
        return sharegpt_real_pairs()
    _positive_int("input_len", input_len)
    _positive_int("output_len", output_len)
    if name == "fixed":
        return IndependentPairs(FixedLengths(int(input_len)), FixedLengths(int(output_len)))
    if name == "uniform":
        if not (0 <= spread <= 1):
            raise WorkloadError(f"spread must be in [0, 1], got {spread!r}")

        def u(m: int) -> UniformLengths:
            return UniformLengths(max(1, round(m * (1 - spread))), max(1, round(m * (1 + spread))))

        return IndependentPairs(u(int(input_len)), u(int(output_len)))
    if name == "lognormal":
        return IndependentPairs(
            LogNormalLengths(input_len, sigma), LogNormalLengths(output_len, sigma)
        )
    choices = ", ".join(LENGTH_PRESETS)
    raise WorkloadError(f"unknown length distribution {name!r} (choose from {choices})")
