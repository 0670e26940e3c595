"""The `vllm` policy's host (and storage) tier (kvcore/vllm/block_tiers.py,
kvcore/vllm/tiered.py): worked examples, every write policy, a stateful test checking
the invariants after every operation, and the host tier against an independent LRU model over
page-aligned prefix keys."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvcore.contract.capabilities import LowerTiers
from kvcore.contract.policy import AdmitResult
from kvcore.contract.tiers import WRITE_POLICIES, TierConfig
from kvcore.policies import PolicyConfig
from kvcore.vllm.block_hash import NONE_HASH, ChainHasher
from kvcore.vllm.block_tiers import BlockTier
from kvcore.vllm.manager import VLLMManager
from kvcore.vllm.tiered import TieredVLLMManager
from tests.kvcore.tier_machine import (
    TieredPolicyMachine,
    serve_against_lru,
    serve_alone,
    tiered_policy,
)
from tests.kvcore.vllm_views import cached_free

_policy = partial(tiered_policy, "vllm")
_serve = serve_alone


def _fill(p, rid0: int, n: int, ps: int, blocks: int = 3) -> None:
    """Unrelated requests that push everything else out of the device pool."""
    for i in range(n):
        _serve(p, rid0 + i, 5_000 + 100 * (rid0 + i) + np.arange(blocks * ps + 1))


def test_no_tier_is_the_plain_policy() -> None:
    p = _policy(4, 16, host=0)
    assert type(p) is VLLMManager and not isinstance(p, LowerTiers)
    assert p.pool.on_evict is None


def test_bad_tier_config() -> None:
    with pytest.raises(ValueError, match="smaller than one block"):
        BlockTier("host", 3, 4)
    with pytest.raises(ValueError, match="needs a host tier"):
        _policy(4, 16, host=0, storage=64)
    with pytest.raises(ValueError, match="write policy"):
        _policy(4, 16, host=64, write="sometimes")
    with pytest.raises(ValueError, match="host_tokens > 0"):
        TieredVLLMManager(PolicyConfig(kv_tokens=64, page_size=4), TierConfig())


def test_host_hit_is_loaded_not_prefilled() -> None:
    """A prompt the device forgot comes back from the host: cached_len covers it, the new
    device blocks carry the prompt's hashes, and the host blocks stay held until the prefill
    lands."""
    ps = 4
    p = _policy(ps, pages=8, host=64 * ps)
    assert isinstance(p, TieredVLLMManager)
    prompt = np.arange(100, 100 + 5 * ps + 2)
    _serve(p, 0, prompt)
    _fill(p, 1, 3, ps, blocks=6)  # 8 device blocks: the prompt is gone from the device
    assert p.peek_prefix(prompt[:-1]) == 0
    d, h, s = p.peek_tiers(prompt[:-1])
    assert (d, h, s) == (0, 5 * ps, 0)
    res = p.admit(99, prompt, len(prompt) + 1, 2)
    assert res is not None and res.cached_len == 5 * ps and res.host_hit == 5 * ps
    assert res.storage_hit == 0
    table = p.requests[99].tables[0]
    want = p.hasher.chain(NONE_HASH, prompt[: 5 * ps])
    assert np.array_equal(p.pool.block_hash[table.blocks], want)
    assert (p.pool.block_tokens[table.blocks] == prompt[: 5 * ps].reshape(5, ps)).all()
    assert p.tier_state().host_locked == 5 * ps and len(p.tiers.inflight[99]) == 5
    p.check_invariants()
    assert p.extend([99], [len(prompt)])  # only the rest is prefilled
    p.cache_prefix(99, prompt)
    assert p.tier_state().host_locked == 0 and 99 not in p.tiers.inflight
    p.check_invariants()
    assert p.tier_state().pages_h2d == 5


def test_load_takes_what_the_device_can_give() -> None:
    """A host hit larger than the device's free blocks loads its head only."""
    ps = 4
    p = _policy(ps, pages=8, host=64 * ps, rows=4)
    prompt = np.arange(100, 100 + 7 * ps + 1)
    _serve(p, 0, prompt)
    _fill(p, 1, 2, ps, blocks=7)
    hog = 900 + np.arange(5 * ps)  # holds 5 of the 8 device blocks
    assert p.admit(50, hog, len(hog) + 1, 2) is not None and p.extend([50], [len(hog)])
    res = p.admit(51, prompt, len(prompt) + 1, 2)
    assert res is not None and res.host_hit == 3 * ps and res.cached_len == 3 * ps
    assert len(p.tiers.inflight[51]) == 3
    p.check_invariants()
    p.release(51)
    p.release(50)
    assert p.tier_state().host_locked == 0
    p.check_invariants()


def test_write_back_only_on_device_eviction() -> None:
    ps = 4
    p = _policy(ps, pages=8, host=64 * ps, write="write_back")
    prompt = np.arange(100, 100 + 5 * ps + 2)
    _serve(p, 0, prompt)
    assert p.tier_state().host_used == 0 and p.tier_state().pages_d2h == 0
    _fill(p, 1, 3, ps, blocks=6)
    assert p.tier_state().pages_d2h > 0
    res = _serve(p, 99, prompt)
    assert res.host_hit == 5 * ps


def test_selective_backs_up_after_threshold_hits() -> None:
    """write_through_selective: a block is backed up at its first reuse on the device (hashed
    once + hit once = SGLang's threshold 2), not before."""
    ps = 4
    p = _policy(ps, pages=16, host=64 * ps, write="write_through_selective")
    prompt = np.arange(100, 100 + 5 * ps + 2)
    _serve(p, 0, prompt)
    assert p.tier_state().host_used == 0
    _serve(p, 1, prompt)  # the first reuse hits 5 device blocks: backed up
    assert p.tier_state().host_used == 5 * ps
    _fill(p, 2, 4, ps, blocks=6)
    assert p.peek_prefix(prompt[:-1]) == 0
    assert _serve(p, 99, prompt).host_hit == 5 * ps


def test_storage_tier_catches_host_evictions() -> None:
    ps = 4
    p = _policy(ps, pages=8, host=6 * ps, storage=64 * ps)
    prompt = np.arange(100, 100 + 5 * ps + 2)
    _serve(p, 0, prompt)
    _fill(p, 1, 3, ps, blocks=6)  # the host (6 blocks) forgets the prompt too: storage has it
    assert p.peek_tiers(prompt[:-1]) == (0, 0, 5 * ps)
    assert p.tier_state().pages_h2s > 0
    # the prefetch gave nothing yet: no storage hit
    res = p.admit_prefetched(98, prompt, len(prompt) + 1, 2, 0)
    assert res is not None and res.storage_hit == 0 and res.cached_len == 0
    p.release(98)
    res = p.admit_prefetched(99, prompt, len(prompt) + 1, 2, 2 * ps)  # two blocks arrived
    assert res is not None and res.storage_hit == 2 * ps and res.cached_len == 2 * ps
    assert p.tier_state().pages_s2h == 2
    p.check_invariants()
    p.release(99)
    res = p.admit_prefetched(100, prompt, len(prompt) + 1, 2, 10**6)
    assert res is not None and res.cached_len == 5 * ps  # 2 blocks the last load left on
    assert res.host_hit == 0 and res.storage_hit == 3 * ps  # the device, 3 from storage
    p.check_invariants()


def test_block_tier_lru_keeps_the_chain_head() -> None:
    """A full tier evicts its least recently used blocks, and a chain stored or loaded
    together loses its tail first."""
    ps = 2
    t = BlockTier("host", 4 * ps, ps)
    toks = np.arange(8 * ps).reshape(8, ps)
    hs = ChainHasher(ps, 64).chain(NONE_HASH, toks.reshape(-1))
    pa = np.zeros(8, dtype=np.uint64)
    pa[1:] = hs[:-1]
    assert t.store(hs[:4][::-1], pa[:4][::-1], toks[:4][::-1]).written == 4  # chain 0..3, head last
    assert t.store(hs[4:5], pa[4:5], toks[4:5]).written == 1  # evicts the chain's tail (block 3)
    held = {int(h) for h in t.pool.block_hash[t.pool.is_hashed]}
    assert held == {int(h) for h in hs[[0, 1, 2, 4]]}
    assert t.store(hs[0:1], pa[0:1], toks[0:1]).written == 0  # held: only touched
    assert t.store(hs[5:7], pa[5:7], toks[5:7]).written == 2  # evicts 2, then 1 (0 was touched)
    held = {int(h) for h in t.pool.block_hash[t.pool.is_hashed]}
    assert held == {int(h) for h in hs[[0, 4, 5, 6]]}
    t.check_invariants()


# -- the stateful test -------------------------------------------------------------------------


class VLLMTierMachine(TieredPolicyMachine):
    """`vllm` with its block tiers, at page sizes 1 and 4 (tests/kvcore/tier_machine.py has
    the rules)."""

    @precondition(lambda self: self.p is None)
    @rule(write=st.sampled_from(WRITE_POLICIES), host=st.integers(1, 12),
          storage=st.integers(0, 16), ps=st.sampled_from([1, 4]))
    def build(self, write: str, host: int, storage: int, ps: int) -> None:
        """Sizes in tokens do not depend on the page size: 56 device slots, host and storage
        in units of 4 slots; page size 1 makes every token a block."""
        self.PS = ps
        p = _policy(ps, pages=56 // ps, host=host * 4, storage=storage * 4, write=write,
                    ctx=64)
        assert isinstance(p, TieredVLLMManager)
        self.p = p

    def check_admitted(self, rid: int, prompt: np.ndarray, res: AdmitResult) -> None:
        ps = self.PS
        table = self.p.requests[rid].tables[0]
        n = res.cached_len // ps  # device hit + loaded blocks carry the prompt's hashes
        want = self.p.hasher.chain(NONE_HASH, prompt[: n * ps])
        assert np.array_equal(self.p.pool.block_hash[table.blocks[:n]], want)

    def check_tiers(self) -> None:
        p, state = self.p, self.p.tier_state()
        host = p.tiers.host.pool
        free = (host.get_num_free_blocks() - host.num_cached_free) * self.PS
        assert state.host_used + free == state.host_capacity
        assert set(p.tiers.inflight) <= set(self.reqs)  # loads only for live requests
        # a load lands when its request's prefill completes
        assert not any(q["cached"] for r, q in self.reqs.items() if r in p.tiers.inflight)
        assert state.host_locked == sum(len(b) for b in p.tiers.inflight.values()) * self.PS
        if p.tiers.storage is not None:
            assert p.tiers.storage.locked == 0

TestVLLMTierMachine = VLLMTierMachine.TestCase
TestVLLMTierMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow,
                                                               HealthCheck.filter_too_much])


# -- the host tier against an independent LRU model ------------------------------------------


@pytest.mark.parametrize("ps,host_pages", [(1, 600), (4, 150), (16, 30)])
def test_host_tier_equals_an_lru_model(ps: int, host_pages: int) -> None:
    """Requests one at a time, write_through: the host holds exactly what an LRU over
    page-aligned prefixes with its capacity holds (PageLRU), so its hit past the device's is
    the model's, request by request."""
    p = _policy(ps, pages=max(300 // ps, 4), host=host_pages * ps, rows=2, ctx=1024)
    assert isinstance(p, TieredVLLMManager)

    def host_hit(key: np.ndarray) -> int:
        n = len(key) // ps
        return len(p.tiers.host.lookup(p.hasher.chain(NONE_HASH, key[: n * ps]), key, 0)) * ps

    serve_against_lru(p, ps, host_pages, host_hit=host_hit, device_hit=p.peek_prefix)


@pytest.mark.parametrize("write", WRITE_POLICIES)
def test_every_write_policy_serves_reuse(write: str) -> None:
    """A reuse-heavy stream (four prefixes, each reused after the device forgot it): every
    write policy gives host hits, and what it wrote is what the host holds or evicted."""
    ps = 4
    p = _policy(ps, pages=12, host=200 * ps, write=write)
    rng = np.random.default_rng(1)
    bases = [rng.integers(0, 40, size=8 * ps) for _ in range(4)]
    host = 0
    for rid in range(40):
        prompt = np.concatenate([bases[(rid // 2) % 4], 600 + rid * 50 + np.arange(3)])
        host += _serve(p, rid, prompt).host_hit
    s = p.tier_state()
    assert host > 0 and s.pages_h2d * ps == host
    assert s.host_used == s.pages_d2h * ps  # nothing evicted from this large host


@pytest.mark.parametrize("seed", range(4))
def test_batched_write_through_equals_eager(seed: int) -> None:
    """write_through stores wait for the next host read and go as one batch: with several
    requests interleaved, the host ends with the same blocks in the same LRU order as a twin
    policy that reads the host (and so stores) after every call, every admission is the
    same, and it writes no more."""
    ps = 4
    rng = np.random.default_rng(seed)
    bases = [rng.integers(0, 30, size=24 * ps) for _ in range(5)]
    lazy, eager = (_policy(ps, pages=40, host=48 * ps, rows=6, ctx=512) for _ in range(2))
    live: dict[int, list] = {}
    for step in range(300):
        op = int(rng.integers(0, 4))
        if op == 0 and len(live) < 4:
            rid = step
            b = bases[int(rng.integers(0, 5))]
            prompt = np.concatenate([b[: int(rng.integers(0, len(b)))],
                                     900 + rng.integers(0, 50, size=int(rng.integers(1, 20)))])
            out = int(rng.integers(1, 6))
            res = [p.admit(rid, prompt, len(prompt) + out - 1, out) for p in (lazy, eager)]
            assert (res[0] is None) == (res[1] is None)
            if res[0] is not None:
                assert res[0] == res[1]
                live[rid] = [prompt, out, False, 0]
        elif op == 1 and live:
            rid = int(rng.choice(sorted(live)))
            prompt, out, cached, done = live[rid]
            ok = [p.extend([rid], [len(prompt)]) if not cached else p.decode([rid])
                  for p in (lazy, eager)]
            assert ok[0] == ok[1]
            if not ok[0]:
                for p in (lazy, eager):
                    p.release(rid)
                del live[rid]
                continue
            if not cached:
                for p in (lazy, eager):
                    p.cache_prefix(rid, prompt)
                live[rid][2] = True
            else:
                live[rid][3] += 1
        elif op == 2 and live:
            rid = int(rng.choice(sorted(live)))
            prompt, out, cached, done = live[rid]
            if cached:
                ids = np.concatenate([prompt, 7 + np.arange(done + 1)])
                for p in (lazy, eager):
                    p.finish(rid, ids[: len(prompt) + done])
                del live[rid]
        eager.tier_state()  # a host read after every call: every store made at once
    for p in (lazy, eager):
        p.check_invariants()
    order = [p.tiers.host.pool.block_hash[cached_free(p.tiers.host.pool)].tolist()
             for p in (lazy, eager)]
    assert order[0] == order[1] and len(order[0]) > 0
    a, b = lazy.tier_state(), eager.tier_state()
    # the batch skips writing what a later store of the same batch would evict again
    assert replace(a, pages_d2h=0) == replace(b, pages_d2h=0) and a.pages_d2h <= b.pages_d2h
