"""SWAPagePool: a hybrid model's full-attention pages and sliding-window (SWA) pages, allocated
together.

SGLang keeps two KV pools for a model with sliding-window layers: the full layers' pool and a
smaller SWA pool (`--swa-full-tokens-ratio`), behind one allocator over both,
`SWATokenToKVPoolAllocator` (SGLang v0.5, python/sglang/srt/mem_cache/swa_memory_pool.py, later
mem_cache/allocator/swa.py): every allocation takes a slot in each and records
`full_to_swa_index_mapping[full] = swa`; `free_swa` frees the SWA slots of tokens that left
every window (or of tombstoned radix nodes) and clears their mapping, `free` frees both.
The page table and the radix tree hold full slots only; the SWA slot is found through the map.

Here the pool is a `PagedAllocator` over the full pages whose every allocation also pops SWA
pages and whose every free also frees the SWA pages still mapped, so the manager and the radix
cache drive it exactly as they drive the full-attention layout's allocator; the SWA pool is a
second `PagedAllocator` (`swa`). The map is per page (SGLang's is per token; pages are
allocated and freed whole, so one entry per page says the same). Chunked local attention
layers are served by the same SWA pool (SGLang runs Llama 4's chunked layers as its hybrid SWA
path; kvcore/model/hybrid_plan.py sizes them together).

Invariants (`check_invariants`), besides each allocator's own:

    a mapped full page is in use; its SWA page is in use and mapped from no other full page
    SWA pages in use == full pages mapped
"""

from __future__ import annotations

import numpy as np
import torch

from kvcore.contract.validation import InvariantError, positive_int
from kvcore.sglang.allocator import IntsLike, PagedAllocator

__all__ = ["SWAPagePool"]


class SWAPagePool(PagedAllocator):
    """`full_pages` full-attention pages (this allocator's) and `swa_pages` SWA pages."""

    def __init__(self, full_pages: int, swa_pages: int, page_size: int,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(positive_int("full pages", full_pages), page_size, device)
        self.swa = PagedAllocator(positive_int("swa pages", swa_pages), page_size, device)
        self.full_to_swa = np.zeros(full_pages + 1, dtype=np.int64)  # 0: no SWA page

    # -- sizes -----------------------------------------------------------------------------
    def swa_free_pages(self) -> int:
        return self.swa.free_page_count()

    def swa_used_pages(self) -> int:
        return self.swa.num_pages - self.swa.free_page_count()

    # -- allocation: a full page and an SWA page together ----------------------------------
    def pop_host(self, n: int) -> np.ndarray | None:
        """`n` full pages, each given a fresh SWA page; None (nothing changed) when either
        pool is short (an allocation of both is one step in SGLang)."""
        if n > self.swa.free_page_count():
            return None
        pages = super().pop_host(n)
        if pages is None or not len(pages):
            return pages
        swa = self.swa.pop_host(n)
        assert swa is not None  # checked above
        self.full_to_swa[pages] = swa
        return pages

    # -- frees: the SWA pages still mapped go with their full pages -------------------------
    def push_host(self, pages: np.ndarray) -> None:
        self.free_swa(pages)
        super().push_host(pages)

    def free_page(self, page: int) -> None:
        swa = int(self.full_to_swa[page]) if 0 <= page < len(self.full_to_swa) else 0
        if swa:
            self.swa.free_page(swa)
            self.full_to_swa[page] = 0
        super().free_page(page)

    def free_pages(self, pages: IntsLike, distinct: bool = False) -> None:
        ids = torch.as_tensor(pages, dtype=torch.int64).cpu().numpy()
        if len(ids) and ids.min() >= 1 and ids.max() <= self.num_pages:
            self.free_swa(np.unique(ids))
        super().free_pages(pages, distinct)

    def free_swa(self, full_pages: np.ndarray) -> int:
        """Free the SWA pages of those of `full_pages` that have one (a token left every
        window, or a radix node is tombstoned); the full pages stay. Returns pages freed."""
        if not len(full_pages):
            return 0
        swa = self.full_to_swa[full_pages]
        held = swa > 0
        if held.any():
            self.swa.push_host(swa[held])
            self.full_to_swa[full_pages[held]] = 0
        return int(held.sum())

    def move_swa(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Hand the SWA pages of full pages `src` to full pages `dst` (which have none): a
        request's fresh SWA KV revives a tombstoned radix node whose full KV it duplicates."""
        if (self.full_to_swa[src] == 0).any() or self.full_to_swa[dst].any():
            raise ValueError("move_swa needs SWA pages on src and none on dst")
        self.full_to_swa[dst] = self.full_to_swa[src]
        self.full_to_swa[src] = 0

    def has_swa(self, full_pages: np.ndarray) -> np.ndarray:
        """Which of `full_pages` have an SWA page."""
        return self.full_to_swa[full_pages] > 0

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        super().check_invariants()
        self.swa.check_invariants()
        mapped = np.flatnonzero(self.full_to_swa)
        swa = self.full_to_swa[mapped]
        if len(swa) and np.bincount(swa).max() > 1:
            raise InvariantError("an SWA page is mapped from two full pages")
        if len(mapped) and bool(self.is_page_free(torch.from_numpy(mapped)).any()):
            raise InvariantError("a free full page still maps an SWA page")
        if len(swa) and bool(self.swa.is_page_free(torch.from_numpy(swa)).any()):
            raise InvariantError("a mapped SWA page is on the SWA free list")
        if len(mapped) != self.swa_used_pages():
            raise InvariantError(f"SWA pages in use {self.swa_used_pages()} != mapped "
                                 f"{len(mapped)} (a leak)")
