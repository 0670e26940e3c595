"""The `vllm` manager's page-1 shortcuts.

* A lookup that knows no block was evicted since its last answer (`BlockPool.longest_cache_hit`
  with `known_evicted`) skips re-reading the answer's generations: test_chain_index.py's pool
  machine, with and without colliding hashes, passing the eviction count it saw, still agrees
  with the per-block model of vLLM's pool and with a fresh lookup after every step.
* At page size 1 a request's block table is its page-table row (kvcore/vllm/block_table.py
  `RowBlockTables`): after random extends, decodes, stretches and releases the table, the rows
  and the pool match what the manager with separate block tables mirrored into the page table
  (`TokenSlotTable`, what a page table off the host gets) computes.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.policies import PolicyConfig, make_policy
from kvcore.vllm.block_table import RowBlockTable, TokenSlotTable
from kvcore.vllm.manager import VLLMManager
from tests.kvcore.test_chain_index import SEQS, PoolMachine
from tests.kvcore.vllm_views import blocks, cached_free


class EvictionAwarePool(PoolMachine):
    """Lookups pass the eviction count of their last answer, as the policy's memo does."""

    def _lookup(self, s: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
        ids = np.array(SEQS[s], dtype=np.int64)
        hashes = self._hashes(ids)
        empty = np.zeros(0, np.int64)
        known, gens, at, evicted = self.seen_ev.get(s, (empty, empty, -1, -1))
        pool = self.pool
        got = pool.longest_cache_hit(hashes, ids, known, gens, at, evicted)
        if got is not known:
            gens = pool.indexes[0].gen[got]
        self.seen_ev[s] = (got, gens, pool.indexes[0].newest if len(got) < len(hashes) else -1,
                           pool.evicted_blocks)
        assert np.array_equal(gens, pool.indexes[0].gen[got])  # the kept gens are the current
        _, _, want = super()._lookup(s)  # the model's answer (and the plain lookups' checks)
        assert got.tolist() == want
        return ids, hashes, want

    def __init__(self) -> None:
        super().__init__()
        self.seen_ev: dict[int, tuple[np.ndarray, np.ndarray, int, int]] = {}


class EvictionAwareCollisions(EvictionAwarePool):
    collide = True


_FEW = settings(max_examples=10, stateful_step_count=30, deadline=None)
TestEvictionAwarePool = EvictionAwarePool.TestCase
TestEvictionAwarePool.settings = _FEW
TestEvictionAwareCollisions = EvictionAwareCollisions.TestCase
TestEvictionAwareCollisions.settings = _FEW


def _policy(device_rows: bool) -> VLLMManager:
    pol = make_policy("vllm", PolicyConfig(kv_tokens=24, page_size=1, max_context_len=40,
                                           max_requests=4))
    assert isinstance(pol, VLLMManager)
    if device_rows:  # what a page table off the host gets: block tables of their own
        assert pol.req_to_token_pool is not None
        pol.page_table = TokenSlotTable(pol.req_to_token_pool, 1)
    return pol


_PROMPTS = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 9], [7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "extend", "extend", "decode", "steps", "steps",
                                           "finish"]),
                          st.integers(0, 3), st.integers(1, 4)), min_size=10, max_size=40))
def test_row_tables_match_own_tables(ops: list[tuple[str, int, int]]) -> None:
    rows, own = _policy(False), _policy(True)
    live: dict[int, int] = {}  # rid -> prompt length
    for op, rid, k in ops:
        outs = []
        for pol in (rows, own):
            if op == "admit" and rid not in live:
                ids = np.array(_PROMPTS[rid], dtype=np.int64)
                outs.append(pol.admit(rid, ids, len(ids) + 6, 6))
            elif op == "extend" and rid in live:
                t = min(pol.written(rid) + 3 * k, live[rid])
                outs.append(pol.extend([rid], [t]) if t > pol.written(rid) else None)
            elif op in ("decode", "steps") and rid in live and \
                    pol.written(rid) >= live[rid] and pol.written(rid) + k <= live[rid] + 6:
                if op == "decode" or k == 1:
                    outs.append(pol.decode([rid]))
                elif pol.decode_cost([rid], k) <= pol.available_tokens():
                    outs.append(pol.decode_steps([rid], k, 0).tolist())
            elif op == "finish" and rid in live:
                ids = np.array(_PROMPTS[rid] + [50 + rid] * 6, dtype=np.int64)
                pol.finish(rid, ids[: pol.written(rid)])
        assert len(outs) in (0, 2) and (not outs or outs[0] == outs[1])
        if op == "admit" and rid not in live and outs and outs[0] is not None:
            live[rid] = len(_PROMPTS[rid])
        elif op == "finish":
            live.pop(rid, None)
        for pol in (rows, own):
            pol.check_invariants()
        for r in live:  # (check_invariants compared each row with its table)
            assert isinstance(rows.requests[r].tables[0], RowBlockTable)
            assert blocks(rows, r) == blocks(own, r)
            assert rows.requests[r].row == own.requests[r].row
        assert cached_free(rows.pool) == cached_free(own.pool)
