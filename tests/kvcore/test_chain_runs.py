"""The chain index's runs across interleaved chunks, against the per-block model of vLLM's
pool (tests/kvcore/test_chain_index.py's `RefPool` and machine).

A request's next prefill chunk extends the run (segment) holding its previous block even
when other requests cached blocks in between (`after`, kvcore/vllm/chain_index.py), so a run's
blocks may be younger than those of runs made after it: a lookup must rank holders by
their generations, not by their runs. The machine here defers second chunks and caches them
later, after other requests' cachings (often the same content again, as duplicates), and
checks every hit, pop and free against the model.
"""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.kvcore.test_chain_index import SEQS, PoolMachine


class InterleavedMachine(PoolMachine):
    """`PoolMachine` whose requests may leave their second chunk for later."""

    def __init__(self) -> None:
        super().__init__()
        # a live request's chunk not cached yet: its table (the object in `live`), the
        # blocks, the chain, the ids and the chain position of its first block
        self.pending: list[tuple[list[int], np.ndarray, np.ndarray, np.ndarray, int]] = []

    def _cache_after(self, table: list[int], new: np.ndarray, hashes: np.ndarray,
                     ids: np.ndarray, k: int) -> None:
        self._cache(new, hashes, ids, k, table[k - 1] if k else 0)

    @rule(s=st.integers(0, len(SEQS) - 1), split=st.integers(1, 4), use_hit=st.booleans())
    def start_request(self, s: int, split: int, use_hit: bool) -> None:
        """Allocate a prompt's blocks, cache the first chunk now and the rest later."""
        taken = self._take_blocks(s, use_hit)
        if taken is None:
            return
        ids, hashes, hit, new = taken
        k, table = len(hit), hit + new.tolist()
        cut = min(split, len(new))
        if cut:
            self._cache_after(table, new[:cut], hashes, ids, k)
        if cut < len(new):
            self.pending.append((table, new[cut:], hashes, ids, k + cut))
        self.live.append(table)

    @precondition(lambda self: self.pending)
    @rule(i=st.integers(0, 100))
    def next_chunk(self, i: int) -> None:
        table, new, hashes, ids, k = self.pending.pop(i % len(self.pending))
        self._cache_after(table, new, hashes, ids, k)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), reverse=st.booleans())
    def finish(self, i: int, reverse: bool) -> None:
        """As the base rule; a chunk never cached goes back unhashed (an aborted prefill)."""
        table = self.live[i % len(self.live)]
        self.pending = [p for p in self.pending if p[0] is not table]
        super().finish(i, reverse)


TestInterleaved = InterleavedMachine.TestCase
TestInterleaved.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
