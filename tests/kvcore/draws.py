"""Draws shared by the policies' stateful machines."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from hypothesis import strategies as st


def draw_extend(data: st.DataObject, written: Callable[[int], int],
                prompt_len: Mapping[int, int]) -> tuple[list[int], list[int]]:
    """An `extend` call: some live requests (ids of `prompt_len`) and, for each, a target
    between what it has written and its prompt's length (equal: a no-op chunk)."""
    rids = data.draw(st.lists(st.sampled_from(sorted(prompt_len)), unique=True, min_size=1))
    targets = []
    for rid in rids:
        w = written(rid)
        targets.append(data.draw(st.integers(w, max(w, prompt_len[rid]))))
    return rids, targets
