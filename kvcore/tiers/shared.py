"""A lower KV tier shared by several device pools: one host / storage store every replica of
a fleet reads and writes (Mooncake Store, an LMCache server, SGLang HiCache's L3 backends).

What the engines do with such a store, and so what this module models:
* SGLang HiCache keeps GPU (L1), host (L2) and a storage backend (L3: Mooncake, 3FS, NIXL,
  file); with a distributed backend such as Mooncake, L3 is one pool that every instance
  reaches (sgl-project/sglang docs/advanced_features/hicache_best_practices.md and
  python/sglang/srt/mem_cache/storage/mooncake_store/README.md, SGLang main as read in late
  2026). Its host pages are backed up to L3 as soon as their host write completes
  (`HiRadixCache.writing_check` calls `write_backup_storage` when storage is enabled,
  python/sglang/srt/mem_cache/hiradix_cache.py), and a request's L3 hit is prefetched into
  the host before it is loaded onto the GPU.
* vLLM's MooncakeStoreConnector uses the store as a KV pool shared by instances, keyed by
  the block hashes, so that instances share each other's cached blocks (docs.vllm.ai
  features/mooncake_store_connector_usage, vLLM v0.21.0).

So the shared tier takes the place of a replica's storage tier (the level below its host
tier): each replica's tier controller (kvcore/tiers/controller.py) reads it exactly as it reads
a storage tier of its own (a prefix past its host hit, copied to the host first), and its
host store writes through into it (`through`: every page the host writes is stored below as
well) besides spilling what it evicts. The store is keyed the way the policy keys prefixes
(`TierTree` by token path, `BlockTier` by block-hash chain), so a prefix one replica wrote is
a hit for any replica whose prompt starts with it.

`SharedTier` owns the one store and hands each replica a `SharedView`: the store itself to
every caller except for `pages_in`, which counts the pages that replica wrote (its link's
traffic into the store, which its engine charges). The store's capacity, LRU order and
content are the one store's.
"""

from __future__ import annotations

from typing import Any

from kvcore.contract.validation import InvariantError
from kvcore.tiers.controller import TierController


class SharedView:
    """One replica's handle on the shared store: every attribute is the store's, but
    `pages_in` counts only the pages this replica's writes put into it."""

    def __init__(self, shared: Any, index: int) -> None:
        self.shared = shared
        self.index = index
        self.pages_in = 0

    def store(self, *args: Any, **kwargs: Any) -> Any:
        """The store's `store`, its written pages counted as this replica's."""
        before = self.shared.pages_in
        out = self.shared.store(*args, **kwargs)
        self.pages_in += self.shared.pages_in - before
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shared, name)


class SharedTier:
    """The store several tier controllers use as their storage tier (see the module
    docstring): `attach` makes a controller's storage this store, written through from its
    host."""

    def __init__(self, store: Any) -> None:
        """`store`: a `TierTree` or `BlockTier` with no tier below it."""
        if store.lower is not None:
            raise ValueError("a shared tier is the lowest tier: it spills into nothing")
        self.store = store
        self.views: list[SharedView] = []

    def attach(self, tiers: TierController[Any, Any]) -> SharedView:
        """`tiers` (a replica's controller, built with a storage tier of the shared size)
        reads and writes this store in place of its own storage tier from now on."""
        if tiers.storage is None:
            raise ValueError("a controller reaches a shared tier through its storage level: "
                             "build it with storage_tokens > 0")
        if tiers.storage.page_size != self.store.page_size:
            raise ValueError(f"a shared tier of pages of {self.store.page_size} tokens read "
                             f"with pages of {tiers.storage.page_size}")
        view = SharedView(self.store, len(self.views))
        self.views.append(view)
        # the view stands in for the store class by delegation (same attributes)
        tiers.storage = view
        tiers.host.lower = view
        tiers.host.through = True
        return view

    @property
    def capacity(self) -> int:
        return int(self.store.capacity)

    @property
    def used(self) -> int:
        return int(self.store.used)

    @property
    def pages_in(self) -> int:
        return int(self.store.pages_in)

    def check_invariants(self) -> None:
        """The store's invariants; nothing held between admissions (a read holds the store
        only while it copies to the host); the views' writes add up to the store's."""
        self.store.check_invariants()
        if self.store.locked:
            raise InvariantError("a shared tier page is held outside an admission")
        if sum(v.pages_in for v in self.views) != self.store.pages_in:
            raise InvariantError(f"the replicas wrote {sum(v.pages_in for v in self.views)} "
                                 f"pages, the shared tier took {self.store.pages_in}")


__all__ = ["SharedTier", "SharedView"]
