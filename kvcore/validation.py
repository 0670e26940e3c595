"""Argument checks shared by kvcore: one clear ValueError naming the argument and its value."""

from __future__ import annotations

import numbers


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


def align_down(a: int, b: int) -> int:
    return a // b * b
