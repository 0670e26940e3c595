"""Contiguous reservation policies (Orca Max / Pow2 / Oracle) over every placement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

import kvcore.contiguous.policy  # noqa: F401 - registers the policies
from kvcore.contiguous.policy import next_pow2
from kvcore.contract.capabilities import PrefixCache
from kvcore.policies import PolicyConfig, make_policy, policy_help
from tests.kvcore.draws import draw_extend

POLICIES = ["contiguous-max", "contiguous-pow2", "contiguous-oracle"]


def make(name: str, kv: int, **kw: object):
    return make_policy(name, PolicyConfig(kv_tokens=kv, **kw))


def prompt(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def decode_room(pol, rid: int) -> int:
    """Tokens request `rid` can still decode inside its reservation."""
    req = pol._reqs[rid]
    return req.reservation - req.written


def test_registered_with_when_lines() -> None:
    help_ = policy_help()
    for name in POLICIES:
        assert help_.get(name)


def test_unknown_placement_lists_known() -> None:
    with pytest.raises(ValueError, match="first-fit, best-fit, buddy"):
        make("contiguous-max", 64, placement="next-fit", max_context_len=16)


def test_buddy_needs_power_of_two_max_context() -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        make("contiguous-pow2", 4096, placement="buddy", max_context_len=1000)


def test_negative_lengths_name_the_argument() -> None:
    pol = make("contiguous-oracle", 64, max_context_len=32)
    with pytest.raises(ValueError, match="final_len"):
        pol.admit(1, prompt(4), -2, 8)
    with pytest.raises(ValueError, match="max_new_tokens"):
        pol.admit(1, prompt(4), 6, -1)
    with pytest.raises(ValueError, match="final_len"):
        pol.reservation(4, 3, 0)  # L < prompt
    with pytest.raises(ValueError, match="prompt_len"):
        pol.reservation(-1, 3, 0)
    with pytest.raises(ValueError, match="head_reservation"):
        pol.breakdown(-5)


def test_reservations_max_pow2_oracle() -> None:
    kw = {"max_context_len": 128}
    # true output 25 (L = prompt + 24) reserves 32 output slots under pow2
    assert make("contiguous-pow2", 1024, **kw).reservation(10, 34, 100) == 42
    assert make("contiguous-max", 1024, **kw).reservation(10, 34, 100) == 128
    assert make("contiguous-oracle", 1024, **kw).reservation(10, 34, 100) == 34
    # pow2 is capped at the maximum context length
    assert make("contiguous-pow2", 1024, **kw).reservation(60, 127, 100) == 128
    # buddy rounds the block to a power of two
    assert make("contiguous-oracle", 1024, placement="buddy", **kw).reservation(10, 34, 0) == 64
    assert [next_pow2(n) for n in (0, 1, 2, 3, 25, 32, 33)] == [1, 1, 2, 4, 32, 32, 64]


def test_seed_example_over_reservation() -> None:
    # a request reserving 8 and using 5
    pol = make("contiguous-max", 16, max_context_len=8)
    assert pol.admit(7, prompt(3), 5, 3) is not None
    pol.extend([7], [3])
    pol.decode([7])
    pol.decode([7])
    bd = pol.breakdown(8)
    assert (bd.token_states, bd.reserved, bd.over_reservation, bd.rounding) == (5, 0, 3, 0)
    assert bd.free == 8 and bd.external == 0
    pol.check_invariants()


def test_seed_example_page_rounding() -> None:
    # page size 4 and L = 6: the reservation of 6 takes two pages, 2 slots of rounding
    pol = make("contiguous-oracle", 32, page_size=4, max_context_len=16)
    pol.admit(1, prompt(4), 6, 3)
    pol.extend([1], [5])
    bd = pol.breakdown(4)
    assert (bd.token_states, bd.reserved, bd.over_reservation, bd.rounding) == (5, 1, 0, 2)
    pol.check_invariants()


def test_extend_decode_write_page_table_after_dummy_page() -> None:
    pol = make("contiguous-oracle", 64, page_size=2, max_context_len=32)
    r1 = pol.admit(1, prompt(5), 9, 5)
    r2 = pol.admit(2, prompt(3), 4, 2)
    assert r1.cached_len == 0 and not isinstance(pol, PrefixCache)  # nothing to peek at
    assert pol.extend([1, 2], [5, 3])
    assert pol.decode([1, 2])
    table = pol.req_to_token_pool.req_to_token
    assert table[r1.row, :6].tolist() == list(range(2, 8))  # offset 0 is slot page_size
    assert table[r2.row, :4].tolist() == list(range(12, 16))  # after the 10 slots of request 1
    assert decode_room(pol, 2) == 0
    with pytest.raises(ValueError, match="beyond its reservation"):
        pol.decode([2])
    with pytest.raises(ValueError, match="beyond its reservation"):
        pol.extend([1], [11])
    assert pol.written(1) == 6 and pol.page_table_entries() == 3 + 2
    pol.check_invariants()


def test_orca_max_batch_of_seven_on_opt13b() -> None:
    # Fig. 13: Orca (Max) batches floor(15.7K / 2048) = 7 requests
    pol = make("contiguous-max", 15_728, placement="buddy", max_context_len=2048)
    admitted = [pol.admit(i, prompt(100), 400, 301) for i in range(8)]
    assert sum(a is not None for a in admitted) == 7
    bd = pol.breakdown(2048)
    assert bd.external == 15_728 - 7 * 2048 and bd.free == 0
    assert bd.failed_allocs == 0  # 1392 free slots: not enough, so not a fragmentation failure
    pol.check_invariants()


def test_failed_alloc_counted_when_free_memory_suffices() -> None:
    pol = make("contiguous-oracle", 16, max_context_len=16)
    for rid, n in enumerate((4, 2, 4, 2, 4)):
        pol.admit(rid, prompt(n), n, 1)
    pol.release(1)
    pol.finish(3, prompt(2))
    bd = pol.breakdown(4)
    assert (bd.external, bd.free, bd.largest_free_hole) == (4, 0, 2)
    assert bd.frag_index == 0.5
    assert pol.admit(9, prompt(4), 4, 1) is None
    assert pol.breakdown(4).failed_allocs == 1
    assert pol.admit(10, prompt(4), 5, 2) is None  # needs 5 > 4 free: not counted
    assert pol.breakdown(2).failed_allocs == 1
    assert pol.breakdown(2).external == 0
    pol.check_invariants()


def test_admit_refuses_without_rows_and_rejects_duplicates() -> None:
    pol = make("contiguous-oracle", 64, max_context_len=8, max_requests=1)
    assert pol.admit(1, prompt(2), 3, 2) is not None
    with pytest.raises(ValueError, match="already admitted"):
        pol.admit(1, prompt(2), 3, 2)
    assert pol.admit(2, prompt(2), 3, 2) is None
    assert pol.breakdown(8).failed_allocs == 0
    with pytest.raises(ValueError, match="not admitted"):
        pol.finish(5, prompt(1))


class ContiguousMachine(RuleBasedStateMachine):
    """Random admit/extend/decode/finish/release with invariants after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.pol = None
        self.lens: dict[int, tuple[int, int]] = {}  # rid -> (prompt, L)
        self.next_rid = 0

    @initialize(
        name=st.sampled_from(POLICIES),
        placement=st.sampled_from(["first-fit", "best-fit", "buddy"]),
        page_size=st.sampled_from([1, 2, 4]),
        kv=st.integers(16, 160),
        rows=st.integers(1, 6),
    )
    def create(self, name: str, placement: str, page_size: int, kv: int, rows: int) -> None:
        self.pol = make(
            name,
            kv,
            page_size=page_size,
            max_context_len=32,
            max_requests=rows,
            placement=placement,
        )

    @rule(p=st.integers(1, 20), out=st.integers(1, 12))
    def admit(self, p: int, out: int) -> None:
        rid = self.next_rid
        self.next_rid += 1
        final = p + out - 1
        before = self.pol.breakdown(32).failed_allocs
        fits = self.pol.placement.largest_free_hole() >= self.pol.reservation(p, final, out)
        res = self.pol.admit(rid, prompt(p), final, out)
        event(f"admitted={res is not None}")
        if res is not None:
            assert res.cached_len == 0
            self.lens[rid] = (p, final)
        else:
            rows_free = self.pol.req_to_token_pool.available_size() > 0
            assert not (fits and rows_free)
            assert self.pol.breakdown(32).failed_allocs - before <= 1

    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        if not self.lens:
            return
        rids, targets = draw_extend(data, self.pol.written, {r: v[0] for r, v in self.lens.items()})
        assert self.pol.extend(rids, targets)
        for rid, t in zip(rids, targets, strict=True):
            assert self.pol.written(rid) == t

    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        if not self.lens:
            return
        ready = [r for r, (_, fin) in self.lens.items() if self.pol.written(r) < fin]
        if not ready:
            return
        rids = data.draw(st.lists(st.sampled_from(sorted(ready)), unique=True, min_size=1))
        before = [self.pol.written(r) for r in rids]
        assert all(decode_room(self.pol, r) >= 1 for r in rids)
        assert self.pol.decode(rids)
        assert [self.pol.written(r) for r in rids] == [w + 1 for w in before]

    @rule(data=st.data(), preempt=st.booleans())
    def end(self, data: st.DataObject, preempt: bool) -> None:
        if not self.lens:
            return
        rid = data.draw(st.sampled_from(sorted(self.lens)))
        free_before = self.pol.available_tokens()
        block = self.pol.placement.size_of(self.pol._reqs[rid].start - self.pol.page_size)
        if preempt:
            self.pol.release(rid)
        else:
            self.pol.finish(rid, prompt(self.pol.written(rid)))
        del self.lens[rid]
        assert self.pol.available_tokens() == free_before + block

    @invariant()
    def invariants(self) -> None:
        if self.pol is None:
            return
        self.pol.check_invariants()
        for head in (0, 1, 7, 32):
            bd = self.pol.breakdown(head)
            bd.check_invariants()
            assert bd.cached == 0
            assert bd.token_states == sum(self.pol.written(r) for r in self.lens)
        if self.pol.name == "contiguous-oracle":
            assert self.pol.breakdown(32).over_reservation == 0
        table = self.pol.req_to_token_pool.req_to_token
        assert int(table[0].abs().sum()) == 0  # the dummy row is never written
        assert table.dtype == torch.int32


TestContiguousMachine = ContiguousMachine.TestCase
TestContiguousMachine.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)



@pytest.mark.parametrize("placement", ["first-fit", "buddy"])
@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=6),
       heads=st.lists(st.integers(0, 600), min_size=1, max_size=8))
def test_breakdown_keeps_the_head_block_only_for_the_same_head(placement, sizes, heads):
    """The breakdown keeps the last head reservation's block: asked about heads in any order
    (repeats included), each answer equals one computed afresh. About 0.3 s."""
    pol = make("contiguous-oracle", 2048, placement=placement, max_context_len=1024)
    for rid, n in enumerate(sizes):
        if pol.admit(rid, prompt(n), n + 1, 1) is None:
            break
    for h in heads:
        got = pol.breakdown(h)
        pol._head_block = (-1, 0)  # forget it: the fresh answer
        assert got == pol.breakdown(h)
