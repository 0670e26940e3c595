"""`PoolKind`: a pool beside full attention's, as the radix cache and the manager see it.

SGLang's manager (kvcore/sglang/policy.py) runs every layout the same way: full attention is
the layout with no side pool, and each other layer kind adds one pool kind: sliding-window KV
(kvcore/sglang/sliding_window.py) or the Mamba / linear-attention state
(kvcore/sglang/mamba_state.py). A pool kind keeps its own data per tree node and per running
request (page-table row) and answers the hooks below; every hook has a default that does
nothing, so a kind overrides only the steps its pool takes part in. The shape follows SGLang's
unified radix cache, whose `TreeComponent`s hook the one tree's match, split, insert, lock and
eviction (python/sglang/srt/mem_cache/unified_cache/components/tree_component.py, SGLang main
at 029c0e2); the rules each kind follows are SGLang v0.5's (see each kind's module).

The tree calls the tree hooks (`walker`, `split`, `removed`, `dead`: radix_cache.TreeHooks); the
manager hands a kind the tree and the page table once (`attach`) and calls the request hooks,
always for every kind in the layout's order. A kind that allocates in a hook
(a state slot) comes after the kinds whose hooks only decide, so a refusal changes nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from kvcore.contract.capabilities import PoolUsage
from kvcore.contract.req_to_token_pool import ReqToTokenPool
from kvcore.sglang.node import TreeNode
from kvcore.sglang.radix_cache import RadixCache, Walker

__all__ = ["PoolKind", "side_lru"]


def side_lru(nodes: list[TreeNode]) -> list[TreeNode]:
    """A side pool's eviction order (SWA, Mamba state): least recently used first, and at
    equal use the nodes nearer the root first (SGLang resets a matched path so that parents
    are older than their children)."""
    return sorted(nodes, key=lambda x: (x.last_access, x.offset(), x.id))


def _accept(node: TreeNode, matched: int, whole: bool) -> bool:
    return True


class PoolKind(ABC):
    """One side pool of a layout. `kind` names it in `pool_usage` (capabilities.POOL_KINDS);
    `rule` names its match rule in the reuse accounting: "window" or "state", the
    `AdmitResult` field (`window_lost`, `state_lost`) that counts what the rule refused."""

    kind: str = ""
    rule: str = ""
    tree: RadixCache
    table: ReqToTokenPool

    def attach(self, tree: RadixCache, table: ReqToTokenPool) -> None:
        """The manager's radix cache (built with this kind) and page table; per-row data is
        sized to the table's rows."""
        self.tree, self.table = tree, table

    # -- the tree's hooks ----------------------------------------------------------------------
    def walker(self) -> Walker:
        """A fresh predicate for one read-only walk down a match path, called on every node
        the match enters, in order: a match may end after a node only where every kind's
        predicate accepts it (SGLang's `create_match_validator`)."""
        return _accept

    def rule_walker(self) -> Walker:
        """Like `walker`, but where this kind's rule alone lets a match end, counting data
        the pool evicted as still kept: the reuse accounting then tells what the rule refused
        (past this cut) from what capacity took (between this cut and the hit). Accepts
        wherever `walker` does; the default is `walker`, for a kind whose every cut is its
        rule's."""
        return self.walker()

    def split(self, upper: TreeNode, lower: TreeNode) -> None:  # noqa: B027 - optional hook
        """`lower` was cut after its first len(upper) tokens; `upper` is the new node above."""

    def removed(self, leaf: TreeNode) -> None:  # noqa: B027 - optional hook
        """`leaf` leaves the tree (full eviction or a kind's deletion), still linked."""

    def dead(self, leaf: TreeNode) -> bool:
        """Whether an unlocked leaf can no longer end or carry a match for this kind: the
        tree deletes such leaves after a full eviction (SGLang
        `_iteratively_delete_tombstone_leaf`)."""
        return False

    # -- the manager's hooks, per page-table row -----------------------------------------------
    def running_cap(self, cache_enabled: bool) -> int | None:
        """The most requests this pool lets run at once (None: no limit of its own)."""
        return None

    def lock(self, row: int, node: TreeNode) -> None:  # noqa: B027 - optional hook
        """Row `row`'s request holds the prefix ending at `node` (the tree has locked its
        full KV)."""

    def unlock(self, row: int, node: TreeNode) -> None:  # noqa: B027 - optional hook
        """The lock taken by `lock(row, node)` ends (the tree has unlocked its full KV)."""

    def admit(self, row: int, node: TreeNode, hit: int) -> bool:
        """A request is admitted on row `row` with `hit` tokens matched up to `node` (locked).
        False refuses it for lack of this pool's memory (the manager undoes the admission)."""
        return True

    def before_extend(self, rows: Sequence[int] | np.ndarray, written: Sequence[int] | np.ndarray,  # noqa: B027
                      cached: Sequence[int] | np.ndarray) -> None:
        """A prefill chunk of these rows is about to allocate (rows, their written and cached
        tokens, in batch order)."""

    def before_decode(self, rows: np.ndarray, written: np.ndarray, cached: np.ndarray) -> None:  # noqa: B027 - optional hook
        """A decode step of these rows is about to allocate."""

    def make_room(self, pages: int) -> None:  # noqa: B027 - optional hook
        """`pages` new full pages are about to be allocated and the full pool has them: free
        this pool's share if the cache can give it."""

    def may_cache(self, row: int, cached: int) -> bool:
        """Whether a running request's written pages may enter the cache now."""
        return True

    def offer(self, row: int, finishing: bool) -> bool:
        """Before the request on `row` inserts its pages: prepare what this pool hands the
        tree with them (a finishing request's own data, a running one's copy). False: none can
        be made, insert nothing now (only for a running request)."""
        return True

    def keeps(self, row: int, end: int) -> bool:
        """Whether the tree may take the request's first `end` tokens at all."""
        return True

    def inserted(self, row: int, node: TreeNode, cached: int, dup: int, end: int) -> None:  # noqa: B027 - optional hook
        """The tree took the request's tokens [dup, end) (it already held [cached, dup));
        `node` ends at `end`."""

    def settle(self, row: int) -> None:  # noqa: B027 - optional hook
        """After an insert (or none): give back what `offer` prepared and the tree did not
        take."""

    def cached_to(self, row: int, end: int) -> None:  # noqa: B027 - optional hook
        """A running request's lock moved to the end of its cached prefix, `end` tokens."""

    def release(self, row: int) -> None:  # noqa: B027 - optional hook
        """The request leaves without caching anything (preempted or aborted)."""

    def drop(self, row: int) -> None:  # noqa: B027 - optional hook
        """The row is given back: forget its data."""

    # -- observation ---------------------------------------------------------------------------
    def other_pools(self, available: int) -> int:
        """Slots of the full pool's `available` tokens that admission cannot count because
        this pool is shorter (`PrefixPeek.other_pools`)."""
        return 0

    @abstractmethod
    def usage(self, hit: int, queried: int) -> PoolUsage:
        """This pool in bytes, with the admissions' prefix hits so far."""

    def check_row(self, rid: int, row: int, written: int, cached: int,  # noqa: B027
                  slots: np.ndarray) -> None:
        """Raise InvariantError if the running request's data disagrees with its row
        (`slots`: its page-table row up to `written`)."""

    def check_invariants(self, holders: list[tuple[int, TreeNode]]) -> None:  # noqa: B027 - optional hook
        """Raise InvariantError if the pool or this kind's tree data is inconsistent;
        `holders`: every running request's (row, locked node)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release tensors early."""
