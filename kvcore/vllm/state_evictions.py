"""Which Mamba state blocks the pool evicted while the full-attention KV of the same blocks
stays cached: the reuse accounting's capacity, not the state-boundary rule (issue 38, item 4).

A hit whose full-attention KV is cached can be cut by a Mamba state group for two reasons:
the cache mode kept no state at the positions where the hit could end (the state-boundary
rule: mode `align` keeps a state only where a scheduler step ends on a block boundary,
kvcore/vllm/group_rules.py `MambaState`), or it kept one there and the pool's LRU evicted it
since (capacity: a larger pool would have hit). Only the pool's evictions tell them apart,
so the pool reports them here (`BlockPool.on_unindexed`, `on_cached`): per state group, the
hashes whose state block it evicted while a full-attention group still indexes a block of
the same hash. A hash leaves the set when its state is cached again, or when no
full-attention group indexes it any more, so the set stays within the cached
full-attention blocks. The coordinator counts these positions as kept when it measures the
state rule's cut (kvcore/vllm/coordinator.py `HybridCoordinator.admission`).
"""

from __future__ import annotations

import numpy as np

from kvcore.contract.validation import InvariantError
from kvcore.vllm.block_pool import BlockPool


class StateEvictions:
    """Per state group `g` in `states`, `gone[g]`: the hashes whose state block the pool
    evicted while one of the `full` groups still indexes a block of that hash."""

    def __init__(self, pool: BlockPool, full: list[int], states: list[int]) -> None:
        self.pool = pool
        self.full = full
        self.states = states
        self.gone: dict[int, set[int]] = {g: set() for g in states}

    def _full_hashes(self) -> set[int]:
        """The hashes the full-attention groups index now."""
        pool = self.pool
        return {h for g in self.full
                for h in pool.block_hash[pool.indexes[g].gen > 0].tolist()}

    # (Python sets: a layout with state groups has blocks of hundreds of tokens, so few
    # blocks and short chains, where a set's lookups beat numpy's sort-based isin)
    def evicted(self, per_group: list[np.ndarray]) -> None:
        """Pool hook, after a pop's evicted blocks (still carrying their hashes) left every
        index: `per_group[g]`, those group g indexed."""
        pool, live = self.pool, None
        for g in self.states:
            blocks = per_group[g]
            if len(blocks):
                live = self._full_hashes() if live is None else live
                # a state cached twice (two blocks of one hash) loses nothing while the other
                # copy stays indexed: only a hash the group no longer holds is gone
                still = pool.block_hash[pool.indexes[g].gen > 0].tolist()
                self.gone[g].update(live.intersection(pool.block_hash[blocks].tolist())
                                    .difference(still))
        if not any(self.gone.values()):
            return
        out = [h for g in self.full if len(per_group[g])
               for h in pool.block_hash[per_group[g]].tolist()]
        if out:  # content no full-attention group holds any more: no hit left to lose
            dead = set(out).difference(self._full_hashes() if live is None else live)
            if dead:
                for gone in self.gone.values():
                    gone.difference_update(dead)

    def cached(self, group: int, hashes: np.ndarray) -> None:
        """Pool hook: `group` just cached blocks of `hashes`."""
        gone = self.gone.get(group)
        if gone:
            gone.difference_update(hashes.tolist())

    def kept(self, group: int, hashes: np.ndarray) -> np.ndarray:
        """Per position of the chain `hashes`, whether state group `group`'s block there was
        evicted by the pool (while the full-attention KV stays)."""
        gone = self.gone[group]
        return np.fromiter((h in gone for h in hashes.tolist()), dtype=bool,
                           count=len(hashes))

    def any(self) -> bool:
        """Whether any state group lost a block to the pool (else the rule cut everything)."""
        return any(self.gone.values())

    def check_invariants(self) -> None:
        """Every remembered hash is indexed by a full-attention group and not by its own
        state group."""
        pool = self.pool
        full = self._full_hashes()
        for g, gone in self.gone.items():
            own = set(pool.block_hash[pool.indexes[g].gen > 0].tolist())
            if not gone <= full or gone & own:
                raise InvariantError(f"vllm: group {g}: an evicted state is cached again, or "
                                     "no full-attention block holds its hash")


__all__ = ["StateEvictions"]
