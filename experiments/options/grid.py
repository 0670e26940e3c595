"""The sweep grid: which options a sweep can vary, how their lists are written, the cells.

A sweep is the cross product of a few option lists (`--page-sizes 1..256 --policies
paged,vllm`) applied to one set of options; each combination is a cell, a `RunOptions`. The
options a grid can vary are declared on their fields (`spec_field(..., axis=True)`); each has
one list flag, its plural (experiments/options/spellings.py `list_flag`), with one meaning in every
command that offers it: the values to run, a comma list (integers also `a..b`, the powers of
two from a to b: `3..17` is 4, 8, 16, as page sizes are; a range without one is an error).
`kv_tokens` is its own plural, so `--kv-tokens` is that list everywhere; a command that runs
one configuration takes a list of one value (cli.py says which command runs more).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from experiments.options.run_options import OPTIONS, RunOptions
from experiments.options.spellings import key as spelling_key
from simulator.fleet.spec import grid_cell

# the options a grid can vary (declared `axis=True` on their fields) -> the flag of their comma
# list; page size and policy lead (a figure's x axis and its lines), then the options' order
SWEEP_AXES: dict[str, str] = {
    o.name: o.list_flag for o in sorted((o for o in OPTIONS.values() if o.axis),
                                        key=lambda o: (o.name != "page_size", o.name != "policy"))}
# an axis's list flag as a parameter name (`page_sizes`; a TOML list fills it)
AXIS_PARAMS: dict[str, str] = {name: spelling_key(f) for name, f in SWEEP_AXES.items()}
AXIS_TYPES: dict[str, type] = {name: OPTIONS[name].type for name in SWEEP_AXES}
DEFAULT_PAGE_SIZES = "1,2,4,8,16,32,64,128,256"


def powers_of_two(lo: int, hi: int) -> list[int]:
    """The powers of two p with lo <= p <= hi (3..17 -> 4, 8, 16)."""
    p = 1 << max(lo - 1, 0).bit_length()  # the smallest power of two >= lo
    out = []
    while p <= hi:
        out.append(p)
        p *= 2
    return out


def parse_list(text: str | None, kind: type, name: str) -> list[Any] | None:
    """'1,2,4' -> [1, 2, 4]; 'a..b' (ints) -> the powers of two from a to b; None -> None."""
    if text is None:
        return None
    out: list[Any] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if ".." in part and kind is int:
                lo, hi = (int(x) for x in part.split(".."))
                if lo <= 0 or hi < lo:
                    raise ValueError
                span = powers_of_two(lo, hi)
                if not span:
                    raise ValueError(f"{name} {text!r}: {part} holds no power of two")
                out.extend(span)
            else:
                out.append(kind(part))
        except ValueError as e:
            if "holds no power of two" in str(e):
                raise
            raise ValueError(f"{name} {text!r}: expected a comma list of {kind.__name__}s"
                             + (" (or a..b for the powers of two from a to b)" if kind is int
                                else "")) from None
    if not out:
        raise ValueError(f"{name} is empty")
    return out


def page_sizes_for(opts: RunOptions, text: str | None) -> tuple[str, list[str]]:
    """The page sizes to simulate and what to tell the user about them. The default list
    (no `text`, or the default's text) loses the sizes the run's attention backend cannot
    run; a list the user gave is kept, and a size in it the backend cannot run fails when its
    cell is built, before any cell runs. A backend that walks page 1 inside the kernel makes
    the page size a memory-only choice: the notes say so."""
    rules = opts.engine_spec().page_rules()
    if rules is None:
        return (DEFAULT_PAGE_SIZES if text is None else text), []  # '' stays an error
    engine, backend = rules
    notes: list[str] = []
    if text is None or text == DEFAULT_PAGE_SIZES:
        sizes = parse_list(DEFAULT_PAGE_SIZES, int, "--page-sizes") or []
        rule = backend.rule(engine)
        dropped = [p for p in sizes if not rule.allows(p)]
        if dropped:
            notes.append(f"page sizes {', '.join(map(str, dropped))} left out: {engine}'s "
                         f"{backend.name} attention backend runs {rule.describe()}")
        text = ",".join(str(p) for p in sizes if rule.allows(p))
    if engine in backend.page_one_engines:
        notes.append(f"{engine}'s {backend.name} backend runs page 1 inside the kernel: the "
                     "page size is a memory-only choice (it changes memory, not attention "
                     "time)")
    return text, notes


def sweep_axes(lists: Mapping[str, str | None]) -> dict[str, list[Any]]:
    """The grid from the sweep flags' texts (option name -> comma list, None: not given, the
    option's single value is used)."""
    axes: dict[str, list[Any]] = {}
    for name, text in lists.items():
        values = parse_list(text, AXIS_TYPES[name], SWEEP_AXES[name])
        if values is not None:
            axes[name] = values
    return axes


def cells(base: RunOptions, axes: Mapping[str, Iterable[Any]]) -> list[RunOptions]:
    """The cross product of `axes` (option name -> values) applied to `base`, in order; every
    cell is validated as it is built, so a bad value fails before anything runs."""
    names = list(axes)
    out = []
    for combo in itertools.product(*(list(axes[n]) for n in names)):
        cell = RunOptions.from_mapping(dict(zip(names, combo, strict=True)), base)
        out.append(replace(cell, fleet=grid_cell(cell.fleet)))  # one replica: no router
    return out


__all__ = ["AXIS_PARAMS", "DEFAULT_PAGE_SIZES", "SWEEP_AXES", "cells", "page_sizes_for",
           "parse_list", "powers_of_two", "sweep_axes"]
