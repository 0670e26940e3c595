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


def chain_runs(spec: list[tuple[int, bool]], free: list[int],
               ends: list[tuple[int, int, int]], nxt: int
               ) -> tuple[list[int], list[int], list[tuple[int, int, int, int]], list[int], int]:
    """One `ChainIndex.insert_runs` call's arguments from (run length, continue a chain?)
    pairs: each run takes the next free blocks and fresh hashes nxt, nxt + 1, ...; a run that
    continues takes the chain last in `ends` ((last block, its hash, chain end) each, popped)
    and every run leaves its own end there. Stops at the first run the free blocks cannot
    hold. Returns (blocks, hashes, runs, the free blocks left, the next fresh hash)."""
    every: list[int] = []
    hashes: list[int] = []
    runs: list[tuple[int, int, int, int]] = []
    for k, cont in spec:
        if k > len(free):
            break
        blocks, free = free[:k], free[k:]
        after, parent, start = ends.pop() if cont and ends else (0, 0, 0)
        runs.append((k, parent, start, after))
        every += blocks
        hashes += range(nxt, nxt + k)
        nxt += k
        ends.append((blocks[-1], nxt - 1, start + k))
    return every, hashes, runs, free, nxt
