"""Address-space placement for the contiguous policies: where a request's one slot range goes.

A placement manages the slot range [0, capacity) and knows nothing about requests. It hands out
contiguous ranges and takes them back, and it can say how the free memory is cut up, which is
what external fragmentation is measured from:

* `first-fit` takes the lowest-addressed hole that fits;
* `best-fit` takes the smallest hole that fits (lowest address among equals);
* `buddy` is a binary buddy system (what the vLLM paper assumes for Orca): allocations are
  rounded up to a power of two, split from larger blocks and coalesced with their buddy when
  freed. The largest block is the maximum context length, which must be a power of two. A
  capacity that is not a multiple of it is cut into naturally aligned power-of-two arenas,
  largest first (15,728 with 2048 = 7 x 2048 + 1024 + 256 + 64 + 32 + 16); buddies never
  coalesce across arenas.

Free and allocated ranges are kept in plain Python lists sorted by address (bisect), so every
operation is O(log n) searches plus O(holes) list moves, with holes bounded by the number of
live requests. External fragmentation is defined once (kvcore/contract/breakdown.py:
`external(need) = sum of |h| over holes h with |h| < need`); each placement computes it from
its own index (sizes in order, or free blocks per order) and `check_invariants` compares the
two.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left, insort
from itertools import pairwise

from kvcore.contract.breakdown import external_fragmentation
from kvcore.contract.registry import Registry
from kvcore.contract.validation import InvariantError, positive_int


class Placement(ABC):
    """Contiguous ranges over [0, capacity): the small interface the contiguous policies use."""

    name: str = ""

    def __init__(self, capacity: int, max_block: int | None = None) -> None:
        self.capacity = positive_int("capacity", capacity)
        self.max_block = None if max_block is None else positive_int("max_block", max_block)
        self._used: dict[int, int] = {}  # start -> allocated block size
        self._free_total = self.capacity

    # -- sizes -----------------------------------------------------------------------------
    def block_size(self, n: int) -> int:
        """Slots an allocation of `n` really takes (its rounding is block_size(n) - n)."""
        return positive_int("n", n)

    # -- allocation ------------------------------------------------------------------------
    @abstractmethod
    def allocate(self, n: int) -> int | None:
        """Start of a free range of block_size(n) slots now owned by the caller, or None (and
        nothing changed) when no hole fits."""

    @abstractmethod
    def free(self, start: int) -> int:
        """Give back the block starting at `start`; returns its size. Coalesces neighbours."""

    def size_of(self, start: int) -> int:
        """Size of the allocated block at `start`."""
        try:
            return self._used[start]
        except KeyError:
            raise ValueError(f"start {start} is not an allocated block") from None

    def allocated(self) -> dict[int, int]:
        """Allocated blocks, start -> size (a copy)."""
        return dict(self._used)

    # -- observation -----------------------------------------------------------------------
    def free_total(self) -> int:
        return self._free_total

    @abstractmethod
    def largest_free_hole(self) -> int:
        """The largest allocation that could succeed now (largest hole, or largest free buddy
        block: adjacent free blocks that are not buddies cannot be handed out as one)."""

    @abstractmethod
    def holes(self) -> list[tuple[int, int]]:
        """Free ranges (start, size) sorted by start; for buddy the free blocks themselves."""

    @abstractmethod
    def external(self, n: int) -> int:
        """Free slots in holes (buddy: free blocks) too small for an allocation of `n`:
        `external_fragmentation(hole sizes, n)`, from the placement's own index."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise InvariantError if the free and allocated ranges do not tile [0, capacity)."""

    def _check_tiling(self, free_ranges: list[tuple[int, int]]) -> None:
        ranges = sorted([*free_ranges, *self._used.items()])
        pos = 0
        for start, size in ranges:
            if size <= 0:
                raise InvariantError(f"{self.name}: empty range at {start}")
            if start != pos:
                kind = "overlap" if start < pos else "leak"
                raise InvariantError(f"{self.name}: {kind} at slot {min(start, pos)}")
            pos = start + size
        if pos != self.capacity:
            raise InvariantError(f"{self.name}: ranges end at {pos}, capacity {self.capacity}")
        free = sum(size for _, size in free_ranges)
        if free != self._free_total:
            raise InvariantError(f"{self.name}: free total {self._free_total}, holes sum {free}")
        sizes = sorted(size for _, size in free_ranges)
        needs = {1, self.capacity + 1} if not sizes else {
            1, sizes[0], sizes[0] + 1, sizes[len(sizes) // 2] + 1, sizes[-1], sizes[-1] + 1}
        for need in needs:
            if self.external(need) != external_fragmentation(sizes, need):
                raise InvariantError(
                    f"{self.name}: external({need}) = {self.external(need)}, but the holes "
                    f"smaller than {need} hold {external_fragmentation(sizes, need)}"
                )


class _HoleList(Placement):
    """Free holes sorted by start (for first-fit and coalescing) and by (size, start)."""

    def __init__(self, capacity: int, max_block: int | None = None) -> None:
        super().__init__(capacity, max_block)
        self._starts: list[int] = [0]
        self._size: dict[int, int] = {0: self.capacity}
        self._by_size: list[tuple[int, int]] = [(self.capacity, 0)]

    @abstractmethod
    def _pick(self, n: int) -> int | None:
        """Start of the hole to carve `n` slots from."""

    def allocate(self, n: int) -> int | None:
        n = positive_int("n", n)
        if not self._by_size or self._by_size[-1][0] < n:
            return None
        start = self._pick(n)
        if start is None:
            return None
        size = self._size.pop(start)
        del self._by_size[bisect_left(self._by_size, (size, start))]
        i = bisect_left(self._starts, start)
        if size > n:  # the rest stays a hole, in the same place in address order
            self._starts[i] = start + n
            self._size[start + n] = size - n
            insort(self._by_size, (size - n, start + n))
        else:
            del self._starts[i]
        self._used[start] = n
        self._free_total -= n
        return start

    def free(self, start: int) -> int:
        size = self.size_of(start)
        del self._used[start]
        self._free_total += size
        starts = self._starts
        i = bisect_left(starts, start)
        new_start, new_size = start, size
        if i > 0 and starts[i - 1] + self._size[starts[i - 1]] == start:
            i -= 1
            prev = starts[i]
            prev_size = self._size.pop(prev)
            del self._by_size[bisect_left(self._by_size, (prev_size, prev))]
            del starts[i]
            new_start, new_size = prev, prev_size + size
        if i < len(starts) and starts[i] == start + size:
            nxt = starts[i]
            nxt_size = self._size.pop(nxt)
            del self._by_size[bisect_left(self._by_size, (nxt_size, nxt))]
            del starts[i]
            new_size += nxt_size
        starts.insert(i, new_start)
        self._size[new_start] = new_size
        insort(self._by_size, (new_size, new_start))
        return size

    def largest_free_hole(self) -> int:
        return self._by_size[-1][0] if self._by_size else 0

    def holes(self) -> list[tuple[int, int]]:
        return [(s, self._size[s]) for s in self._starts]

    def external(self, n: int) -> int:
        total = 0
        for size, _ in self._by_size:
            if size >= n:
                break
            total += size
        return total

    def check_invariants(self) -> None:
        starts = self._starts
        if starts != sorted(starts) or len(set(starts)) != len(starts):
            raise InvariantError(f"{self.name}: hole starts not sorted or duplicated")
        if set(starts) != set(self._size):
            raise InvariantError(f"{self.name}: hole index out of sync")
        if self._by_size != sorted((sz, s) for s, sz in self._size.items()):
            raise InvariantError(f"{self.name}: size index out of sync")
        holes = self.holes()
        for (s1, z1), (s2, _) in pairwise(holes):
            if s1 + z1 == s2:
                raise InvariantError(f"{self.name}: adjacent holes at {s1} and {s2} not merged")
        self._check_tiling(holes)


class FirstFit(_HoleList):
    """Lowest-addressed hole that fits: simple, keeps the top of memory free longer."""

    name = "first-fit"

    def _pick(self, n: int) -> int | None:
        size = self._size
        for s in self._starts:
            if size[s] >= n:
                return s
        return None


class BestFit(_HoleList):
    """Smallest hole that fits: keeps large holes intact for large reservations."""

    name = "best-fit"

    def _pick(self, n: int) -> int | None:
        i = bisect_left(self._by_size, (n, -1))
        return self._by_size[i][1] if i < len(self._by_size) else None


def _ceil_log2(n: int) -> int:
    return (n - 1).bit_length()


class Buddy(Placement):
    """Binary buddy system over naturally aligned power-of-two arenas."""

    name = "buddy"

    def __init__(self, capacity: int, max_block: int | None = None) -> None:
        super().__init__(capacity, max_block)
        if self.max_block is None:
            raise ValueError("buddy placement needs max_block (the maximum context length)")
        if self.max_block & (self.max_block - 1):
            raise ValueError(
                f"buddy placement needs a power-of-two maximum context length, got {self.max_block}"
            )
        self.max_order = self.max_block.bit_length() - 1
        # per order k: sorted starts of free blocks of 2**k slots
        self._free: list[list[int]] = [[] for _ in range(self.max_order + 1)]
        self._used_order: dict[int, int] = {}
        self.arenas: list[tuple[int, int]] = []  # (start, order), largest first
        pos, rest = 0, self.capacity
        for k in range(self.max_order, -1, -1):
            while rest >= 1 << k:
                self.arenas.append((pos, k))
                self._free[k].append(pos)
                pos += 1 << k
                rest -= 1 << k
        self._arena_starts = [s for s, _ in self.arenas]

    def block_size(self, n: int) -> int:
        return 1 << _ceil_log2(positive_int("n", n))

    def _arena_order(self, start: int) -> int:
        i = bisect_left(self._arena_starts, start + 1) - 1
        return self.arenas[i][1]

    def allocate(self, n: int) -> int | None:
        k = _ceil_log2(positive_int("n", n))
        if k > self.max_order:
            return None
        free = self._free
        for j in range(k, self.max_order + 1):
            if free[j]:
                break
        else:
            return None
        start = free[j].pop(0)  # lowest address: deterministic, packs allocations low
        while j > k:  # split: keep the low half, free the high half
            j -= 1
            insort(free[j], start + (1 << j))
        self._used[start] = 1 << k
        self._used_order[start] = k
        self._free_total -= 1 << k
        return start

    def free(self, start: int) -> int:
        size = self.size_of(start)
        del self._used[start]
        k = self._used_order.pop(start)
        self._free_total += size
        top = self._arena_order(start)
        free = self._free
        while k < top:
            buddy = start ^ (1 << k)
            lst = free[k]
            i = bisect_left(lst, buddy)
            if i == len(lst) or lst[i] != buddy:
                break
            del lst[i]
            start = min(start, buddy)
            k += 1
        insort(free[k], start)
        return size

    def largest_free_hole(self) -> int:
        for k in range(self.max_order, -1, -1):
            if self._free[k]:
                return 1 << k
        return 0

    def holes(self) -> list[tuple[int, int]]:
        return sorted((s, 1 << k) for k, lst in enumerate(self._free) for s in lst)

    def external(self, n: int) -> int:
        need = _ceil_log2(n) if n > 0 else 0
        return sum(len(self._free[k]) << k for k in range(min(need, self.max_order + 1)))

    def check_invariants(self) -> None:
        for k, lst in enumerate(self._free):
            if lst != sorted(set(lst)):
                raise InvariantError(f"buddy: free list of order {k} unsorted or duplicated")
            members = set(lst)
            for s in lst:
                if s % (1 << k):
                    raise InvariantError(f"buddy: free block {s} not aligned to {1 << k}")
                top = self._arena_order(s)
                if k > top or s + (1 << k) > self._arena_starts[0] + self.capacity:
                    raise InvariantError(f"buddy: free block {s} of order {k} leaves its arena")
                if k < top and s ^ (1 << k) in members:
                    raise InvariantError(f"buddy: free buddies {s} and {s ^ (1 << k)} not merged")
        for s, k in self._used_order.items():
            if self._used.get(s) != 1 << k or s % (1 << k) or k > self._arena_order(s):
                raise InvariantError(f"buddy: allocated block {s} of order {k} is malformed")
        if len(self._used_order) != len(self._used):
            raise InvariantError("buddy: allocated-block indexes out of sync")
        self._check_tiling(self.holes())


PLACEMENTS: Registry[type[Placement]] = Registry("placement")
for _cls in (FirstFit, BestFit, Buddy):
    PLACEMENTS.add(_cls.name, _cls)


def placement_names() -> list[str]:
    return PLACEMENTS.names()


def make_placement(name: str, capacity: int, max_block: int | None = None) -> Placement:
    """Build a placement by name; an unknown name lists the known ones."""
    return PLACEMENTS.get(name)(capacity, max_block)
