"""`ApproxTree`: SGLang's router's approximate radix tree, one tree for every worker (tenant).

The cache-aware policy of SGLang's router keeps no copy of the workers' caches: it remembers
what it sent where. Rules followed (sgl-project/sglang `sgl-model-gateway/src/policies/tree.rs`
at 03744dbe, the tree `cache_aware.rs` at 053b63ff drives):

* One radix tree over the routed text; each node records the tenants (workers) that were sent
  a request through it, with a last-access epoch per tenant. The router's HTTP mode stores
  characters, its gRPC mode token ids; kvsim has token ids, so the tree is over tokens and
  sizes count tokens.
* `insert(tokens, tenant)`: walk and split as a radix tree does; the tenant is added to every
  node of the path (an intermediate node it did not hold gets epoch 0, counted in its size)
  and the node where the text ends gets a fresh epoch.
* `prefix_match(tokens)`: the longest path matched in the whole tree (any tenant), a partial
  node included; the answer's tenant is the deepest node's: the tenant that created it if it
  still holds it, else one of its tenants (upstream takes the hash map's first; here the
  smallest worker index, so runs are deterministic). One match in eight refreshes that node's
  epoch for that tenant, as upstream does to spare its locks.
* `evict_tenant_by_size(max_size)`: for every tenant over `max_size` tokens, its leaves (nodes
  it holds with no child it holds) leave in epoch order, a parent becoming a leaf joining the
  queue, until the tenant fits; a node no tenant holds any more is removed.

The epoch is one counter for the whole tree (upstream: a global atomic), incremented by every
insert that sets an epoch and every match.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from kvcore.contract.validation import InvariantError

__all__ = ["ApproxTree", "MatchResult"]

_EMPTY = np.zeros(0, dtype=np.int64)
#: upstream refreshes a matched node's epoch when `epoch & 7 == 0` (one match in eight)
MATCH_REFRESH_MASK = 0x7


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    ne = a[:n] != b[:n]
    i = int(ne.argmax())
    return i if ne[i] else n


class _Node:
    __slots__ = ("children", "creator", "key", "parent", "tenants")

    def __init__(self, key: np.ndarray, parent: _Node | None, creator: int | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.tenants: dict[int, int] = {}  # tenant -> last access epoch
        self.creator = creator  # upstream's cached `last_tenant`


@dataclass(frozen=True)
class MatchResult:
    matched: int  # tokens matched (any tenant's path)
    tenant: int | None  # the deepest matched node's tenant (None: no tenant anywhere)


class ApproxTree:
    """The router's tree over token ids, with per-tenant sizes (tokens)."""

    def __init__(self) -> None:
        self.root = _Node(_EMPTY, None, None)
        self.size: dict[int, int] = {}  # tenant -> tokens held
        self.epoch = 0

    def _next_epoch(self) -> int:
        e = self.epoch
        self.epoch += 1
        return e

    def add_tenant(self, tenant: int) -> None:
        """A worker known to the router (upstream inserts "" for it: root only, epoch 0)."""
        self.root.tenants.setdefault(tenant, 0)
        self.size.setdefault(tenant, 0)

    def _hold(self, node: _Node, tenant: int) -> None:
        if tenant not in node.tenants:
            node.tenants[tenant] = 0
            self.size[tenant] = self.size.get(tenant, 0) + len(node.key)

    def insert(self, tokens: np.ndarray, tenant: int) -> None:
        self.add_tenant(tenant)
        node, pos, n = self.root, 0, len(tokens)
        while pos < n:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                leaf = _Node(tokens[pos:], node, tenant)
                node.children[int(tokens[pos])] = leaf
                leaf.tenants[tenant] = self._next_epoch()
                self.size[tenant] = self.size.get(tenant, 0) + (n - pos)
                return
            m = shared_prefix(child.key, tokens[pos:])
            if m < len(child.key):
                child = self._split(child, m)
            self._hold(child, tenant)
            node, pos = child, pos + m
        node.tenants[tenant] = self._next_epoch()

    def _split(self, child: _Node, m: int) -> _Node:
        """Cut `child` after m tokens: a new upper node holding the same tenants (their
        epochs copied, their sizes unchanged: the tokens are the same)."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.key[:m], parent, child.creator)
        upper.tenants = dict(child.tenants)
        parent.children[int(child.key[0])] = upper
        child.key = child.key[m:]
        child.parent = upper
        upper.children[int(child.key[0])] = child
        return upper

    def prefix_match(self, tokens: np.ndarray) -> MatchResult:
        node, pos, n = self.root, 0, len(tokens)
        while pos < n:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                break
            m = shared_prefix(child.key, tokens[pos:])
            pos += m
            node = child
            if m < len(child.key):
                break
        tenant = self._tenant_of(node)
        epoch = self._next_epoch()
        if tenant is not None and not epoch & MATCH_REFRESH_MASK and node is not self.root:
            node.tenants[tenant] = epoch
        return MatchResult(pos, tenant)

    @staticmethod
    def _tenant_of(node: _Node) -> int | None:
        if node.creator is not None and node.creator in node.tenants:
            return node.creator
        return min(node.tenants) if node.tenants else None

    def matched_by(self, tokens: np.ndarray, tenant: int) -> int:
        """Tokens of `tokens` on `tenant`'s own paths (what the router believes that worker
        caches); for reports and tests, no epoch changes."""
        node, pos, n = self.root, 0, len(tokens)
        while pos < n:
            child = node.children.get(int(tokens[pos]))
            if child is None or tenant not in child.tenants:
                break
            m = shared_prefix(child.key, tokens[pos:])
            pos += m
            if m < len(child.key):
                break
            node = child
        return pos

    def _is_leaf_of(self, node: _Node, tenant: int) -> bool:
        return tenant in node.tenants and not any(tenant in c.tenants
                                                  for c in node.children.values())

    def evict_tenant_by_size(self, max_size: int) -> int:
        """Upstream's periodic eviction; returns the tokens removed (all tenants)."""
        heap: list[tuple[int, int, int, _Node]] = []
        seq = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is self.root:
                continue
            for tenant, epoch in node.tenants.items():
                if self._is_leaf_of(node, tenant):
                    heap.append((epoch, seq, tenant, node))
                    seq += 1
        heapq.heapify(heap)
        removed = 0
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if self.size.get(tenant, 0) <= max_size or not self._is_leaf_of(node, tenant):
                continue
            self.size[tenant] -= len(node.key)
            removed += len(node.key)
            del node.tenants[tenant]
            parent = node.parent
            assert parent is not None
            if not node.children and not node.tenants:
                del parent.children[int(node.key[0])]
            if parent is not self.root and self._is_leaf_of(parent, tenant):
                heapq.heappush(heap, (parent.tenants[tenant], seq, tenant, parent))
                seq += 1
        return removed

    def nodes(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def check_invariants(self) -> None:
        """Children keyed by their first token, parent links, no empty non-root node, every
        non-root node held by someone or with children, a tenant's nodes form root paths
        (a node a tenant holds has a parent it holds), sizes equal the tokens held."""
        sizes: dict[int, int] = dict.fromkeys(self.size, 0)
        for node in self.nodes():
            for first, child in node.children.items():
                if child.parent is not node or not len(child.key) or int(child.key[0]) != first:
                    raise InvariantError("approx tree: a child is mis-keyed or mis-linked")
            if node is self.root:
                continue
            if not node.tenants and not node.children:
                raise InvariantError("approx tree: a node nobody holds was left behind")
            assert node.parent is not None
            for tenant in node.tenants:
                if node.parent is not self.root and tenant not in node.parent.tenants:
                    raise InvariantError(f"approx tree: tenant {tenant} holds a node "
                                         "without its parent")
                sizes[tenant] = sizes.get(tenant, 0) + len(node.key)
        if sizes != {t: s for t, s in self.size.items()}:
            raise InvariantError(f"approx tree: sizes {self.size} != counted {sizes}")
