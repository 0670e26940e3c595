"""Argument checks shared by kvcore: one clear ValueError naming the argument and its value."""

from __future__ import annotations

import numbers

import numpy as np


class InvariantError(AssertionError):
    """A kvcore data structure is in a state its design forbids (a bug, never a user error)."""


def positive_int(name: str, value: object) -> int:
    """`value` as an int > 0, or ValueError('<name> must be a positive integer, got ...')."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


def check_request_lengths(
    prompt_len: int, final_len: int, max_context_len: int, min_prompt: int = 0
) -> None:
    """prompt_len >= min_prompt, 1 <= final_len, prompt_len <= final_len <= max_context_len."""
    if min_prompt:
        positive_int("prompt_len", prompt_len)
    else:
        non_negative_int("prompt_len", prompt_len)
    positive_int("final_len", final_len)
    if final_len < prompt_len:
        raise ValueError(f"final_len must be >= prompt_len {prompt_len}, got {final_len}")
    if final_len > max_context_len:
        raise ValueError(f"final_len must be <= max_context_len {max_context_len}, got {final_len}")


def int_array(name: str, x: object) -> np.ndarray:
    """`x` (a list, numpy array or tensor on any device) as a 1-D int64 host array; no copy
    when it already is one. Lengths and token ids are host data: arithmetic on them is cheap
    in numpy."""
    if type(x) is np.ndarray and x.dtype == np.int64 and x.ndim == 1:
        return x  # the common case (token ids, lengths), checked without a conversion
    if hasattr(x, "cpu") and hasattr(x, "numpy"):  # a torch tensor
        x = x.cpu().numpy()
    a = np.asarray(x, dtype=np.int64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of integers, got shape {a.shape}")
    return a
