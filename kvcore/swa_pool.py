"""SWAPagePool: a hybrid model's full-attention pool and sliding-window (SWA) pool side by side.

SGLang keeps two KV pools for a model with sliding-window layers: the full layers' pool and a
smaller SWA pool (`--swa-full-tokens-ratio`), and one allocator over both,
`SWATokenToKVPoolAllocator` (SGLang v0.5, python/sglang/srt/mem_cache/swa_memory_pool.py, later
mem_cache/allocator/swa.py): every allocation takes a slot in each and records
`full_to_swa_index_mapping[full] = swa`; `free_swa` frees the SWA slots of tokens that left
every window (or of tombstoned radix nodes) and clears their mapping, `free` frees both.
The page table and the radix tree hold full slots only; the SWA slot is found through the map.

Here both pools are real kvcore `PagedAllocator`s and the map is per page (SGLang's is per
token; pages are allocated and freed whole, so one entry per page says the same). Chunked
local attention layers are served by the same SWA pool (SGLang runs Llama 4's chunked layers
as its hybrid SWA path; kvcore/hybrid_plan.py sizes them together).

Invariants (`check_invariants`), besides each allocator's own:

    a mapped full page is in use; its SWA page is in use and mapped from no other full page
    SWA pages in use == full pages mapped
"""

from __future__ import annotations

import numpy as np
import torch

from kvcore.allocator import PagedAllocator
from kvcore.validation import InvariantError, non_negative_int, positive_int

__all__ = ["SWAPagePool"]


class SWAPagePool:
    """`full_pages` full-attention pages and `swa_pages` SWA pages (0: no SWA layers)."""

    def __init__(self, full_pages: int, swa_pages: int, page_size: int,
                 device: str | torch.device = "cpu") -> None:
        self.page_size = positive_int("page_size", page_size)
        self.full = PagedAllocator(positive_int("full pages", full_pages), page_size, device)
        self.swa = (PagedAllocator(swa_pages, page_size, device)
                    if non_negative_int("swa pages", swa_pages) else None)
        self.full_to_swa = np.zeros(full_pages + 1, dtype=np.int64)  # 0: no SWA page

    # -- sizes -----------------------------------------------------------------------------
    def swa_free_pages(self) -> int:
        return self.swa.free_page_count() if self.swa is not None else 0

    def swa_used_pages(self) -> int:
        return self.swa.num_pages - self.swa.free_page_count() if self.swa is not None else 0

    def can_take(self, pages: int) -> tuple[bool, bool]:
        """(full pool has `pages` free pages, SWA pool has them too or there is none)."""
        return (self.full.free_page_count() >= pages,
                self.swa is None or self.swa.free_page_count() >= pages)

    # -- allocation ------------------------------------------------------------------------
    def map_new(self, full_pages: np.ndarray) -> None:
        """Give each of `full_pages` (just allocated by `self.full`) a fresh SWA page. The
        caller checked `can_take` first (an allocation of both is one step in SGLang)."""
        if self.swa is None or not len(full_pages):
            return
        if self.full_to_swa[full_pages].any():
            raise ValueError("map_new on a full page that already has an SWA page")
        swa = self.swa.pop_host(len(full_pages))
        if swa is None:
            raise ValueError(f"the SWA pool has {self.swa.free_page_count()} free pages, "
                             f"{len(full_pages)} asked for")
        self.full_to_swa[full_pages] = swa

    def free_swa(self, full_pages: np.ndarray) -> int:
        """Free the SWA pages of those of `full_pages` that have one (a token left every
        window, or a radix node is tombstoned); the full pages stay. Returns pages freed."""
        if self.swa is None or not len(full_pages):
            return 0
        swa = self.full_to_swa[full_pages]
        held = swa > 0
        if held.any():
            self.swa.push_host(swa[held])
            self.full_to_swa[full_pages[held]] = 0
        return int(held.sum())

    def free(self, full_pages: np.ndarray) -> None:
        """Free whole full pages and their SWA pages where they still have one."""
        if not len(full_pages):
            return
        self.free_swa(full_pages)
        self.full.push_host(full_pages)

    def move_swa(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Hand the SWA pages of full pages `src` to full pages `dst` (which have none): a
        request's fresh SWA KV revives a tombstoned radix node whose full KV it duplicates."""
        if self.swa is None:
            return
        if (self.full_to_swa[src] == 0).any() or self.full_to_swa[dst].any():
            raise ValueError("move_swa needs SWA pages on src and none on dst")
        self.full_to_swa[dst] = self.full_to_swa[src]
        self.full_to_swa[src] = 0

    def has_swa(self, full_pages: np.ndarray) -> np.ndarray:
        """Which of `full_pages` have an SWA page."""
        return self.full_to_swa[full_pages] > 0

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.full.check_invariants()
        if self.swa is None:
            if self.full_to_swa.any():
                raise InvariantError("an SWA mapping exists without an SWA pool")
            return
        self.swa.check_invariants()
        mapped = np.flatnonzero(self.full_to_swa)
        swa = self.full_to_swa[mapped]
        if len(swa) and np.bincount(swa).max() > 1:
            raise InvariantError("an SWA page is mapped from two full pages")
        if len(mapped) and bool(self.full.is_page_free(torch.from_numpy(mapped)).any()):
            raise InvariantError("a free full page still maps an SWA page")
        if len(swa) and bool(self.swa.is_page_free(torch.from_numpy(swa)).any()):
            raise InvariantError("a mapped SWA page is on the SWA free list")
        if len(mapped) != self.swa_used_pages():
            raise InvariantError(f"SWA pages in use {self.swa_used_pages()} != mapped "
                                 f"{len(mapped)} (a leak)")
