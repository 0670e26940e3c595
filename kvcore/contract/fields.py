"""Field metadata shared by every configuration spec, and the one validator that reads it.

A run's configuration is composed of frozen specs, each owned by the package that uses it:
`kvcore.model.memory.MemorySpec`, `workloads.spec.WorkloadSpec`, `simulator.specs.PolicySpec`,
`EngineSpec` and `TierSpec`, `experiments.options.run_options.OutputSpec`. What a field means (help
text, allowed values, numeric domain, whether it changes results, whether a grid of runs may vary
it) is declared once, on the field, with `spec_field`, and `check_fields` validates a spec
when it is built, so a field is checked in one place: the class that owns it.

This module is in kvcore, the bottom layer, so that every spec above can use it without an
import going upwards; it imports nothing from the other packages and knows nothing of a
command line: how an option is spelled besides its name (an engine's own flag, an old
name, the list flag of a sweep) lives in experiments/options/spellings.py. Errors name a field the
way every layer names it, `--` and the field's name with dashes (`--page-size`), so a
message reads the same from a spec, a file key or a flag.
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


def spec_field(default: Any, help: str, *, choices: Choices | None = None,
               domain: Domain | None = None, normalize: Callable[[str], str] | None = None,
               path: bool = False, hashed: bool = True, option: str | None = None,
               derived: str | None = None, axis: bool = False) -> Any:
    """A dataclass field that is also a run option (one name for the flag, the experiment-file
    key and the summary column).

    `choices`: the allowed values, a tuple or a zero-argument callable (registries are read
    lazily). `domain`: the numbers a numeric option accepts. `normalize`: how a value is
    spelled before it is compared with the choices (case, aliases). `path`: a file or
    directory name (must not be empty). `hashed`: False for options that do not change the
    numbers (output paths, devices, checks; memory inputs whose resolved pool size is hashed
    instead). `option`: the option's name when it is not the field's (WorkloadSpec.name is
    `workload`). `derived`: not an option of a composed run; the run fills it from the option
    of that name (a workload's seed is the run's seed). `axis`: a grid of runs may vary it
    (a sweep takes a list of its values; experiments/options/grid.py).
    """
    meta = {"help": help, "choices": choices, "domain": domain, "normalize": normalize,
            "path": path, "hashed": hashed, "option": option, "derived": derived,
            "axis": axis}
    return field(default=default, metadata=meta)


def flag(name: str) -> str:
    """How an error names an option: page_size -> --page-size."""
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
