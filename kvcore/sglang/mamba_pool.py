"""MambaPool: the fixed-size state slots of a hybrid model's linear-attention / Mamba layers.

Every request running on such a model holds one slot (its conv + recurrent state over all
state layers: `HybridLayout.state_bytes_per_request`), whatever its length, and the prefix
cache keeps more slots as snapshots on radix nodes (kvcore/sglang/mamba_state.py). A prefix
hit copies the cached snapshot into the request's own slot (copy on write), so a cached
state is never written by a running request.

This follows SGLang v0.5's `MambaPool` in python/sglang/srt/mem_cache/memory_pool.py (free
slot list, `alloc`, `free`, `copy_from`; `fork_from` = alloc + copy) as `HybridReqToTokenPool`
uses it. Slots are ids 0 .. size-1 on a stack (LIFO reuse, as the KV allocator). With
`store=True` a real state buffer of `state_bytes` bytes per slot is allocated (tests, small
pools) and copies move its bytes; otherwise the pool is shape-only, like the KV pool.

Invariants (`check_invariants`): the free stack holds distinct ids in [0, size); the free
mask agrees with it; free + in use == size.
"""

from __future__ import annotations

import numpy as np
import torch

from kvcore.contract.validation import InvariantError, non_negative_int, positive_int

__all__ = ["MambaPool"]


class MambaPool:
    """`size` state slots of `state_bytes` bytes each."""

    def __init__(self, size: int, state_bytes: int, device: str | torch.device = "cpu",
                 store: bool = False) -> None:
        self.size = positive_int("mamba state slots", size)
        self.state_bytes = positive_int("state_bytes", state_bytes)
        self._stack = np.arange(self.size - 1, -1, -1, dtype=np.int64)  # slot 0 on top
        self._top = self.size
        self._is_free = np.ones(self.size, dtype=bool)
        self.copies = 0  # copy-on-write copies made (a hit's state into the request's slot)
        self.buffer: torch.Tensor | None = (
            torch.zeros((self.size, self.state_bytes), dtype=torch.uint8,
                        device=torch.device(device)) if store else None)

    def available_size(self) -> int:
        """Free slots."""
        return self._top

    def used_size(self) -> int:
        return self.size - self._top

    def alloc(self) -> int | None:
        """One free slot, or None (nothing changed)."""
        if self._top == 0:
            return None
        self._top -= 1
        slot = int(self._stack[self._top])
        self._is_free[slot] = False
        return slot

    def free(self, slot: int) -> None:
        """Give a slot back; an id out of range or already free is a ValueError."""
        slot = non_negative_int("mamba slot", slot)
        if slot >= self.size or self._is_free[slot]:
            raise ValueError(f"mamba slot {slot} is out of range or already free "
                             f"(size {self.size})")
        self._stack[self._top] = slot
        self._top += 1
        self._is_free[slot] = True

    def copy(self, src: int, dst: int) -> None:
        """Copy the state in `src` into `dst` (both in use): SGLang's copy_from at a cache hit
        and fork_from when a running request's state is snapshotted into the cache."""
        for name, s in (("src", src), ("dst", dst)):
            if not 0 <= s < self.size or self._is_free[s]:
                raise ValueError(f"copy {name} slot {s} is not in use")
        if src == dst:
            raise ValueError(f"copy from slot {src} onto itself")
        if self.buffer is not None:
            self.buffer[dst].copy_(self.buffer[src])
        self.copies += 1

    def in_use(self) -> np.ndarray:
        """Ids of the slots in use (a copy)."""
        return np.flatnonzero(~self._is_free)

    def check_invariants(self) -> None:
        free = self._stack[: self._top]
        if not 0 <= self._top <= self.size:
            raise InvariantError(f"mamba free-stack top {self._top} outside [0, {self.size}]")
        if len(free) and (free.min() < 0 or free.max() >= self.size):
            raise InvariantError("the mamba free list holds an id out of range")
        if len(np.unique(free)) != len(free):
            raise InvariantError("a mamba slot is on the free list twice")
        if int(self._is_free.sum()) != self._top or not self._is_free[free].all():
            raise InvariantError("mamba free mask disagrees with the free list")
