"""Test helpers shared by both policies with lower KV tiers: a small tiered policy, one request
served alone, an independent LRU model of the host tier and a run against it, and the
stateful test (`paged` with HiCache's tiers,
`vllm` with its block tiers): random requests over three shared prompt bases are admitted
(with a random storage allowance), prefilled in chunks, decoded, finished or released, and
every invariant is checked after every step. A subclass builds its policy (`build` rule) and
adds what its own structures promise (`check_admitted`, `check_tiers`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvcore.contract.capabilities import LowerTiers
from kvcore.contract.policy import AdmitResult, KVPolicy
from kvcore.policies import PolicyConfig, make_policy


def tiered_policy(name: str, ps: int, pages: int, host: int, storage: int = 0,
                  write: str = "write_through", rows: int = 4, ctx: int = 256) -> KVPolicy:
    """Policy `name` with `pages` device pages and host / storage tiers of these slots."""
    return make_policy(name, PolicyConfig(
        kv_tokens=pages * ps, page_size=ps, max_context_len=ctx, max_requests=rows,
        host_tokens=host, storage_tokens=storage, hicache_write_policy=write))


def serve_alone(p: Any, rid: int, prompt: np.ndarray, out: int = 2,
                allowance: int = 0) -> AdmitResult:
    """One request alone: admit (loading at most `allowance` tokens from storage), prefill,
    cache, decode, finish (invariants checked after the prefill and at the end). Returns its
    AdmitResult."""
    res = (p.admit_prefetched(rid, prompt, len(prompt) + out - 1, out, allowance)
           if isinstance(p, LowerTiers) else p.admit(rid, prompt, len(prompt) + out - 1, out))
    assert res is not None
    assert p.extend([rid], [len(prompt)])
    p.cache_prefix(rid, prompt)
    p.check_invariants()
    ids = np.concatenate([prompt, 10_000 + rid * 10 + np.arange(out)])
    for _ in range(out - 1):
        assert p.decode([rid])
    p.finish(rid, ids[: len(prompt) + out - 1])
    p.check_invariants()
    return res


class PageLRU:
    """An LRU over page-aligned prefix keys (key i = the first (i+1) pages), `capacity` pages.
    Touching a path makes its shallowest page the most recent, so that among pages touched
    together the deepest goes first (a prefix never outlives its extension's parent)."""

    def __init__(self, capacity: int, ps: int) -> None:
        self.capacity, self.ps = capacity, ps
        self.lru: OrderedDict[bytes, None] = OrderedDict()

    def keys(self, ids: np.ndarray) -> list[bytes]:
        n = len(ids) // self.ps
        return [ids[: (i + 1) * self.ps].tobytes() for i in range(n)]

    def hit(self, ids: np.ndarray) -> int:
        k = 0
        for key in self.keys(ids):
            if key not in self.lru:
                break
            k += 1
        return k * self.ps

    def access(self, ids: np.ndarray, add: bool) -> None:
        keys = self.keys(ids)
        if not add:
            keys = keys[: self.hit(ids) // self.ps]
        for key in reversed(keys):
            self.lru[key] = None
            self.lru.move_to_end(key)
        while len(self.lru) > self.capacity:
            self.lru.popitem(last=False)


def serve_against_lru(p: Any, ps: int, host_pages: int, host_hit: Callable[[np.ndarray], int],
                      device_hit: Callable[[np.ndarray], int]) -> None:
    """120 requests over 12 shared bases (zipf), one at a time with write_through: before
    each, the host holds what the model holds (`host_hit` of the prefill key); the request's
    host hit is the model's hit past the device's (`device_hit`)."""
    rng = np.random.default_rng(ps)
    bases = [rng.integers(0, 50, size=300) for _ in range(12)]
    model = PageLRU(host_pages, ps)
    total = host = 0
    for rid in range(120):
        b = bases[int(rng.zipf(1.5)) % len(bases)]
        share = int(rng.integers(0, 200))
        prompt = np.concatenate([b[:share], 100 + rng.integers(0, 1000, size=int(
            rng.integers(1, 60)))])
        key = prompt[:-1]
        want = model.hit(key)
        out = int(rng.integers(1, 5))
        assert host_hit(key) == want  # before: the host holds what the model does
        device = device_hit(key)
        res = serve_alone(p, rid, prompt, out=out)
        assert res.host_hit == max(want - device, 0), f"request {rid}"
        assert res.cached_len == max(want, device)
        model.access(key, add=False)  # admission's match
        model.access(prompt, add=True)  # cache_prefix's write_through
        written = np.concatenate([prompt, 10_000 + rid * 10 + np.arange(out)])
        model.access(written[: len(prompt) + out - 1], add=True)  # finish's
        total += res.cached_len
        host += res.host_hit
    assert host > 0 and total > host  # both tiers served something


class TieredPolicyMachine(RuleBasedStateMachine):
    PS = 4

    def __init__(self) -> None:
        super().__init__()
        self.p: Any = None
        self.reqs: dict[int, dict] = {}
        rng = np.random.default_rng(0)
        self.bases = [rng.integers(0, 3, size=32) for _ in range(3)]
        self.next_id = 0

    # -- what a subclass adds ------------------------------------------------------------------
    def check_admitted(self, rid: int, prompt: np.ndarray, res: AdmitResult) -> None:
        """Checks on an admission's result beyond the common ones."""

    def check_tiers(self) -> None:
        """Checks on the tiers after every step, beyond the policy's own invariants."""

    # -- rules ---------------------------------------------------------------------------------
    @precondition(lambda self: self.p is not None and len(self.reqs) < 4)
    @rule(base=st.integers(0, 2), share=st.integers(0, 32), tail=st.integers(1, 9),
          out=st.integers(1, 6), allowance=st.integers(0, 40))
    def admit(self, base: int, share: int, tail: int, out: int, allowance: int) -> None:
        rid = self.next_id
        self.next_id += 1
        prompt = np.concatenate([self.bases[base][:share], 50 + rid * 16 + np.arange(tail)])
        res = self.p.admit_prefetched(rid, prompt, len(prompt) + out - 1, out, allowance)
        if res is None:
            return
        assert res.cached_len % self.PS == 0 and res.cached_len < len(prompt)
        assert res.host_hit + res.storage_hit <= res.cached_len
        self.check_admitted(rid, prompt, res)
        self.reqs[rid] = {"prompt": prompt, "out": out, "w": res.cached_len, "done": 0,
                          "cached": False}

    def _live(self, data, running: bool) -> int | None:
        rids = [r for r, q in self.reqs.items() if q["cached"] == running]
        return data.draw(st.sampled_from(rids)) if rids else None

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), chunk=st.integers(1, 12))
    def extend(self, data, chunk: int) -> None:
        """A prefill chunk; the last one completes the prefill (cache_prefix)."""
        rid = self._live(data, running=False)
        if rid is None:
            return
        q = self.reqs[rid]
        target = min(q["w"] + chunk, len(q["prompt"]))
        if not self.p.extend([rid], [target]):
            self.p.release(rid)
            del self.reqs[rid]
            return
        q["w"] = target
        if target == len(q["prompt"]):
            self.p.cache_prefix(rid, q["prompt"])
            q["cached"] = True

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def decode(self, data) -> None:
        rid = self._live(data, running=True)
        if rid is None:
            return
        q = self.reqs[rid]
        ids = np.concatenate([q["prompt"], 7 + np.arange(q["out"])])
        if q["done"] + 1 >= q["out"]:
            self.p.finish(rid, ids[: q["w"]])
            del self.reqs[rid]
        elif self.p.decode([rid]):
            q["w"] += 1
            q["done"] += 1
        else:
            self.p.release(rid)
            del self.reqs[rid]

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def release(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self.p.release(rid)
        del self.reqs[rid]

    @invariant()
    def consistent(self) -> None:
        if self.p is None:
            return
        self.p.check_invariants()  # device, host and storage structures; loads in flight
        state = self.p.tier_state()
        assert state is not None
        self.check_tiers()
