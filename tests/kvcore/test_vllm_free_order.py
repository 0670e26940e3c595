"""The order in which the `vllm` manager and its block tiers free blocks: it decides what is
evicted first, as vLLM's free queue does (a pop takes the head, a free joins the tail).

* A released request's blocks go back group by group in allocation order, reversed as a whole
  (vLLM's `pop_blocks_for_free`, freed reversed): the last group's last block first, the
  first group's first block last, so the chain's head is the last to be evicted.
* Blocks leaving a sliding window, and a state group's superseded states, are freed from the
  last one no longer needed down (vLLM's `remove_skipped_blocks`), within one call per
  request; a decode stretch frees in stepping's order.
* A lower tier keeps a stored or loaded chain with its tail least recent: a load that lands
  and every write policy's store leave the chain's head most recent.

Each test reads the free queue (or the tier's LRU) itself, so a one-line change of any of
these orders fails it (benchmarks/mutations.py lists them)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from kvcore.contract.tiers import WRITE_POLICIES
from kvcore.model.layers import HybridLayout, LayerGroup
from kvcore.vllm.block_hash import NONE_HASH
from kvcore.vllm.tiered import TieredVLLMManager
from tests.kvcore.test_vllm_hybrid import FULL1, SWA1, toy
from tests.kvcore.tier_machine import serve_alone, tiered_policy
from tests.kvcore.vllm_views import cached_free, tables


def queue(p) -> list[int]:  # type: ignore[no-untyped-def]
    """The pool's free queue, head (next popped) first."""
    return p.pool.peek_free(p.pool.get_num_free_blocks()).tolist()


@pytest.mark.parametrize("mode", ["align", "all"])
def test_release_frees_every_group_in_reverse_allocation_order(mode: str) -> None:
    """Full, sliding and linear groups: the released request's held blocks join the queue's
    tail as the reverse of (full table, sliding table, state table), nulls left out."""
    p = toy(mode)
    assert p.admit(0, np.arange(60), 70, 11) is not None and p.extend([0], [60])
    for _ in range(5):
        assert p.decode([0])
    held = [b for t in tables(p, 0) for b in t if b]
    assert len(set(held)) == len(held) >= 9
    p.release(0)
    assert queue(p)[-len(held):] == held[::-1]
    p.check_invariants()


def test_a_released_chain_loses_its_tail_first() -> None:
    """Full attention beside a window of 33 tokens (a hit needs the window's last 2 blocks,
    found from the right). Request A writes 65 tokens: 5 blocks per group, 4 of them cached.
    Released, they queue behind the 2 never used blocks as s4 s3 s2 s1 s0 f4 f3 f2 f1 f0. A
    32-token request then pops 4 blocks: the 2 unused, A's partial s4 and s3, the window's
    chain tail. A's prompt still hits 48 tokens (the full chain whole, the window's blocks
    1-2 its last two); freeing forward would have evicted the full chain's head (a hit of
    0), and each group forward the window's head (a hit of 64, the window's tail kept)."""
    long_swa = LayerGroup("sliding", 1, kv_heads=1, head_dim=8, window=33)
    p = toy(layout=HybridLayout((FULL1, long_swa)), blocks=12)
    a = np.arange(65)
    assert p.admit(0, a, 65, 1) is not None and p.extend([0], [65])
    full, swa = tables(p, 0)
    p.finish(0, a)
    assert queue(p)[2:] == (full + swa)[::-1]
    assert p.peek_prefix(a[:-1]) == 64
    assert p.admit(1, 9000 + np.arange(32), 32, 1) is not None and p.extend([1], [32])
    assert p.pool.evicted_blocks == 1 and swa[3] in tables(p, 1)[1]  # taken, evicted
    assert p.peek_prefix(a[:-1]) == 48
    p.check_invariants()


def test_blocks_leaving_the_window_are_freed_from_the_last_down() -> None:
    """A 100-token prefill holds sliding positions 0-6; the next chunk's skip point (100 -
    32 + 1 = 69 tokens: 4 blocks) frees positions 3, 2, 1, 0 in that order, in one call."""
    p = toy(layout=HybridLayout((FULL1, SWA1)), blocks=40)
    assert p.admit(0, np.arange(120), 120, 1) is not None and p.extend([0], [100])
    swa = tables(p, 0)[1]
    assert all(swa)
    assert p.extend([0], [101])
    assert queue(p)[-4:] == [swa[3], swa[2], swa[1], swa[0]]
    p.check_invariants()


def test_superseded_states_are_freed_from_the_last_down() -> None:
    """Mode all keeps a state at every boundary: an 80-token chunk leaves states at positions
    0-4. The next chunk frees, in one call, the window's blocks before 80 - 31 = 49 tokens
    (positions 2, 1, 0), then every state before 79 tokens (positions 3, 2, 1, 0; the running
    one at 4 stays), each group's from the last down."""
    p = toy("all", blocks=60)
    assert p.admit(0, np.arange(200), 200, 1) is not None and p.extend([0], [80])
    _, swa, state = tables(p, 0)
    assert all(swa) and all(state)
    assert p.extend([0], [81])
    assert queue(p)[-7:] == [swa[2], swa[1], swa[0], state[3], state[2], state[1], state[0]]
    assert tables(p, 0)[2][:5] == [0, 0, 0, 0, state[4]]
    p.check_invariants()


def test_a_stretch_frees_in_stepping_order() -> None:
    """Decode steps after a long prefill: the first step frees the window's old blocks from
    the last down, later steps one each; n steps at once leave the free queue as n single
    steps do."""
    p = toy(layout=HybridLayout((FULL1, SWA1)), blocks=40)
    assert p.admit(0, np.arange(100), 140, 41) is not None and p.extend([0], [100])
    twin = copy.deepcopy(p)
    assert p.decode_cost([0], 30) <= p.available_tokens()
    p.decode_steps([0], 30, 0)
    for _ in range(30):
        assert twin.decode([0])
    assert queue(p) == queue(twin)
    p.check_invariants()


# -- the block tiers ------------------------------------------------------------------------


def host_order(p: TieredVLLMManager) -> list[int]:
    """The host's cached chain positions (by hash), least recent first."""
    host = p.tiers.host.pool
    return host.block_hash[cached_free(host)].tolist()


@pytest.mark.parametrize("write", WRITE_POLICIES)
def test_a_stored_chain_keeps_its_head_most_recent(write: str) -> None:
    """Whatever the write policy, the host holds a served prompt's chain tail first (least
    recent), head last: write_through stores it at the prefill, write_back takes the device's
    evictions (tail first), write_through_selective backs up the blocks a second request
    reused."""
    ps = 4
    p = tiered_policy("vllm", ps, pages=8, host=64 * ps, write=write)
    assert isinstance(p, TieredVLLMManager)
    prompt = np.arange(100, 100 + 5 * ps + 1)
    chain = p.hasher.chain(NONE_HASH, prompt[: 5 * ps]).tolist()
    serve_alone(p, 0, prompt)
    if write == "write_through_selective":
        serve_alone(p, 1, prompt)
    if write == "write_back":  # unrelated requests push the prompt off the device
        for i in range(3):
            serve_alone(p, 2 + i, 5000 + 100 * i + np.arange(6 * ps + 1))
    stored = [h for h in host_order(p) if h in chain]
    assert len(stored) == 5
    assert stored == chain[::-1]


def test_a_landed_load_leaves_the_chain_tail_least_recent() -> None:
    """A host hit loaded into the device: its host blocks are held until the prefill lands,
    then go back to the host's LRU reversed, the chain's head most recent."""
    ps = 4
    p = tiered_policy("vllm", ps, pages=8, host=64 * ps, write="write_back")
    assert isinstance(p, TieredVLLMManager)
    prompt = np.arange(100, 100 + 5 * ps + 2)
    chain = p.hasher.chain(NONE_HASH, prompt[: 5 * ps]).tolist()
    serve_alone(p, 0, prompt)
    for i in range(3):  # evict the prompt from the device into the host
        serve_alone(p, 1 + i, 5000 + 100 * i + np.arange(6 * ps + 1))
    other = np.arange(7000, 7000 + 2 * ps + 1)
    res = p.admit(9, prompt, len(prompt) + 1, 2)
    assert res is not None and res.host_hit == 5 * ps
    serve_alone(p, 10, other)  # stored after the load began: more recent than it
    assert p.extend([9], [len(prompt)])
    p.cache_prefix(9, prompt)  # the load lands
    assert [h for h in host_order(p) if h in chain] == chain[::-1]
    assert host_order(p)[-5:] == chain[::-1]  # and it is the most recent of all
    p.release(9)
    p.check_invariants()
