"""`Totals`: the running sums over the manager's live rows behind its breakdown
(kvcore/sglang/policy.py), updated by each call for the rows it touches, and their recount
over every row (what check_invariants compares them with)."""

from __future__ import annotations

import numpy as np

__all__ = ["Totals", "grow_totals", "recount_totals"]


class Totals:
    """Running sums over the live rows of what the breakdown needs: written tokens, cached
    (tree-owned) tokens, the ends of their last pages (`end` = ceil_ps(written)) and the
    rounding beyond their final lengths (sum of max(end - final, 0)). Free rows hold zeros and
    add nothing, so these equal the sums over the whole arrays."""

    __slots__ = ("cached", "end", "rounding", "written")

    def __init__(self) -> None:
        self.written = self.cached = self.end = self.rounding = 0

    def as_tuple(self) -> tuple[int, int, int, int]:
        return self.written, self.cached, self.end, self.rounding


def recount_totals(written: np.ndarray, cached: np.ndarray, final: np.ndarray,
                   page_size: int) -> tuple[int, int, int, int]:
    """`Totals` recomputed over every row (a free row holds zeros and adds nothing): what
    check_invariants compares the running totals with."""
    end = (written + (page_size - 1)) // page_size * page_size
    return (int(written.sum()), int(cached.sum()), int(end.sum()),
            int(np.maximum(end - final, 0).sum()))


def grow_totals(tot: Totals, page_size: int, final: np.ndarray, w: np.ndarray,
                target: np.ndarray) -> None:
    """Rows with final lengths `final` went from `w` to `target` written tokens (a batched
    extend): update the running totals."""
    ps = page_size
    e0, e1 = (w + (ps - 1)) // ps * ps, (target + (ps - 1)) // ps * ps
    tot.written += int((target - w).sum())
    tot.end += int((e1 - e0).sum())
    tot.rounding += int((np.maximum(e1 - final, 0) - np.maximum(e0 - final, 0)).sum())
