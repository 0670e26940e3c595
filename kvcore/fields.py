"""Field metadata shared by every configuration spec, and the one validator that reads it.

A run's configuration is composed of frozen specs, each owned by the package that uses it:
`kvcore.memory.MemorySpec`, `workloads.spec.WorkloadSpec`, `simulator.specs.PolicySpec` and
`EngineSpec`, `experiments.options.OutputSpec`. Every field of a spec is one command-line option
(`page_size` is `--page-size`) and one key of an experiment file. What the CLI and the
validator need to know about it (help text, extra spellings, allowed values, numeric domain,
whether it changes results) is declared once, on the field, with `spec_field`; the CLI
generates its options from it and `check_fields` validates a spec when it is built, so a field
is checked in one place: the class that owns it.

This module is in kvcore, the bottom layer, so that every spec above can use it without an
import going upwards. It imports nothing from the other packages.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import Field, dataclass, field, fields
from typing import Any

MAX_TOKENS = 1 << 24  # token lengths and counts stay within one synthetic token namespace
MAX_I32 = (1 << 31) - 1  # counts and slot numbers stay within the page table's int32
MAX_SEED = (1 << 63) - 1

Choices = tuple[str, ...] | Callable[[], Iterable[str]]


@dataclass(frozen=True)
class Domain:
    """The numbers a numeric option accepts: lo..hi, lo inclusive or not, hi inclusive (an
    infinite hi is open); never NaN or infinite."""

    lo: float
    hi: float = math.inf
    lo_inclusive: bool = True

    def __contains__(self, v: float) -> bool:
        above = v >= self.lo if self.lo_inclusive else v > self.lo
        return above and v <= self.hi and (isinstance(v, int) or math.isfinite(v))

    def __str__(self) -> str:
        left = "[" if self.lo_inclusive else "("
        top = "inf)" if self.hi == math.inf else f"{self.hi:,}]"
        return f"{left}{self.lo}, {top}"


def spec_field(default: Any, help: str, *, flags: tuple[str, ...] = (),
               choices: Choices | None = None, domain: Domain | None = None,
               normalize: Callable[[str], str] | None = None, path: bool = False,
               hashed: bool = True, option: str | None = None,
               derived: str | None = None,
               implies: dict[str, dict[str, Any]] | None = None) -> Any:
    """A dataclass field that is also a command-line option and an experiment-file key.

    `flags`: extra spellings (`--num-gpu-blocks-override`, an old `--think-time`), accepted on
    the command line and, without the dashes, as file keys. `choices`: the allowed values, a
    tuple or a zero-argument callable (registries are read lazily). `domain`: the numbers a
    numeric option accepts. `normalize`: how a value is spelled before it is compared with the
    choices (case, aliases). `path`: a file or directory name (must not be empty). `hashed`:
    False for options that do not change the numbers (output paths, devices, checks; memory
    inputs whose resolved pool size is hashed instead). `option`: the option's name when it is
    not the field's (WorkloadSpec.name is `--workload`). `derived`: not an option of a composed
    run; the run fills it from the option of that name (a workload's seed is the run's seed).
    `implies`: extra spelling -> other options it sets, for an engine's own name that carries
    that engine's meaning (vLLM's `--gpu-memory-utilization` is the fraction of vLLM's budget
    rule, so it also sets `budget = "vllm"`).
    """
    unknown = sorted(set(implies or {}) - set(flags))
    if unknown:
        raise ValueError(f"implies names spellings not in flags: {', '.join(unknown)}")
    meta = {"help": help, "flags": flags, "choices": choices, "domain": domain,
            "normalize": normalize, "path": path, "hashed": hashed, "option": option,
            "derived": derived, "implies": dict(implies or {})}
    return field(default=default, metadata=meta)


def flag(name: str) -> str:
    """The command-line spelling of an option name: page_size -> --page-size."""
    return "--" + name.replace("_", "-")


def option_name(f: Field) -> str:
    return f.metadata.get("option") or f.name


def is_option(f: Field) -> bool:
    """A field declared with spec_field that a user sets (not one a composed run derives)."""
    return "help" in f.metadata and not f.metadata.get("derived")


@functools.cache
def field_types(cls: type) -> dict[str, tuple[type, bool]]:
    """Field name -> (plain type: int, float, str or bool; whether None is allowed)."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = typing.get_args(hint)
        is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        plain = [a for a in args if a is not type(None)] if is_union else [hint]
        out[name] = (plain[0], is_union and type(None) in args)
    return out


def allowed_values(f: Field) -> list[str] | None:
    choices = f.metadata.get("choices")
    if choices is None:
        return None
    return list(choices() if callable(choices) else choices)


def _type_ok(t: type, v: Any) -> bool:
    if t is bool:
        return isinstance(v, bool)
    if isinstance(v, bool):
        return False
    if t is float:
        return isinstance(v, (int, float))
    return isinstance(v, t)


def _type_name(t: type) -> str:
    return "true or false" if t is bool else t.__name__


def check_fields(spec: Any, *, skip: Iterable[str] = (),
                 error: Callable[[str], Exception] = ValueError) -> None:
    """Validate every spec_field of `spec` from its metadata: type, allowed values, numeric
    domain, non-empty paths. Raises `error` with one line naming the option's flag and what
    it accepts. `skip`: fields the spec checks itself in this case."""
    cls: type = type(spec)
    hints = field_types(cls)
    skipped = set(skip)
    for f in fields(spec):
        if "help" not in f.metadata or f.name in skipped:
            continue
        value = getattr(spec, f.name)
        name = flag(option_name(f))
        t, optional = hints[f.name]
        if value is None:
            if optional:
                continue
            raise error(f"{name} must be {_type_name(t)}, got None")
        if not _type_ok(t, value):
            raise error(f"{name} must be {_type_name(t)}, got {value!r}")
        allowed = allowed_values(f)
        if allowed is not None:
            normalize = f.metadata.get("normalize")
            key = normalize(value) if normalize is not None else value
            if key not in allowed:
                raise error(f"{name} {value!r} is not one of: {', '.join(allowed)}")
        domain = f.metadata.get("domain")
        if domain is not None and value not in domain:
            raise error(f"{name} must be in {domain}, got {value!r}")
        if f.metadata.get("path") and not str(value).strip():
            raise error(f"{name} is an empty path")


__all__ = [
    "MAX_I32",
    "MAX_SEED",
    "MAX_TOKENS",
    "Domain",
    "allowed_values",
    "check_fields",
    "field_types",
    "flag",
    "is_option",
    "option_name",
    "spec_field",
]
