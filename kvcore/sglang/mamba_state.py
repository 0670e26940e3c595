"""`MambaStates`: the linear-attention / Mamba state pool kind of SGLang's manager.

The pool is kvcore/sglang/mamba_pool.py's `MambaPool`; this kind keeps what the radix cache and
the running requests do with its slots, after SGLang v0.5's `MambaRadixCache`
(python/sglang/srt/mem_cache/mamba_radix_cache.py, the "v1" cache of the default `no_buffer`
strategy, which asserts page size 1) and `HybridReqToTokenPool`:

* **States on nodes.** A node may hold a state slot: the recurrent state after its last token.
  A match must end at a node with a state (whole: a match cut inside a node has none there);
  a split leaves the state on the lower part. A request locks the state of the node its match
  ended at (SGLang `mamba_lock_ref`).
* **States of requests.** A running request owns one slot from admission; a hit copies the
  cached state into it (copy on write); caching a running prefix forks a new slot for the
  tree (`fork_from`; nothing is cached when no slot can be freed); a finished request's slot
  goes to the tree, or back to the pool when the tree already holds a state there.
* **Eviction.** When a slot is short, states go least recently used first (SGLang
  `evict_mamba`): an inner (or locked) node loses its state, an unlocked leaf is evicted
  whole; a leaf left without a state is deleted (`dead`). An inner node whose state was
  evicted is remembered (`evicted`, until it holds a state again or leaves the tree), so
  that the reuse accounting tells a state the pool evicted (capacity) from one never kept
  there (the state-boundary rule: states are kept only where a cached sequence ended).
* **Running requests capped by state slots** (model_executor/model_runner_kv_cache_mixin.py,
  `_calculate_mamba_ratio` with the `no_buffer` Mamba scheduler strategy, v0.5's default;
  later versions default to `auto`, whose `extra_buffer` choice adds 1 or 2 slots per request
  and tracks states inside prompts, not modelled): at most `slots // 3` run with the radix
  cache (a running request's own state, the cached state its hit locks, the fork made when
  its prefix is cached), `slots // 1` without it (kvcore/model/hybrid_plan.py
  `MAMBA_SLOTS_PER_REQUEST`). At the cap, or with no slot to give, admission is refused,
  which the engine treats as memory it must wait for.

Invariants (`check_invariants`): node states are distinct slots in use; a state lock implies
a state and the lock counts equal the running requests' locks; slots in use == the running
requests' own + the tree's; a node marked evicted is in the tree and holds no state.
"""

from __future__ import annotations

import numpy as np

from kvcore.contract.capabilities import PoolUsage
from kvcore.contract.req_to_token_pool import ReqToTokenPool
from kvcore.contract.validation import InvariantError
from kvcore.model.hybrid_plan import MAMBA_SLOTS_PER_REQUEST
from kvcore.sglang.mamba_pool import MambaPool
from kvcore.sglang.node import TreeNode
from kvcore.sglang.pool_kind import PoolKind, side_lru
from kvcore.sglang.radix_cache import RadixCache, Walker

__all__ = ["MambaStates"]


class MambaStates(PoolKind):
    """The state slots of `pool`, with the radix cache (`cache_enabled`) or without it."""

    kind = "mamba"
    rule = "state"

    def __init__(self, pool: MambaPool, page_size: int, cache_enabled: bool) -> None:
        if page_size != 1 and cache_enabled:
            raise ValueError(f"page_size {page_size}: SGLang's Mamba radix cache (v0.5, "
                             "no_buffer) needs page size 1")
        per = MAMBA_SLOTS_PER_REQUEST if cache_enabled else 1
        self.cap = pool.size // per
        if self.cap < 1:
            raise ValueError(f"{pool.size} Mamba state slots run no request: SGLang needs "
                             f"{per} per running request (raise max_mamba_cache_size)")
        self.pool = pool
        self.slots: dict[TreeNode, int] = {}  # node -> the state after its last token
        self.locks: dict[TreeNode, int] = {}  # node -> requests holding its state
        self.locked = 0  # nodes whose state is locked
        self.evicted: set[TreeNode] = set()  # nodes whose state the pool evicted

    def attach(self, tree: RadixCache, table: ReqToTokenPool) -> None:
        super().attach(tree, table)
        rows = table.size + 1
        self.own = np.full(rows, -1, dtype=np.int64)  # each running request's slot
        self.offered = np.full(rows, -1, dtype=np.int64)  # the slot an insert may adopt
        self.holds = np.zeros(rows, dtype=bool)  # whether its hit's state is locked

    # -- sizes -----------------------------------------------------------------------------
    def sizes(self) -> tuple[int, int]:
        """(evictable, protected) states the tree holds."""
        return len(self.slots) - self.locked, self.locked

    def _alloc(self) -> int | None:
        """A free slot, evicting a cached state if none is free."""
        slot = self.pool.alloc()
        if slot is None and self.evict(1):
            slot = self.pool.alloc()
        return slot

    # -- the tree's hooks ----------------------------------------------------------------------
    def walker(self) -> Walker:
        slots = self.slots

        def accept(node: TreeNode, matched: int, whole: bool) -> bool:
            return whole and node in slots

        return accept

    def rule_walker(self) -> Walker:
        slots, evicted = self.slots, self.evicted

        def accept(node: TreeNode, matched: int, whole: bool) -> bool:
            return whole and (node in slots or node in evicted)

        return accept

    def removed(self, leaf: TreeNode) -> None:
        self.evicted.discard(leaf)
        slot = self.slots.pop(leaf, -1)
        if slot >= 0:
            self.pool.free(slot)

    def dead(self, leaf: TreeNode) -> bool:
        return leaf not in self.slots

    # -- state eviction --------------------------------------------------------------------------
    def evict(self, states: int) -> int:
        """Free at least `states` cached states if the cache can: an inner or locked node
        loses its state, an unlocked leaf is evicted whole, least recently used first.
        Returns states freed."""
        tree = self.tree
        if tree.disable or states <= 0:
            return 0
        freed = 0
        cands = [x for x in tree.nodes() if x in self.slots and x not in self.locks]
        for x in side_lru(cands):
            if freed >= states:
                break
            if not tree.attached(x) or x not in self.slots:
                continue
            freed += 1
            if x.children or x.lock_ref:
                self.pool.free(self.slots.pop(x))
                self.evicted.add(x)
            else:
                parent = x.parent
                assert parent is not None
                tree.delete_leaf(x)
                tree.drop_dead_leaves(parent)
        return freed

    # -- the manager's hooks -------------------------------------------------------------------
    def running_cap(self, cache_enabled: bool) -> int | None:
        return self.cap

    def lock(self, row: int, node: TreeNode) -> None:
        held = not self.tree.disable and node in self.slots
        if held:
            n = self.locks.get(node, 0)
            self.locked += not n
            self.locks[node] = n + 1
        self.holds[row] = held

    def unlock(self, row: int, node: TreeNode) -> None:
        if self.holds[row]:
            n = self.locks[node] - 1
            if n:
                self.locks[node] = n
            else:
                del self.locks[node]
                self.locked -= 1
            self.holds[row] = False

    def admit(self, row: int, node: TreeNode, hit: int) -> bool:
        slot = self._alloc()
        if slot is None:
            return False
        self.own[row] = slot
        if hit:  # copy on write: the cached state into the request's slot
            self.pool.copy(self.slots[node], slot)
        return True

    def offer(self, row: int, finishing: bool) -> bool:
        own = int(self.own[row])
        if finishing:  # its own slot: to the tree, or back to the pool
            self.offered[row], self.own[row] = own, -1
            return True
        fork = self._alloc()  # the tree gets a copy; the request keeps running
        if fork is None:
            return False
        self.pool.copy(own, fork)
        self.offered[row] = fork
        return True

    def inserted(self, row: int, node: TreeNode, cached: int, dup: int, end: int) -> None:
        slot = int(self.offered[row])
        if slot >= 0 and node not in self.slots:
            self.slots[node] = slot
            self.evicted.discard(node)
            self.offered[row] = -1

    def settle(self, row: int) -> None:
        slot = int(self.offered[row])
        if slot >= 0:
            self.pool.free(slot)
            self.offered[row] = -1

    def release(self, row: int) -> None:
        own = int(self.own[row])
        if own >= 0:
            self.pool.free(own)
            self.own[row] = -1

    def drop(self, row: int) -> None:
        self.own[row] = self.offered[row] = -1
        self.holds[row] = False

    # -- observation ---------------------------------------------------------------------------
    def usage(self, hit: int, queried: int) -> PoolUsage:
        sb = self.pool.state_bytes
        return PoolUsage("mamba", self.pool.size * sb, self.pool.used_size() * sb,
                         self.sizes()[0] * sb, hit, queried)

    def check_invariants(self, holders: list[tuple[int, TreeNode]]) -> None:
        self.pool.check_invariants()
        on_tree = set(self.tree.nodes())
        if not (set(self.slots) <= on_tree and set(self.locks) <= set(self.slots)):
            raise InvariantError("a state (or state lock) is kept for a node no longer in the "
                                 "tree, or a state lock has no state")
        if not self.evicted <= on_tree or not self.evicted.isdisjoint(self.slots):
            raise InvariantError("a node marked as having lost its state is no longer in the "
                                 "tree, or holds a state")
        want: dict[TreeNode, int] = {}
        own = []
        for row, node in holders:
            if self.holds[row]:
                want[node] = want.get(node, 0) + 1
            if self.own[row] >= 0:
                own.append(int(self.own[row]))
            if self.offered[row] >= 0:
                raise InvariantError(f"row {row}: an offered state slot was never settled")
        if want != self.locks or self.locked != len(self.locks):
            raise InvariantError("state lock counts differ from the running requests' locks")
        held = own + list(self.slots.values())
        in_use = set(self.pool.in_use().tolist())
        if len(set(held)) != len(held) or set(held) != in_use:
            raise InvariantError(f"state slots in use {len(in_use)} != running {len(own)} + "
                                 f"cached {len(self.slots)} (or one is held twice)")

    def close(self) -> None:
        self.pool.buffer = None
