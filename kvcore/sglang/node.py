"""The radix tree's node, its eviction priorities and key helpers (kvcore/sglang/radix_cache.py).

Why a node looks as it does:
* `__slots__` and no per-node containers until needed: most nodes are leaves, so `children`
  (and, for page_size > 1, `by_first_token`) stay None until the first child arrives and go
  back to None when the last one leaves. Fewer containers also means fewer of the garbage
  collector's passes, which scan every container alive.
* Children are keyed by their first token (page size 1) or their first page's bytes, so a
  match can only stop on a page boundary; `by_first_token` lists the children starting with
  a token, for the token-level peek that measures what page alignment loses.
* The root is the one node without a parent: walks up a path stop there.

Invariants (checked by RadixCache.check_invariants):

    len(key) == len(value) > 0 and len(key) % page_size == 0     (every non-root node)
    parent.children[ckey] is node,   ckey == child key of node.key
    lock_ref == own_locks + sum(lock_ref of children) >= 0,      root.lock_ref == 1
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import torch

from kvcore.contract.registry import Registry
from kvcore.contract.validation import int_array

#: a child's key in its parent's map: its first token (page size 1) or first page's bytes
ChildKey = int | bytes


class TreeNode:
    __slots__ = (
        "_value",
        "by_first_token",
        "children",
        "ckey",
        "created",
        "first",
        "hit_count",
        "host",
        "id",
        "key",
        "last_access",
        "lock_ref",
        "own_locks",
        "parent",
    )

    def __init__(self, key: np.ndarray, value: torch.Tensor | None, parent: TreeNode | None,
                 nid: int):
        self.key = key
        self._value = value  # None until first asked for when `host` holds the slots
        self.parent = parent
        self.children: dict[ChildKey, TreeNode] | None = None
        self.by_first_token: dict[int, list[TreeNode]] | None = None
        self.lock_ref = 0
        self.own_locks = 0
        self.last_access = 0
        self.created = 0
        self.hit_count = 0
        self.id = nid
        # set by the tree: the key of this node in its parent's `children`, its first token,
        # and (on CPU) a numpy view of `value` for eviction's host-side frees
        self.ckey: ChildKey = 0
        self.first = 0
        self.host: np.ndarray | None = None

    @property
    def value(self) -> torch.Tensor:
        """The node's slots as an int64 tensor. On CPU the tree keeps them as `host` and
        makes this tensor (the same memory) the first time something asks: most nodes are
        inserted and evicted through `host` alone, and a tensor per node is one more
        allocation and one more object for the garbage collector to scan."""
        v = self._value
        if v is None:
            assert self.host is not None, "a node has its slots as a tensor or on the host"
            v = self._value = torch.from_numpy(self.host)
        return v

    @value.setter
    def value(self, value: torch.Tensor) -> None:
        self._value = value

    def split_front(self, m: int) -> tuple[torch.Tensor | None, np.ndarray | None]:
        """Cut the first m slots off this node's key and slots; returns them as (tensor,
        host), the tensor None where it was not made yet (for the new upper node)."""
        v, h = self._value, self.host
        self.key = self.key[m:]
        if v is not None:
            self._value = v[m:]
        if h is not None:
            self.host = h[m:]
        return (None if v is None else v[:m]), (None if h is None else h[:m])

    def child_nodes(self) -> Iterator[TreeNode]:
        """The children (none for a leaf), in insertion order."""
        return iter(()) if self.children is None else iter(self.children.values())

    def offset(self) -> int:
        """Tokens above this node: where its key starts in every key through it."""
        return sum(len(n.key) for n in self.path_to_root()) - len(self.key)

    def path_to_root(self) -> Iterator[TreeNode]:
        """This node, its parent, ... up to the root (excluded): what a lock or a touch of
        a match ending here covers."""
        node, parent = self, self.parent
        while parent is not None:
            yield node
            node, parent = parent, parent.parent

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock={self.lock_ref})"


class MatchResult(NamedTuple):
    """`indices`: the slots of the matched prefix (page-aligned); `last_node`: where it ends
    (lock it while the request runs); `token_hit`: the tokens a token-granular cache holding
    the same content would match, whatever a side pool's rule cut off (>= len(indices));
    `cuts`: with side pools, where the match rules cut it (RadixCache `rule_cuts`), empty
    otherwise."""

    indices: torch.Tensor
    last_node: TreeNode
    token_hit: int = 0
    cuts: tuple[int, ...] = ()


# Each priority is one int (lower goes first), the node id in the low bits breaking ties, so
# that heap entries compare by a single int: LRU by last access, LFU by hits then last access,
# FIFO by creation. Clocks and ids stay far below 2**40 in any run.
EVICTION_PRIORITIES: Registry[Callable[[TreeNode], int]] = Registry("eviction policy")


@EVICTION_PRIORITIES.register("lru")
def _lru(n: TreeNode) -> int:
    return (n.last_access << 40) | n.id


@EVICTION_PRIORITIES.register("lfu")
def _lfu(n: TreeNode) -> int:
    return (n.hit_count << 80) | (n.last_access << 40) | n.id


@EVICTION_PRIORITIES.register("fifo")
def _fifo(n: TreeNode) -> int:
    return (n.created << 40) | n.id


def as_key(key: object) -> np.ndarray:
    """Token ids as a 1-D int64 numpy array (no copy when already one)."""
    return int_array("a key", key)


def frozen(key: np.ndarray) -> np.ndarray:
    """A read-only view of the caller's token ids: a node keeps the ids it was inserted with
    instead of copying them (a 12 k-token prompt is a 96 KB copy, and fresh memory faults in
    page by page). Token ids are immutable by convention (the simulator builds a new array
    per call); the view cannot be written through, and a caller must not write the base."""
    view = key.view()
    view.flags.writeable = False
    return view


def partial_page_hit(node: TreeNode, key: np.ndarray, pos: int) -> int:
    """The tokens of key[pos:] that the best child of `node` starts with: at the end of a
    page-aligned match (node `pos` deep), what the token-level hit adds inside the next
    stored page (`RadixCache.peek`'s second answer is pos + this, when no rule cut the
    match). Children by first token
    are only kept for page_size > 1; at page size 1 a match is already token-level."""
    by_first = node.by_first_token
    if by_first is None or pos >= len(key):
        return 0
    rest = key[pos:]
    return max((common_prefix_len(c.key, rest) for c in by_first.get(int(key[pos]), ())),
               default=0)


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    ne = a[:n] != b[:n]
    i = int(ne.argmax())
    return i if ne[i] else n
