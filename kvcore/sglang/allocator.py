"""PagedAllocator: which physical pages are free, and the slots a batch of requests gets next.

Design choices (and why):
* The free list is a preallocated *stack* of page ids with a top index. alloc pops a slice,
  free pushes one: neither copies the whole list (SGLang's `cat(freed, free_pages)` and
  mini-sglang's list copy cost O(pool) per free). Freed pages are reused first (LIFO), as in
  SGLang without `need_sort`.
* A boolean `is_free` mask per page makes double frees and frees of pages nobody owns a
  ValueError instead of silent corruption, at O(k) cost per call.
* Lengths are host data (SGLang passes `*_cpu` copies for the same reason), so the index
  arithmetic of a batch runs in numpy and only page ids come from the free list. On CPU the
  stack and the mask are also reached through numpy views of the same memory: numpy's
  per-call cost is a fraction of torch's for these small operations.
* Only the *host API* lives here, because only it has production callers (the policies, the
  radix cache's eviction, the tiers, the beam-search model): numpy arrays and plain ints in
  and out, no tensor round trip. SGLang's tensor-shaped calls (`alloc_extend` / `alloc_decode`
  returning tensors, `free` by slots, free groups, backup/restore), which only the
  differential tests and kernel benchmarks drive, are a subclass in tests/kvcore/sglang_api.py
  over these same host forms, so each rule has one implementation.

Slots: page p holds slots p*page_size .. p*page_size + page_size - 1. Page 0 is the dummy page
and is never handed out, so `num_pages` usable pages need buffers of num_pages + 1 pages.

Invariants (`check_invariants`): 0 <= top <= num_pages; stack[:top] holds distinct ids in
[1, num_pages]; is_free[p] <=> p in stack[:top] (so sum(is_free) == top, is_free[0] false).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from kvcore.contract.validation import InvariantError, positive_int

IntsLike = torch.Tensor | Sequence[int]
_MIN, _ANY = np.minimum.reduce, np.logical_or.reduce


class PagedAllocator:
    """`num_pages` usable pages of `page_size` slots; capacity = num_pages x page_size."""

    def __init__(self, num_pages: int, page_size: int, device: str | torch.device = "cpu"):
        self.num_pages = positive_int("num_pages", num_pages)
        self.page_size = positive_int("page_size", page_size)
        self.device = torch.device(device)
        # Stack of free page ids; the top is at the end, so page 1 is handed out first.
        self._stack = torch.arange(self.num_pages, 0, -1, dtype=torch.int64, device=self.device)
        self._top = self.num_pages
        self._is_free = torch.ones(self.num_pages + 1, dtype=torch.bool, device=self.device)
        self._is_free[0] = False
        # numpy views of the same memory on CPU (None on a device; tests set them to None to
        # run the device path on CPU)
        on_cpu = self.device.type == "cpu"
        self._stack_np: np.ndarray | None = self._stack.numpy() if on_cpu else None
        self._is_free_np: np.ndarray | None = self._is_free.numpy() if on_cpu else None
        self._offsets = np.arange(self.page_size, dtype=np.int64)

    # -- sizes -----------------------------------------------------------------------------
    def available_size(self) -> int:
        """Free slots (whole free pages x page_size)."""
        return self._top * self.page_size

    def free_page_count(self) -> int:
        return self._top

    def free_pages_view(self) -> torch.Tensor:
        """The free page ids (a view: read it, do not keep it across calls)."""
        return self._stack[: self._top]

    def is_page_free(self, pages: torch.Tensor) -> torch.Tensor:
        return self._is_free[pages]

    # == host API: what production calls ====================================================
    def alloc_extend_host(
        self, pre: np.ndarray, seq: np.ndarray, last: np.ndarray
    ) -> np.ndarray | None:
        """Slots for tokens pre[i] .. seq[i]-1 of each request (int64 host arrays),
        concatenated; `last[i]` is the slot of token pre[i]-1 (-1 if none). Each request is
        filled in three parts (as SGLang's alloc_extend): the rest of its own partial last
        page (slots last+1 ..), then whole new pages, then one new partial page. New pages
        per request = ceil(seq/ps) - ceil(pre/ps). None when short (nothing changed)."""
        ps = self.page_size
        if len(seq) == 1:  # one request (the common prefill): scalar arithmetic, two ranges
            return self.alloc_extend_one(int(pre[0]), int(seq[0]), int(last[0]))
        if len(seq) == 0:
            return np.zeros(0, dtype=np.int64)
        if (pre < 0).any() or (seq < pre).any():
            raise ValueError(
                f"need 0 <= prefix_lens <= seq_lens, got {pre.tolist()} / {seq.tolist()}"
            )
        ext = seq - pre
        if ps == 1:
            return self.pop_host(int(ext.sum()))
        partial = pre % ps != 0
        if ((last + 1) % ps != pre % ps)[partial].any():
            raise ValueError("last_loc is not on the prefix's last page (page-offset mismatch)")
        pre_pages = (pre + ps - 1) // ps
        new_pages = (seq + ps - 1) // ps - pre_pages
        pages = self.pop_host(int(new_pages.sum()))
        if pages is None:
            return None
        req = np.repeat(np.arange(len(seq)), ext)
        tok = np.arange(int(ext.sum())) - np.repeat(np.cumsum(ext) - ext, ext)
        pos = pre[req] + tok
        old_page_end = (pre_pages * ps)[req]
        slot_old = last[req] + 1 + tok
        if len(pages) == 0:
            return slot_old
        page_base = (np.cumsum(new_pages) - new_pages)[req]
        page_idx = np.minimum(page_base + np.maximum(pos - old_page_end, 0) // ps, len(pages) - 1)
        return np.where(pos < old_page_end, slot_old, pages[page_idx] * ps + pos % ps)

    def alloc_extend_one(self, p0: int, s0: int, l0: int) -> np.ndarray | None:
        """`alloc_extend_host` for one request, from plain ints (prefix_len, seq_len,
        last_loc): a prefill chunk is the most frequent call and needs no arrays."""
        if not 0 <= p0 <= s0:
            raise ValueError(f"need 0 <= prefix_lens <= seq_lens, got [{p0}] / [{s0}]")
        ps = self.page_size
        if ps == 1:
            return self.pop_host(s0 - p0)
        if p0 % ps and (l0 + 1) % ps != p0 % ps:
            raise ValueError("last_loc is not on the prefix's last page (page-offset mismatch)")
        have = -(-p0 // ps) * ps  # end of the request's last (partial) page
        pages = self.pop_host(-(-s0 // ps) - have // ps)
        if pages is None:
            return None
        head = min(s0, have) - p0
        if head <= 0:
            return self._slots_of_pages(pages)[: s0 - p0]
        out = np.empty(s0 - p0, dtype=np.int64)
        out[:head] = np.arange(l0 + 1, l0 + 1 + head)
        if s0 > have:
            out[head:] = self._slots_of_pages(pages)[: s0 - have]
        return out

    def alloc_decode_host(self, seq: np.ndarray, last: np.ndarray,
                          need: np.ndarray | list[int] | None = None,
                          n_new: int = -1) -> np.ndarray | None:
        """One slot per request for its next token (`seq` >= 1 counts that token; int64 host
        arrays): last+1 while the request's last page has room, else the first slot of a
        fresh page. None when short (nothing changed). A caller that already knows which
        requests take a fresh page, `(seq - 1) % page_size == 0` (a mask or their indices,
        in batch order), and how many passes them (`need`, `n_new`) instead of having them
        recomputed."""
        ps = self.page_size
        if ps == 1:
            return self.pop_host(len(seq))
        if need is None:
            need = (seq - 1) % ps == 0
            n_new = int(np.count_nonzero(need))
        out = last + 1
        if n_new:
            pages = self.pop_host(n_new)
            if pages is None:
                return None
            out[need] = pages * ps
        return out

    def fresh_page_rows(self, written: list[int]) -> list[int]:
        """Batch indices, in batch order, of the requests (with `written` tokens each) whose
        next token starts a new page: the last page is full, or there is none."""
        ps = self.page_size
        if ps == 1:
            return list(range(len(written)))
        return [i for i, x in enumerate(written) if not x % ps]

    def alloc_decode_rows(self, need: list[int], batch: int,
                          last_slots: Callable[[], np.ndarray]) -> np.ndarray | None:
        """`alloc_decode_host` for a batch of `batch` requests whose fresh-page requests are
        known (`need`, from `fresh_page_rows`): the first slot of a new page for those, the
        slot after their last written one (`last_slots()`, read only when some request's
        page has room, never at page size 1) for the others. None when short."""
        pages = self.pop_host(len(need))
        if pages is None:
            return None
        if len(need) == batch:  # every request starts a page (always at page size 1)
            return pages * self.page_size
        out = last_slots() + 1
        out[need] = pages * self.page_size
        return out

    def pop_host(self, n: int) -> np.ndarray | None:
        """`n` page ids in pop order as a host array, or None with nothing changed."""
        if n > self._top:
            return None
        stack, is_free = self._stack_np, self._is_free_np
        if stack is None or is_free is None:
            pages = self._pop(n)
            return None if pages is None else pages.cpu().numpy()
        top = self._top
        self._top -= n
        out = stack[top - n : top][::-1].copy()
        is_free[out] = False
        return out

    def push_host(self, pages: np.ndarray) -> None:
        """Free distinct page ids given as a host array (validated like `free_pages`)."""
        if len(pages) == 0:
            return
        stack, is_free = self._stack_np, self._is_free_np
        if stack is None or is_free is None:
            self.free_pages(self._to_device(pages), distinct=True)
            return
        try:  # an id past the last page fails the mask lookup itself; the ufuncs' own
            # reduce skips ndarray.min / any's Python wrappers (eviction frees this way)
            bad = _MIN(pages) < 1 or _ANY(is_free[pages])
        except IndexError:
            bad = True
        if bad:
            self.free_pages(torch.from_numpy(pages), distinct=True)  # raises the precise error
            return
        top, k = self._top, len(pages)
        stack[top : top + k] = pages
        is_free[pages] = True
        self._top = top + k

    def free_page(self, page: int) -> None:
        """Free one page by id (a finished request's partial last page: the most frequent
        free), validated like `free_pages`, with no array in between."""
        stack, is_free = self._stack_np, self._is_free_np
        if stack is None or is_free is None or not (1 <= page <= self.num_pages
                                                    and not is_free[page]):
            self.free_pages([page], distinct=True)  # the general path (and its errors)
            return
        stack[self._top] = page
        is_free[page] = True
        self._top += 1

    def free_segments(self, slots: torch.Tensor) -> None:
        """Free runs of whole pages given as device slots: `slots` is a concatenation of
        page-aligned runs the caller owns exclusively (tree node values on a device), so every
        page_size-th slot starts a distinct page and no sort is needed (SGLang's
        free_segment). Double frees are still a ValueError."""
        if len(slots) == 0:
            return
        ps = self.page_size
        starts = slots[::ps] if ps > 1 else slots
        if bool((starts % ps != 0).any()):
            raise ValueError("free_segments needs page-aligned runs of whole pages")
        self.free_pages(starts // ps if ps > 1 else starts, distinct=True)

    def free_pages(self, pages: IntsLike, distinct: bool = False) -> None:
        """Free whole pages by id: an id outside [1, num_pages] or of a free page is a
        ValueError and nothing is freed. `distinct=True` promises no id repeats, which skips
        a sort."""
        p = self._checked_pages(pages, distinct)
        if len(p):
            self._push(p)

    def _checked_pages(self, pages: IntsLike, distinct: bool) -> torch.Tensor:
        """`pages` as a tensor of distinct ids of pages in use (ValueError otherwise)."""
        p = self._ints("pages", pages)
        if not distinct:
            p = torch.unique(p)
        if len(p) == 0:
            return p
        is_free = self._is_free_np
        if is_free is not None:
            p_np = p.numpy()
            lo_id, hi_id = int(p_np.min()), int(p_np.max())
            already = lo_id >= 1 and hi_id <= self.num_pages and is_free[p_np].any()
        else:
            lo_id, hi_id = int(p.min()), int(p.max())
            already = lo_id >= 1 and hi_id <= self.num_pages and bool(self._is_free[p].any())
        if lo_id < 1 or hi_id > self.num_pages:
            raise ValueError(f"page ids must be in [1, {self.num_pages}], got {p.tolist()[:8]}")
        if already:
            bad = p[self._is_free[p]].tolist()[:8]
            raise ValueError(f"double free: pages {bad} are already free")
        return p

    # -- internals -------------------------------------------------------------------------
    def _ints(self, name: str, x: IntsLike) -> torch.Tensor:
        t = torch.as_tensor(x, dtype=torch.int64, device=self.device)
        if t.dim() != 1:
            raise ValueError(
                f"{name} must be a 1-D sequence of integers, got shape {tuple(t.shape)}"
            )
        return t

    def _pop(self, n: int) -> torch.Tensor | None:
        if n > self._top:
            return None
        top = self._top
        self._top -= n
        stack, is_free = self._stack_np, self._is_free_np
        if stack is not None and is_free is not None:  # CPU: numpy ops cost less per call
            pages_np = stack[top - n : top][::-1].copy()
            is_free[pages_np] = False
            return torch.from_numpy(pages_np)
        # flip copies, so the result is safe from later pushes
        pages = self._stack[top - n : top].flip(0)
        self._is_free[pages] = False
        return pages

    def _push(self, pages: torch.Tensor) -> None:
        k = len(pages)
        top = self._top
        stack, is_free = self._stack_np, self._is_free_np
        if stack is not None and is_free is not None:
            pages_np = pages.numpy()
            stack[top : top + k] = pages_np
            is_free[pages_np] = True
        else:
            self._stack[top : top + k] = pages
            self._is_free[pages] = True
        self._top += k

    def _slots_of_pages(self, pages: np.ndarray) -> np.ndarray:
        """The slots of `pages`: pages [1, 3] at page_size 4 (page starts 4 and 12) -> slots
        4..7, 12..15."""
        ps = self.page_size
        return pages if ps == 1 else (pages[:, None] * ps + self._offsets).reshape(-1)

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
        return t if self._stack_np is not None else t.to(self.device)

    # -- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        free = self._stack[: self._top]
        if self._top < 0 or self._top > self.num_pages:
            raise InvariantError(f"free-stack top {self._top} outside [0, {self.num_pages}]")
        if len(free) and (int(free.min()) < 1 or int(free.max()) > self.num_pages):
            raise InvariantError("the free list holds a page id out of range (or the dummy page)")
        if len(torch.unique(free)) != len(free):
            raise InvariantError("a page is on the free list twice")
        if int(self._is_free.sum()) != self._top or not bool(self._is_free[free].all()):
            raise InvariantError("is_free mask disagrees with the free list")
        if self._is_free_np is not None and self._is_free_np.ctypes.data != \
                self._is_free.data_ptr():
            raise InvariantError("the free mask's host view no longer shares its memory")
