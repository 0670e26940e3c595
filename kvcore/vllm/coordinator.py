"""The prefix hit every KV cache group accepts: vLLM's KV cache coordinators
(vllm/v1/core/kv_cache_coordinator.py, v0.11: `UnitaryKVCacheCoordinator`,
`HybridKVCacheCoordinator`, `KVCacheCoordinatorNoPrefixCache`), over the block pool's chain
index of each group (kvcore/vllm/chain_index.py) and the prompt memo (kvcore/vllm/chain_memo.py).

* A full-attention group's hit is its cached blocks from block 0 up to the first miss: one
  walk of its chain index, resumed after the part of the memo's last hit that is still
  indexed. A layout of full-attention groups only (`PrefixCoordinator`; vLLM's unitary
  coordinator when there is one group) takes the shortest of those walks, and its answer
  rests on the hashes of the hit's blocks and the first missed one only, so a remembered
  prompt is compared that far (`ChainMemo.recall` / `confirm`).
* Any other layout (`HybridCoordinator`) reads, for every other group, the oldest holder of
  every position (`BlockPool.holders`) and runs vLLM's fixed point
  (kvcore/vllm/kv_cache_groups.py `longest_hit`, after vllm #46453; the fixed point dates from
  v0.10.2): each kind is asked for the longest hit it accepts up to the current candidate
  until none shortens it. Its answer reads the whole chain.
* With prefix caching off (Mamba in mode none: `NoPrefixCoordinator`) nothing is looked up.
* A hybrid admission (`HybridCoordinator.admission`) also says where the other kinds' rules
  cut the full-attention hit, for the reuse accounting (issue 38, item 4): a state block
  the pool evicted while its full-attention KV stays cached (kvcore/vllm/state_evictions.py)
  is capacity, not the state-boundary rule. A layout of one kind has no such cut and pays
  nothing for it (`admission` is `find`).

A hit is whole blocks of the prompt less its last token at admission (vLLM recomputes the
last token to get logits); a peek asks about the tokens as given.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import numpy as np

from kvcore.model.layers import FULL
from kvcore.vllm.block_pool import BlockPool
from kvcore.vllm.chain_memo import ChainEntry, ChainMemo
from kvcore.vllm.group_rules import FullAttention, GroupRule
from kvcore.vllm.kv_cache_groups import Cached, GroupSpec, longest_hit
from kvcore.vllm.state_evictions import StateEvictions

_NO_BLOCKS = np.zeros(0, dtype=np.int64)


class Hit(NamedTuple):
    """A lookup's answer: the hit in tokens, per group the block table it gives (0: a
    position the group does not need), per spec the hit that spec alone accepts; from a
    hybrid admission, the full-attention KV the window and the state-boundary rules cut
    (`AdmitResult.window_lost`, `state_lost`)."""

    tokens: int
    tables: list[np.ndarray]
    alone: list[int]
    window_lost: int = 0
    state_lost: int = 0

    def held(self, rules: list[GroupRule]) -> np.ndarray:
        """The blocks the hit holds, group by group, in position order."""
        parts = [rule.held(t) for rule, t in zip(rules, self.tables, strict=True)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class Coordinator(ABC):
    """Finds the longest prefix hit of a prompt over every KV cache group."""

    def __init__(self, pool: BlockPool, rules: list[GroupRule], specs: tuple[GroupSpec, ...],
                 memo: ChainMemo) -> None:
        self.pool = pool
        self.rules = rules
        self.specs = specs
        self.memo = memo
        self.block_size = pool.page_size
        self.none = Hit(0, [_NO_BLOCKS for _ in rules], [0] * len(specs))

    @abstractmethod
    def find(self, e: ChainEntry, hashes: np.ndarray, ids: np.ndarray, max_len: int) -> Hit:
        """The hit of `ids` (memo entry `e`, the hashes of its first max_len // block_size
        blocks), non-empty index assumed."""

    def admission(self, e: ChainEntry, hashes: np.ndarray, ids: np.ndarray,
                  max_len: int) -> Hit:
        """`find` at admission, which a layout with other kinds of groups tells where their
        rules cut the hit (`HybridCoordinator`)."""
        return self.find(e, hashes, ids, max_len)

    def peek(self, ids: np.ndarray, max_len: int) -> Hit:
        """The hit of `ids` capped at `max_len` tokens, through the memo (read-only for the
        pool)."""
        nblocks = max_len // self.block_size
        if nblocks <= 0 or not self.pool.num_indexed:
            return self.none
        e, hashes = self.memo.chain(ids, nblocks)
        return self.find(e, hashes, ids, max_len)

    def other_pools(self, hit: Hit, tokens: int, slot_groups: int) -> int:
        """Slots every group's new blocks take, to grow a request admitted with `hit` to
        `tokens`, beyond one attention group's pages: vLLM allocates a new request's blocks
        in every group at once (`get_num_blocks_to_allocate`, summed over the groups)."""
        bs = self.block_size
        need = sum(rule.new_blocks(len(t), hit.tokens, tokens)
                   for rule, t in zip(self.rules, hit.tables, strict=True))
        return -(-need * bs // slot_groups) - (-(-tokens // bs) - hit.tokens // bs) * bs

    def walk(self, e: ChainEntry, gid: int, hashes: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Group `gid`'s prefix hit of the chain `hashes`: the index's walk resumed from the
        memo's last hit over it, which is updated."""
        pool = self.pool
        known = e.hits[gid]
        hit = pool.longest_cache_hit(hashes, ids, known.blocks, known.gens, known.at,
                                     known.evicted, gid)
        if hit is not known.blocks:  # (the same array: still indexed under the same gens)
            # a cut of the known hit (a view of its first blocks) keeps their generations
            cut = len(hit) <= len(known.blocks) and (
                not len(hit) or hit.ctypes.data == known.blocks.ctypes.data)
            known.blocks = hit
            known.gens = known.gens[: len(hit)] if cut else pool.indexes[gid].gen[hit]
        known.evicted = pool.evicted_blocks
        known.at = pool.indexes[gid].newest if len(hit) < len(hashes) else -1
        return hit


class PrefixCoordinator(Coordinator):
    """Full-attention groups only: the shortest of their prefix walks."""

    def other_pools(self, hit: Hit, tokens: int, slot_groups: int) -> int:
        """None: each of the slot_groups groups takes the same pages."""
        return 0

    def find(self, e: ChainEntry, hashes: np.ndarray, ids: np.ndarray, max_len: int) -> Hit:
        walks = [self.walk(e, rule.gid, hashes, ids) for rule in self.rules]
        n = min(len(w) for w in walks)
        tokens = n * self.block_size
        return Hit(tokens, [w[:n] for w in walks], [tokens] * len(self.specs))

    admission = find  # (no other kind of group: nothing cuts the hit)

    def peek(self, ids: np.ndarray, max_len: int) -> Hit:
        nblocks = max_len // self.block_size
        if nblocks <= 0 or not self.pool.num_indexed:
            return self.none
        known = self.memo.recall(ids, nblocks)
        if known is not None:  # tokens compared after, as far as the answer reads them
            hit = self.find(*known, ids, max_len)
            if self.memo.confirm(known[0], ids,
                                 min(hit.tokens // self.block_size + 1, nblocks)):
                return hit
        e, hashes = self.memo.chain(ids, nblocks)  # (a rewritten buffer: hashed afresh)
        return self.find(e, hashes, ids, max_len)


class HybridCoordinator(Coordinator):
    """Several kinds of groups: vLLM's fixed point over each kind's own hit rule. Its
    admission also says where the other kinds' rules cut the full-attention hit (the reuse
    accounting's window and state-boundary causes, `AdmitResult`), with the state blocks the
    pool evicted (`evictions`, kvcore/vllm/state_evictions.py) counted as kept: capacity,
    not the rule."""

    def __init__(self, pool: BlockPool, rules: list[GroupRule], specs: tuple[GroupSpec, ...],
                 memo: ChainMemo, evictions: StateEvictions | None = None) -> None:
        super().__init__(pool, rules, specs, memo)
        self.evictions = evictions
        #: the specs whose rule is not a state's (the hit without the state-boundary rule)
        self.plain = [k for k, s in enumerate(specs) if not s.is_state]

    def _held(self, e: ChainEntry, hashes: np.ndarray,
              ids: np.ndarray) -> tuple[list[np.ndarray], list[Cached]]:
        """Per group its holder at each position (full attention: its prefix walk), and per
        spec whether every group of it holds each position."""
        nblk = len(hashes)
        held: list[np.ndarray] = []
        for rule in self.rules:
            if isinstance(rule, FullAttention):
                walk = self.walk(e, rule.gid, hashes, ids)
                held.append(np.concatenate([walk, np.zeros(nblk - len(walk), np.int64)]))
            else:
                held.append(self.pool.holders(hashes, ids, rule.gid))
        cached: list[Cached] = []
        for spec in self.specs:
            mine = [h for h, rule in zip(held, self.rules, strict=True) if rule.spec is spec]
            cached.append(np.logical_and.reduce([h != 0 for h in mine]))
        return held, cached

    def _hit(self, held: list[np.ndarray], cached: list[Cached], max_len: int) -> Hit:
        bs = self.block_size
        hit, first = longest_hit(self.specs, cached, max_len, bs)
        alone = [longest_hit((s,), [c], max_len, bs)[0]
                 for s, c in zip(self.specs, cached, strict=True)]
        n = hit // bs
        tables = []
        for rule, h in zip(self.rules, held, strict=True):
            lo = 0 if isinstance(rule, FullAttention) else first[self.specs.index(rule.spec)]
            t = h[:n].copy()
            t[:lo] = 0
            tables.append(t)
        return Hit(hit, tables, alone)

    def find(self, e: ChainEntry, hashes: np.ndarray, ids: np.ndarray, max_len: int) -> Hit:
        return self._hit(*self._held(e, hashes, ids), max_len)

    def admission(self, e: ChainEntry, hashes: np.ndarray, ids: np.ndarray,
                  max_len: int) -> Hit:
        """`find`, with where the rules cut the hit: the full-attention groups' hit alone
        (the content cached), the fixed point of the specs without a state (the window's
        cut below the content), and the fixed point with every state block the pool
        evicted counted as kept (the state-boundary rule's cut below the window's)."""
        held, cached = self._held(e, hashes, ids)
        hit = self._hit(held, cached, max_len)
        specs, bs, plain = self.specs, self.block_size, self.plain
        windowed = longest_hit(tuple(specs[k] for k in plain), [cached[k] for k in plain],
                               max_len, bs)[0] if plain else max_len // bs * bs
        content = min((a for s, a in zip(specs, hit.alone, strict=True) if s.kind == FULL),
                      default=windowed)
        boundary = hit.tokens
        ev = self.evictions
        if ev is not None and ev.any():
            kept = list(cached)
            for k, spec in enumerate(specs):
                if spec.is_state:
                    kept[k] = np.logical_and.reduce(
                        [(h != 0) | ev.kept(rule.gid, hashes)
                         for h, rule in zip(held, self.rules, strict=True)
                         if rule.spec is spec])
            boundary = longest_hit(specs, kept, max_len, bs)[0]
        return hit._replace(window_lost=content - windowed, state_lost=windowed - boundary)


class NoPrefixCoordinator(Coordinator):
    """Prefix caching off: every lookup misses."""

    def find(self, e: ChainEntry, hashes: np.ndarray, ids: np.ndarray, max_len: int) -> Hit:
        return self.none

    def peek(self, ids: np.ndarray, max_len: int) -> Hit:
        return self.none


def coordinator(pool: BlockPool, rules: list[GroupRule], specs: tuple[GroupSpec, ...],
                memo: ChainMemo, caching: bool,
                evictions: StateEvictions | None = None) -> Coordinator:
    """The coordinator of a layout (vLLM's `get_kv_cache_coordinator`); `evictions`: the
    pool's record of evicted state blocks, for a hybrid admission's reuse causes."""
    if not caching:
        return NoPrefixCoordinator(pool, rules, specs, memo)
    if all(isinstance(rule, FullAttention) for rule in rules):
        return PrefixCoordinator(pool, rules, specs, memo)
    return HybridCoordinator(pool, rules, specs, memo, evictions)


__all__ = ["Coordinator", "Hit", "HybridCoordinator", "NoPrefixCoordinator",
           "PrefixCoordinator", "coordinator"]
