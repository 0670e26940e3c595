"""A counting-only stand-in for `paged-nocache` (block counters, as Vidur keeps): no page ids,
no page table, no tensors. Lives in the benchmark only, to measure what the real allocator
costs end to end; it is not offered to users."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvcore.contract.breakdown import MemoryBreakdown, page_growth_profile, tail_split
from kvcore.contract.capabilities import DecodeStretch
from kvcore.contract.policy import AdmitResult, PolicyConfig


class CountingPolicy(DecodeStretch):
    name = "counting"

    def __init__(self, config: PolicyConfig) -> None:
        ps = config.page_size
        super().__init__(config.kv_tokens // ps * ps, ps)
        self.free_pages = config.kv_tokens // ps
        self.max_requests = config.max_requests
        self.written_of: dict[int, int] = {}
        self.final_of: dict[int, int] = {}

    def _pages(self, n: int) -> int:
        return -(-n // self.page_size)

    def admit(self, rid, token_ids, final_len, max_new_tokens):
        if len(self.written_of) >= self.max_requests:
            return None
        self.written_of[rid] = 0
        self.final_of[rid] = final_len
        return AdmitResult(len(self.written_of), 0, 0)

    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        need = sum(self._pages(t) - self._pages(self.written_of[r])
                   for r, t in zip(rids, target_lens, strict=True))
        if need > self.free_pages:
            return False
        self.free_pages -= need
        for r, t in zip(rids, target_lens, strict=True):
            self.written_of[r] = t
        return True

    def decode(self, rids: Sequence[int]) -> bool:
        return self.extend(rids, [self.written_of[r] + 1 for r in rids])

    def decode_steps(self, rids, n, head_reservation):
        profile = self.decode_profile(rids, n, head_reservation)
        self.extend(rids, [self.written_of[r] + n for r in rids])
        return profile

    def decode_profile(self, rids, n, head_reservation):
        # the same page-growth profile paged reports: a stand-in must measure the same run
        w = np.fromiter((self.written_of[r] for r in rids), dtype=np.int64, count=len(rids))
        f = np.fromiter((self.final_of[r] for r in rids), dtype=np.int64, count=len(rids))
        ps = self.page_size
        profile, _ = page_growth_profile(self.breakdown(head_reservation), w, f,
                                         -(-w // ps) * ps, ps, n)
        return profile

    def finish(self, rid, token_ids) -> None:
        self.release(rid)

    def release(self, rid) -> None:
        self.free_pages += self._pages(self.written_of.pop(rid))
        del self.final_of[rid]

    def written(self, rid) -> int:
        return self.written_of[rid]

    def available_tokens(self) -> int:
        return self.free_pages * self.page_size

    def evictable_tokens(self) -> int:
        return 0

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        w = np.fromiter(self.written_of.values(), dtype=np.int64, count=len(self.written_of))
        f = np.fromiter(self.final_of.values(), dtype=np.int64, count=len(self.final_of))
        reserved, rounding = tail_split(-(-w // self.page_size) * self.page_size, f, w)
        return MemoryBreakdown.for_pages(self.capacity, int(w.sum()), 0, int(reserved.sum()),
                                         int(rounding.sum()), self.free_pages * self.page_size)

    def page_table_entries(self) -> int:
        return sum(self._pages(w) for w in self.written_of.values())

    def page_table_bytes(self) -> int:
        return 0  # counters only: no page table

    def check_invariants(self) -> None:
        pass
