"""RadixCache: a radix tree over token ids whose nodes own the KV slots of those tokens: the one
prefix cache of SGLang's manager (kvcore/sglang/policy.py), for every layout.

Why it looks the way it does:
* Keys are numpy int64 arrays (token ids are host data) and values torch int64 tensors of
  slots (device data), as in SGLang. Comparing keys is one vectorised `!=` + `argmax`, so a
  12 k-token Mooncake prompt costs microseconds, not a Python loop.
* With page_size > 1 every key and value length is a multiple of page_size and children are
  keyed by their first page (its bytes), so a match can only stop on a page boundary and every
  tree page is a whole allocator page.
* Locks cover whole root paths: `lock_ref(p) == own_locks(p) + sum(lock_ref(children))`. A
  node with lock_ref 0 is evictable; only unlocked *leaves* are actually evicted, so shared
  ancestors stay until nothing below them is left.
* The LRU clock is a counter, not wall time, so runs are deterministic.
* Side pools (`kinds`: sliding-window KV, Mamba state; kvcore/sglang/pool_kind.py) keep their
  own per-node data and hook the tree's steps (`TreeHooks`), as the components of SGLang's
  unified radix cache do: a kind's walker may end a match early (a match needs the last
  window's SWA KV, a state at its end), a split hands a kind's data to both halves, a leaf
  leaving the tree gives its data back, and after a full eviction the leaves no kind can use
  any more are deleted. With no kind (full attention) each hook is an empty loop and a match
  needs no walk first.
* Reuse accounting: the walk before a match also asks each kind's `rule_walker` (its rule
  alone, counting data its pool evicted as still kept), so that a match says what each rule
  refused of the full-attention KV the tree holds (`rule_cuts`), apart from what capacity
  took.
* The node, the eviction priorities and the key helpers live in kvcore/sglang/node.py.

Invariants (`check_invariants`), besides the nodes' own (kvcore/sglang/node.py):

    evictable_size() == sum of len(n) over nodes with lock_ref == 0
    protected_size() == sum of len(n) over nodes with lock_ref > 0
    evictable-leaf set == {non-root n : n has no children and lock_ref == 0}
    no slot is held by two nodes; every node's value is whole, aligned pages, none free
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from kvcore.contract.validation import InvariantError, positive_int
from kvcore.sglang.allocator import PagedAllocator
from kvcore.sglang.node import (
    EVICTION_PRIORITIES,
    ChildKey,
    MatchResult,
    TreeNode,
    as_key,
    common_prefix_len,
    frozen,
    partial_page_hit,
)

__all__ = ["RadixCache", "TreeHooks", "Walker"]

#: a match's step through one node: (node, tokens of it matched (whole pages), whether all of
#: it matched) -> may the match end here
Walker = Callable[[TreeNode, int, bool], bool]


class TreeHooks(Protocol):
    """What the tree asks of a side pool (kvcore/sglang/pool_kind.py `PoolKind`)."""

    def walker(self) -> Walker: ...
    def rule_walker(self) -> Walker: ...
    def split(self, upper: TreeNode, lower: TreeNode) -> None: ...
    def removed(self, leaf: TreeNode) -> None: ...
    def dead(self, leaf: TreeNode) -> bool: ...

_EMPTY_KEY = np.zeros(0, dtype=np.int64)


class RadixCache:
    """Prefix cache over token ids. `allocator` receives the pages of evicted nodes; `kinds`
    are the layout's side pools (none: full attention)."""

    def __init__(
        self,
        page_size: int,
        allocator: PagedAllocator | None = None,
        eviction: str = "lru",
        disable: bool = False,
        device: str | torch.device | None = None,
        kinds: Sequence[TreeHooks] = (),
    ) -> None:
        self.page_size = positive_int("page_size", page_size)
        if allocator is not None and allocator.page_size != self.page_size:
            raise ValueError(
                f"page_size {page_size} differs from the allocator's {allocator.page_size}"
            )
        priority = EVICTION_PRIORITIES.get(eviction)
        self.allocator = allocator
        self.disable = disable
        self.eviction = eviction
        self.kinds = tuple(kinds)
        self._priority = priority
        # called with each leaf about to be evicted, still linked (kvcore/contract/tiers.py backs it
        # up into a lower tier); None costs one attribute test per evicted leaf
        self.on_evict: Callable[[TreeNode], None] | None = None
        # KV events: called with (True, leaf) once a new leaf's tokens entered the tree and
        # (False, leaf) before an evicted leaf leaves it (simulator/fleet/kv_events.py)
        self.kv_events: Callable[[bool, TreeNode], None] | None = None
        self.device = torch.device(device) if device else (
            allocator.device if allocator else torch.device("cpu")
        )
        self.reset()

    def reset(self) -> None:
        self._next_id = 0
        self._clock = 0
        self._empty_value = torch.empty(0, dtype=torch.int64, device=self.device)
        self._on_cpu = self.device.type == "cpu"
        self.root = self._new_node(_EMPTY_KEY, self._empty_value, None)
        self.root.lock_ref = 1
        self._evictable = 0
        self._protected = 0
        self._evictable_leaves: set[TreeNode] = set()
        # A persistent heap of (priority, node) for evictable leaves. Entries go stale when a
        # node is touched, locked or gains a child; stale ones are skipped when popped, and a
        # fresh entry is pushed whenever a node (re)becomes an evictable leaf or is touched.
        # evict() then costs O(k log n) instead of re-heapifying every leaf each call.
        self._heap: list[tuple[int, TreeNode]] = []

    # -- sizes -----------------------------------------------------------------------------
    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    # -- internals -------------------------------------------------------------------------
    def _new_node(self, key: np.ndarray, value: torch.Tensor | None, parent: TreeNode | None,
                  host: np.ndarray | None = None) -> TreeNode:
        """`host`: the slots as a numpy array, when the caller has them (CPU); `value` may
        then be None (the node makes its tensor from `host` when first asked)."""
        node = TreeNode(key, value, parent, self._next_id)
        self._next_id += 1
        node.created = node.last_access = self._clock
        if len(key):
            node.ckey, node.first = self._child_key(key), int(key[0])
        if self._on_cpu:
            if host is None:
                assert value is not None, "a node needs its slots"
                host = value.numpy()
            node.host = host
        return node

    def _child_key(self, key: np.ndarray, pos: int = 0) -> ChildKey:
        if self.page_size == 1:
            return int(key[pos])
        return key[pos : pos + self.page_size].tobytes()

    def _match_len(self, node_key: np.ndarray, key: np.ndarray) -> int:
        m = common_prefix_len(node_key, key)
        return m if self.page_size == 1 else m - m % self.page_size

    def _add_child(self, parent: TreeNode, child: TreeNode) -> None:
        if parent.children is None:
            parent.children = {}
        parent.children[child.ckey] = child
        if self.page_size > 1:
            if parent.by_first_token is None:
                parent.by_first_token = {}
            parent.by_first_token.setdefault(child.first, []).append(child)

    def _remove_child(self, parent: TreeNode, child: TreeNode) -> None:
        """Unlink `child`; a parent left without children holds no empty containers."""
        children = parent.children
        assert children is not None  # `child` is one of them
        del children[child.ckey]
        if not children:
            parent.children = None
        if self.page_size > 1:
            by_first = parent.by_first_token
            assert by_first is not None
            siblings = by_first[child.first]
            siblings.remove(child)
            if not siblings:
                del by_first[child.first]
                if not by_first:
                    parent.by_first_token = None

    def split(self, child: TreeNode, m: int) -> TreeNode:
        """Cut `child` after m tokens; the new upper node takes its place under the parent.
        Sizes, locks and evictability are unchanged (the new node inherits child's lock_ref);
        each side pool hands its data to the halves."""
        parent = child.parent
        assert parent is not None
        self._remove_child(parent, child)
        key = child.key[:m]
        value, host = child.split_front(m)  # host on CPU, the tensor on a device
        upper = self._new_node(key, value, parent, host)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        upper.created = child.created
        upper.hit_count = child.hit_count
        child.ckey, child.first = self._child_key(child.key), int(child.key[0])
        child.parent = upper
        self._add_child(upper, child)
        self._add_child(parent, upper)
        for kind in self.kinds:
            kind.split(upper, child)
        return upper

    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        return node is not self.root and not node.children and node.lock_ref == 0

    def _mark_leaf(self, node: TreeNode) -> None:
        """`node` is (still) an evictable leaf with a possibly new priority."""
        self._evictable_leaves.add(node)
        heapq.heappush(self._heap, (self._priority(node), node))
        if len(self._heap) > 2 * len(self._evictable_leaves) + 64:
            self._heap = [(self._priority(n), n) for n in self._evictable_leaves]
            heapq.heapify(self._heap)

    # -- matching --------------------------------------------------------------------------
    def match_prefix(self, key: object) -> MatchResult:
        """The longest cached prefix of `key` a request may reuse: whole pages, and with side
        pools only as far as every kind's walker accepts (their rules).

        Touches the matched path (LRU/LFU) and splits a node when the match ends inside it,
        so that `last_node` ends exactly at the match and can be locked. With side pools a
        read-only walk first finds where the rules let the match end; the match is then the
        full-attention one of the key cut there, so a layout whose rules cut nothing matches,
        splits and touches exactly as full attention does."""
        key = as_key(key)
        if self.disable:
            return MatchResult(self._empty_value, self.root, 0)
        cuts: tuple[int, ...] = ()
        if self.kinds:
            n, token, _, cuts = self._walk(key, rules=True)
        else:
            n, token = len(key) - len(key) % self.page_size, -1
        self._clock += 1
        node, pos, path = self.root, 0, []
        while pos < n:
            children = node.children
            child = children.get(self._child_key(key, pos)) if children is not None else None
            if child is None:
                break
            m = self._match_len(child.key, key[pos:n])
            child.last_access = self._clock
            child.hit_count += 1
            if m < len(child.key):  # ends inside: split, and the lower part is touched too
                upper = self.split(child, m)
                path.append(upper)
                node, pos = upper, pos + m
                if self._is_evictable_leaf(child):
                    self._mark_leaf(child)
                break
            path.append(child)
            node, pos = child, pos + m
        if self._is_evictable_leaf(node):
            self._mark_leaf(node)
        if token < 0:  # no rule cut the match: the token-level hit continues from its end
            token = pos + partial_page_hit(node, key, pos)
        if not path:
            return MatchResult(self._empty_value, self.root, token, cuts)
        if len(path) == 1:
            return MatchResult(node.value, node, token, cuts)
        if self._on_cpu:  # numpy's concatenate costs a fraction of torch.cat's here
            return MatchResult(torch.from_numpy(np.concatenate([p.host for p in path])), node,
                               token, cuts)
        return MatchResult(torch.cat([p.value for p in path]), node, token, cuts)

    def peek(self, key: object) -> tuple[int, int]:
        """(hit, token-level hit) for `key` without touching or splitting anything: the hit
        `match_prefix` would give now, and what a token-granular cache holding the same
        content would match (no rule of a side pool applied).

        The token-level hit also counts the tokens that match inside the next stored page,
        which the page-aligned match must give up: their difference is the reuse this page
        size misses."""
        hit, token_hit, _, _ = self._walk(as_key(key))
        return hit, token_hit

    def rule_cuts(self, key: object) -> tuple[int, ...]:
        """Where the match rules cut a match of `key`, read-only, in tokens of the key: first
        the page-aligned prefix whose full-attention KV the tree holds, then for each kind in
        order the longest prefix of the cut before it that the kind's rule lets a match end
        at (`PoolKind.rule_walker`). Each is <= the one before; the hit `match_prefix` gives
        is <= the last, the difference being data a side pool evicted (capacity). Empty with
        no side pool or the cache off."""
        if not self.kinds or self.disable:
            return ()
        return self._walk(as_key(key), rules=True)[3]

    def peek_evictable(self, key: object) -> tuple[int, int]:
        """(hit, the part of it that is evictable now). Locking the match moves that part out
        of `evictable_size()`: admission must not count it as memory it can free and as
        prefix it already has (SGLang re-checks its budget after locking)."""
        hit, _, evictable, _ = self._walk(as_key(key))
        return hit, evictable

    def _walk(self, key: np.ndarray,
              rules: bool = False) -> tuple[int, int, int, tuple[int, ...]]:
        """(hit, token-level hit, evictable part of the hit, the rules' cuts), read-only.
        Locks cover root paths, so the unlocked nodes of a match are a suffix of it. The hit
        is page-aligned and, with side pools, ends at the last node every kind's walker
        accepted. The cuts (`rule_cuts`) only with `rules` and side pools, else ()."""
        if self.disable or len(key) == 0:
            return 0, 0, 0, (0,) * (len(self.kinds) + 1) if rules and self.kinds else ()
        ps, size = self.page_size, len(key)
        walkers: list[Walker] | tuple[()] = ()
        rulers: list[Walker] | tuple[()] = ()
        if self.kinds:  # full attention builds none of this
            walkers = [kind.walker() for kind in self.kinds]
            if rules:
                rulers = [kind.rule_walker() for kind in self.kinds]
        cuts = [0] * len(rulers)
        node, pos, evictable = self.root, 0, 0
        hit = hit_evictable = 0
        token = -1
        while pos < size:
            children = node.children
            child = children.get(self._child_key(key, pos)) if children is not None and (
                ps == 1 or pos + ps <= size) else None
            if child is None:  # no whole-page match: the best partial first page
                token = pos + partial_page_hit(node, key, pos)
                break
            m = common_prefix_len(child.key, key[pos:])
            whole = m == len(child.key)
            aligned = m if whole else m - m % ps
            if child.lock_ref == 0:
                evictable += aligned
            if walkers:
                ok = True
                for accept in walkers:  # each walker sees every node (they count along)
                    ok = accept(child, aligned, whole) and ok
                if ok:
                    hit, hit_evictable = pos + aligned, evictable
                if rulers:  # nested: kind i's cut also passes the rules of the kinds before
                    ok = True
                    for i, accept in enumerate(rulers):
                        ok = accept(child, aligned, whole) and ok
                        if ok:
                            cuts[i] = pos + aligned
            if not whole:
                token, pos = pos + m, pos + aligned
                break
            node, pos = child, pos + m
        if token < 0:
            token = pos
        if not walkers:
            return pos, token, evictable, ()
        return hit, token, hit_evictable, (pos, *cuts) if rulers else ()

    # -- insertion -------------------------------------------------------------------------
    def insert(
        self, key: object, value: torch.Tensor | np.ndarray, below: TreeNode | None = None,
        depth: int = 0,
    ) -> tuple[int, TreeNode]:
        """Cache `value[i]` as the slot of token key[i] (both floored to whole pages).

        Returns how many leading tokens were already cached, and the node whose path ends
        exactly at the inserted length (what a request that keeps running locks instead of
        matching again). The caller still owns its slots for the cached range and must free
        them (they duplicate the tree's); the rest of `value` now belongs to the tree.
        `below`: a node `depth` deep on key's path (a request's locked match): the walk starts
        there, touching root..below as the full walk would, without comparing those keys
        again."""
        key = as_key(key)
        if len(value) < len(key):
            raise ValueError(f"value has {len(value)} slots for {len(key)} tokens")
        if self.disable:
            return 0, self.root
        n = len(key) - len(key) % self.page_size
        self._clock += 1
        node, pos = self.root, 0
        if below is not None and below is not self.root:
            if not 0 < depth <= n or depth % self.page_size:
                raise ValueError(f"insert below depth {depth} of a {n}-token key")
            for above in below.path_to_root():
                above.last_access = self._clock
            node, pos = below, depth
        while pos < n:
            children = node.children
            child = children.get(self._child_key(key, pos)) if children is not None else None
            if child is None:
                slots, host = self._own_copy(value, pos, n)
                leaf = self._new_node(frozen(key[pos:n]), slots, node, host)
                if self._is_evictable_leaf(node):
                    self._evictable_leaves.discard(node)
                self._add_child(node, leaf)
                if self.kv_events is not None:
                    self.kv_events(True, leaf)
                self._evictable += n - pos
                self._mark_leaf(leaf)
                return pos, leaf
            m = self._match_len(child.key, key[pos:n])
            child.last_access = self._clock
            if m < len(child.key):
                upper = self.split(child, m)
                if self._is_evictable_leaf(child):  # touched too: re-key its heap entry
                    self._mark_leaf(child)
                child = upper
            node, pos = child, pos + m
        if self._is_evictable_leaf(node):
            self._mark_leaf(node)
        return pos, node

    def _own_copy(self, value: torch.Tensor | np.ndarray, start: int,
                  end: int) -> tuple[torch.Tensor | None, np.ndarray | None]:
        """An int64 copy of value[start:end], slots the tree will own (from an int32
        page-table row, say): on CPU a numpy array only (the node makes its tensor when first
        asked), on a device a tensor. On CPU the slicing and copy go through numpy, whose
        per-call cost is a fraction of torch's; callers may pass a numpy view."""
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                return value[start:end].to(torch.int64, copy=True), None
            value = value.numpy()
        host = value[start:end].astype(np.int64)
        if self._on_cpu:
            return None, host
        return torch.from_numpy(host).to(self.device), None

    def touch_path(self, node: TreeNode) -> None:
        """What `match_prefix` does to the path root..node when the match ends exactly at
        `node`: a new LRU clock on every node, one more hit each, a fresh heap entry if `node`
        is an evictable leaf. Callers that already hold that node use it to skip the walk."""
        if self.disable or node is self.root:
            return
        self._clock += 1
        leaf = self._is_evictable_leaf(node)
        for n in node.path_to_root():
            n.last_access = self._clock
            n.hit_count += 1
        if leaf:  # after the touch: the heap entry carries the new priority
            self._mark_leaf(node)

    # -- locks -----------------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect the path root..node from eviction while a request uses it."""
        if self.disable or node is self.root:
            return
        node.own_locks += 1
        for n in node.path_to_root():
            if n.lock_ref == 0:
                self._evictable -= len(n.key)
                self._protected += len(n.key)
                self._evictable_leaves.discard(n)
            n.lock_ref += 1

    def dec_lock_ref(self, node: TreeNode) -> None:
        if self.disable or node is self.root:
            return
        if node.own_locks <= 0:
            raise ValueError(f"dec_lock_ref on {node!r}, which holds no lock")
        node.own_locks -= 1
        for n in node.path_to_root():
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self._evictable += len(n.key)
                self._protected -= len(n.key)
                if not n.children:
                    self._mark_leaf(n)

    # -- eviction --------------------------------------------------------------------------
    def evict(self, num_tokens: int, sizes: list[int] | None = None) -> int:
        """Evict unlocked leaves (by the eviction priority) until `num_tokens` are freed or
        nothing evictable is left; whole nodes go, so it may free more. Returns tokens freed;
        their pages go back to the allocator. `sizes`, if given, receives each evicted node's
        length in eviction order. With side pools each evicted leaf gives back their data too,
        and then the leaves left behind that no kind can use are deleted (counted in the
        return, not in `sizes`)."""
        if self.disable or num_tokens <= 0 or not self._evictable_leaves:
            return 0
        prio, kinds = self._priority, self.kinds
        heap = self._heap
        parents: list[TreeNode] = []
        on_cpu, ps = self._on_cpu, self.page_size
        freed_host: list[np.ndarray] = []  # on CPU: the first slot of each page
        freed: list[torch.Tensor] = []  # on a device: the slots
        evicted = 0
        while evicted < num_tokens and heap:
            key, leaf = heapq.heappop(heap)
            if leaf not in self._evictable_leaves or key != prio(leaf):
                continue  # stale entry
            if self.on_evict is not None:
                self.on_evict(leaf)
            if self.kv_events is not None:
                self.kv_events(False, leaf)
            for kind in kinds:
                kind.removed(leaf)
            # each page_size-th slot starts one of the node's whole pages
            if on_cpu and leaf.host is not None:
                freed_host.append(leaf.host[::ps])
            else:
                freed.append(leaf.value)
            evicted += len(leaf.key)
            if sizes is not None:
                sizes.append(len(leaf.key))
            parent = leaf.parent
            assert parent is not None  # an evictable leaf is never the root
            self._remove_child(parent, leaf)
            self._evictable_leaves.discard(leaf)
            self._evictable -= len(leaf.key)
            if kinds:
                parents.append(parent)
            if self._is_evictable_leaf(parent):
                self._mark_leaf(parent)
        if self.allocator is not None:
            # node values are runs of whole pages owned by the tree alone
            if freed_host:
                starts = freed_host[0] if len(freed_host) == 1 else np.concatenate(freed_host)
                self.allocator.push_host(starts // ps if ps > 1 else starts)
            if freed:
                self.allocator.free_segments(torch.cat(freed))
        for parent in parents:
            evicted += self.drop_dead_leaves(parent)
        return evicted

    # -- what side pools' evictions use ---------------------------------------------------------
    def attached(self, node: TreeNode) -> bool:
        """Whether `node` is still linked under its parent (not the root, not removed)."""
        parent = node.parent
        return parent is not None and parent.children is not None \
            and parent.children.get(node.ckey) is node

    def dead(self, node: TreeNode) -> bool:
        """An unlocked leaf that some side pool can no longer use (see `PoolKind.dead`)."""
        return (node is not self.root and not node.children and node.lock_ref == 0
                and any(kind.dead(node) for kind in self.kinds))

    def drop_dead_leaves(self, node: TreeNode) -> int:
        """Delete `node` if it is a dead leaf, then its parent if that is one now, and so on
        up. Returns tokens freed."""
        freed = 0
        while self.attached(node) and self.dead(node):
            parent = node.parent
            assert parent is not None
            freed += self.delete_leaf(node)
            node = parent
        return freed

    def delete_leaf(self, leaf: TreeNode) -> int:
        """Remove an unlocked leaf now: its side pools' data, then its pages. Returns its
        length."""
        if leaf.lock_ref or leaf.children:
            raise ValueError(f"delete_leaf on {leaf!r}, which is locked or has children")
        for kind in self.kinds:
            kind.removed(leaf)
        if self.allocator is not None:
            ps = self.page_size
            slots = leaf.host if leaf.host is not None else leaf.value.cpu().numpy()
            self.allocator.push_host(slots[::ps] // ps if ps > 1 else slots)
        parent = leaf.parent
        assert parent is not None
        self._remove_child(parent, leaf)
        self._evictable_leaves.discard(leaf)
        self._evictable -= len(leaf.key)
        leaf.parent = None
        if self._is_evictable_leaf(parent):
            self._mark_leaf(parent)
        return len(leaf.key)

    # -- introspection -----------------------------------------------------------------------
    def nodes(self) -> list[TreeNode]:
        """All non-root nodes (DFS order)."""
        out, stack = [], list(self.root.child_nodes())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.child_nodes())
        return out

    def all_values(self) -> torch.Tensor:
        nodes = self.nodes()
        if nodes and all(n.host is not None for n in nodes):  # CPU: no tensor per node
            return torch.from_numpy(np.concatenate([n.host for n in nodes
                                                    if n.host is not None]))
        vals = [n.value for n in nodes]
        return torch.cat(vals) if vals else torch.empty(0, dtype=torch.int64, device=self.device)

    def check_invariants(self) -> None:
        """Structure, sizes, locks and evictable set agree with a full recomputation."""
        ps = self.page_size
        if self.root.lock_ref != 1:
            raise InvariantError(f"root lock_ref is {self.root.lock_ref}, must be 1")
        evictable = protected = 0
        leaves = set()
        for node in self.nodes():
            slots = node.host if node.host is not None else node.value
            if len(node.key) == 0 or len(node.key) != len(slots):
                raise InvariantError(f"{node!r}: key length {len(node.key)} != value length")
            if len(node.key) % ps:
                raise InvariantError(f"{node!r}: length not a multiple of page_size {ps}")
            siblings = None if node.parent is None else node.parent.children
            if (siblings is None or node.ckey != self._child_key(node.key)
                    or siblings.get(node.ckey) is not node):
                raise InvariantError(f"{node!r}: parent's child entry does not point to it")
            if node.children == {} or node.by_first_token == {}:
                raise InvariantError(f"{node!r}: keeps an empty child map (None until a child)")
            if node.lock_ref < 0 or node.own_locks < 0:
                raise InvariantError(f"{node!r}: negative lock count")
            below = sum(c.lock_ref for c in node.child_nodes())
            if node.lock_ref != node.own_locks + below:
                raise InvariantError(
                    f"{node!r}: lock_ref {node.lock_ref} != own {node.own_locks} + children {below}"
                )
            if node.lock_ref == 0:
                evictable += len(node.key)
            else:
                protected += len(node.key)
            if self._is_evictable_leaf(node):
                leaves.add(node)
        if (evictable, protected) != (self._evictable, self._protected):
            raise InvariantError(
                f"sizes: counters ({self._evictable}, {self._protected}) != recomputed "
                f"({evictable}, {protected})"
            )
        if leaves != self._evictable_leaves:
            raise InvariantError("evictable-leaf set differs from a recomputation")
        values = self.all_values()
        if len(torch.unique(values)) != len(values):
            raise InvariantError("a slot is owned by two tree nodes")
        if ps > 1 and len(values):
            starts = values.view(-1, ps)
            if bool((starts[:, 0] % ps != 0).any()) or bool(
                (starts - starts[:, :1] != torch.arange(ps, device=values.device)).any()
            ):
                raise InvariantError("a tree node holds a partial or misaligned page")
        if self.allocator is not None and len(values):
            pages = values // ps if ps > 1 else values
            if bool(self.allocator.is_page_free(pages).any()):
                raise InvariantError("a tree slot's page is on the allocator's free list")
