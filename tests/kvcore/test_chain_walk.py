"""The chain index's windowed walk (kvcore/vllm/chain_index.py `ChainIndex.walk`) against the
per-block model of vLLM's pool.

A walk compares segments with the chain from where the caller's still-valid hit ends and
reads the chain in windows, stopping at the first window with a miss. The prompts of the
model machines are a few blocks long, so with the default window (1,024 positions) every walk
is one window; here the window is one position, so every lookup crosses windows (segments
that start after a window, follow it into the next one or end inside it), with and without
colliding hashes and with interleaved chunks. Each machine is test_chain_index.py's or
test_chain_runs.py's, checked against the same model after every step.
"""

from __future__ import annotations

from hypothesis import settings

from tests.kvcore.test_chain_index import PoolMachine
from tests.kvcore.test_chain_runs import InterleavedMachine


class NarrowPool(PoolMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool.indexes[0].window = 1


class NarrowPoolCollisions(NarrowPool):
    collide = True


class NarrowInterleaved(InterleavedMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool.indexes[0].window = 1


_FEW = settings(max_examples=12, stateful_step_count=30, deadline=None)
TestNarrowPool = NarrowPool.TestCase
TestNarrowPool.settings = _FEW
TestNarrowPoolCollisions = NarrowPoolCollisions.TestCase
TestNarrowPoolCollisions.settings = _FEW
TestNarrowInterleaved = NarrowInterleaved.TestCase
TestNarrowInterleaved.settings = _FEW
