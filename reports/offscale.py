"""Overloaded points on a figure: drawn hollow, kept from setting the axis range, and named
when they fall beyond it.

An overloaded run's latency is the backlog it built, not what its configuration costs: a page
at 12-14 s/token squashes every servable point against the axis and hides the differences the
figure is for. So the y range (and the choice of a log axis) is taken from the servable points
whenever one exists; an overloaded point outside that range is drawn as a hollow arrow at the
axis edge, and a note under the axis (and in the report summary) names it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D

from reports.interactive import fmt_number

OVERLOADED_LABEL = "overloaded (hollow)"
LOG_SPAN = 100.0  # two decades or more go on a log axis (as reports.plots)
MAX_NAMED = 4  # off-scale points named in a figure's note; the rest are counted
NOTE_WIDTH = 70  # characters per line of the note (a 6-inch axis at 8 pt)


@dataclass(frozen=True)
class Drawn:
    """One drawn line's points, which of them are overloaded, and how it looks."""

    name: str
    x: np.ndarray
    y: np.ndarray
    over: np.ndarray
    color: str
    marker: str


def draw_line(ax: Axes, x: Sequence[float], y: Sequence[float], over: Sequence[bool], *,
              name: str, marker: str = "o", linestyle: str = "-", **kw) -> Drawn:
    """A line with filled markers at servable points and hollow ones at overloaded points."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    oa = np.asarray(over, dtype=bool)
    ok = [i for i in range(len(xa)) if not oa[i]]
    line, = ax.plot(xa, ya, marker=marker, linestyle=linestyle, label=name, markevery=ok, **kw)
    color = line.get_color()
    if oa.any():
        # an explicit color: the hollow markers must not advance the axes' color cycle
        ax.plot(xa[oa], ya[oa], linestyle="none", marker=marker, color=color,
                markerfacecolor="none", markeredgecolor=color, markeredgewidth=1.5,
                gid="overloaded")
    return Drawn(name, xa, ya, oa, to_hex(color), marker)


def _wide(v: np.ndarray) -> bool:
    return bool(v.size and (v > 0).all() and v.max() / v.min() >= LOG_SPAN)


def fit_servable(ax: Axes, drawn: Sequence[Drawn], *, from_zero: bool = False,
                 ref: float | None = None, top: float | None = None,
                 x_fmt=fmt_number) -> list[str]:
    """Set the y range (and log scale when the values span decades) from the servable points,
    add the legend entry for hollow points, mark off-scale overloaded points at the edge and
    note them under the axis. `from_zero`: the axis starts at 0 (hit rates); `ref`: a value
    the range must include (a reference line); `top`: an upper bound (1 for a rate).
    Returns the off-scale points as "line at x (y)" strings."""
    ys = np.concatenate([d.y for d in drawn]) if drawn else np.array([])
    over = np.concatenate([d.over for d in drawn]) if drawn else np.array([], dtype=bool)
    finite = np.isfinite(ys)
    ok = ys[finite & ~over]
    if over.any():
        handles, labels = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none",
                              markeredgecolor="0.3", markeredgewidth=1.5))
        labels.append(OVERLOADED_LABEL)
        ax.legend(handles, labels, fontsize=8)
    if not ok.size:  # nothing servable: every point is the evidence, let them set the range
        if _wide(ys[finite]) and not from_zero:
            ax.set_yscale("log")
        if from_zero:
            ax.set_ylim(bottom=0)
        return []
    log = _wide(ok) and not from_zero
    lo, hi = float(ok.min()), float(ok.max())
    if ref is not None and np.isfinite(ref):
        lo, hi = min(lo, ref), max(hi, ref)
    if log:
        ax.set_yscale("log")
        lo, hi = lo / 1.5, hi * 1.5
    else:
        if from_zero:
            lo = 0.0
        pad = 0.06 * ((hi - lo) or abs(hi) or 1.0)
        lo, hi = (lo if from_zero else lo - pad), hi + pad
        if top is not None:
            hi = min(hi, top)
    ax.set_ylim(lo, hi)
    off: list[str] = []
    for d in drawn:
        for xi, yi in zip(d.x[d.over], d.y[d.over], strict=True):
            if not np.isfinite(yi) or lo <= yi <= hi:
                continue
            up = yi > hi
            ax.plot([xi], [hi if up else lo], linestyle="none", marker="^" if up else "v",
                    color=d.color,
                    markersize=9, markerfacecolor="none", markeredgecolor=d.color,
                    markeredgewidth=1.5, clip_on=False, gid="off-scale")
            off.append(f"{d.name} at {x_fmt(xi)} ({fmt_number(float(yi))})")
    if off:
        named = "; ".join(off[:MAX_NAMED]) + (f"; {len(off) - MAX_NAMED} more"
                                              if len(off) > MAX_NAMED else "")
        note = textwrap.fill(f"off-scale, overloaded (arrow at the edge): {named}",
                             NOTE_WIDTH)
        ax.set_xlabel(f"{ax.get_xlabel()}\n{note}", fontsize=8)
    return off


__all__ = ["OVERLOADED_LABEL", "Drawn", "draw_line", "fit_servable"]
