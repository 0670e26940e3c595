"""Which summary rows form one line of a figure, what the line is called, and the row order.

A sweep varies a few options (its axes, kept in config.json); every other column that differs
between cells is a consequence of them. The default memory rule, for one, resolves a pool one
slot different per page size, so grouping lines by every varying column split each policy's
curve into one fragment per page size (legend "kv_tokens=410485"). Lines are therefore grouped
by the swept axes and by the options a user chooses (`CHOSEN`) that vary, never by resolved
ones (`DERIVED`). A chosen option varies outside the axes when a results directory holds
several sweeps (a resumed sweep run again with another `--hicache-write-policy`): its rows
are then drawn apart, never averaged together (seeds alone are averaged).

Figures, the report table and the interactive page all order rows the same way: by policy
(the order the user listed them in, else alphabetical), then page size, then the other axes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

# columns the run resolves from the options rather than takes from the user
DERIVED: tuple[str, ...] = ("kv_tokens", "max_context_len", "model", "memory_rule")
# options that tell runs apart when no sweep axes are known (in label order)
CHOSEN: tuple[str, ...] = ("policy", "placement", "workload", "rate", "rate_scale", "admission",
                           "schedule", "preempt", "eviction", "gpu", "tp", "kv_dtype", "latency",
                           "budget", "mem_fraction", "hicache_ratio", "hicache_write_policy",
                           "storage_size")
# an x-axis column -> the option it measures (a rate sweep's x is the measured arrival rate)
X_OPTION = {"rate_req_s": "rate"}
NOT_SERIES = ("seed",)  # seeds of one configuration are averaged, not drawn apart


def _varies(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and df[col].astype(str).nunique() > 1


def with_axis_values(df: pd.DataFrame, axes: Mapping[str, Sequence[Any]] | None) -> pd.DataFrame:
    """`df` with a swept pool size shown as the user gave it: the summary's kv_tokens is the
    resolved pool (rounded down to whole pages), which differs per page size for one value of
    the `--kv-tokens` axis; the given value is the axis value that rounds to it."""
    if not axes or "kv_tokens" not in axes or not {"kv_tokens", "page_size"} <= set(df.columns):
        return df
    given = [int(v) for v in axes["kv_tokens"]]

    def original(row: pd.Series) -> int:
        ps, resolved = int(row["page_size"]), int(row["kv_tokens"])
        return next((v for v in given if v // ps * ps == resolved), resolved)

    out = df.copy()
    out["kv_tokens"] = [original(r) for _, r in df.iterrows()] if len(df) else []
    return out


def series_keys(df: pd.DataFrame, x: str | None,
                axes: Mapping[str, Sequence[Any]] | None = None) -> list[str]:
    """The columns whose values name one line (besides the x axis `x`): the swept axes that
    vary here, then the chosen options that vary; policy always leads when present, so a
    one-policy figure still says which policy it shows."""
    skip = {x, X_OPTION.get(x or ""), *NOT_SERIES}
    pool = list(dict.fromkeys([*(axes or ()), *CHOSEN]))
    keys = [k for k in pool if k not in skip and _varies(df, k)]
    if "policy" in df.columns and x != "policy":
        keys = ["policy", *[k for k in keys if k != "policy"]]
    return keys


def label(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    """A line's legend text: the policy by name, the other keys as key=value."""
    if not keys:
        return str(row.get("policy", "run"))
    parts = []
    for k in keys:
        v = row[k]
        if isinstance(v, float) and math.isfinite(v):
            v = f"{v:g}"
        parts.append(str(v) if k == "policy" else f"{k}={v}")
    return ", ".join(parts)


def truthy(v: Any) -> bool:
    """A bool read back from CSV (True / 'True' / 1)."""
    return str(v).strip().lower() in ("true", "1", "yes")


def overloaded_mask(df: pd.DataFrame) -> pd.Series:
    """Rows the run flagged as overloaded (all False when the summary has no such column):
    the figures draw them hollow and keep them from setting an axis, the report names them."""
    if "overloaded" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["overloaded"].map(truthy).astype(bool)


def ordered(df: pd.DataFrame, axes: Mapping[str, Sequence[Any]] | None = None) -> pd.DataFrame:
    """Rows by policy (in the axes' order when given, else alphabetical), then page size,
    then the other axes' values in their listed order, then seed."""
    if df.empty:
        return df
    sort_cols: list[str] = []
    keys: dict[str, dict[str, int]] = {}  # column -> rank of each listed value
    for col in ("policy", "page_size", *(a for a in (axes or {}) if a not in
                                         ("policy", "page_size")), "seed"):
        if col not in df.columns or col in sort_cols:
            continue
        sort_cols.append(col)
        listed = [str(v) for v in (axes or {}).get(col, [])]
        if listed and not pd.api.types.is_numeric_dtype(df[col]):  # numbers sort as numbers
            keys[col] = {name: i for i, name in enumerate(listed)}
    if not sort_cols:
        return df

    def key(s: pd.Series) -> pd.Series:
        rank = keys.get(str(s.name))
        if rank is not None:
            return s.astype(str).map(rank).fillna(len(rank))
        return s if pd.api.types.is_numeric_dtype(s) else s.astype(str)

    return df.sort_values(sort_cols, key=key, kind="stable").reset_index(drop=True)


__all__ = ["CHOSEN", "DERIVED", "label", "ordered", "overloaded_mask", "series_keys", "truthy",
           "with_axis_values"]
