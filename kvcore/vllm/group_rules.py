"""What each kind of KV cache group does with a request's block table: vLLM's single-type
managers (vllm/v1/core/single_type_kv_cache_manager.py; `FullAttentionManager`,
`SlidingWindowManager`, `ChunkedLocalAttentionManager`, `MambaManager`), one rule object per
group, all over one shared block pool. The behaviour below has held since v0.11 unless said;
the Mamba modes follow main of 2026-Q2.

* Full attention: one block per `block_size` tokens, all kept; its hit is the cached blocks
  from block 0 up to the first miss.
* Sliding window W / chunked local C: before a request's blocks are grown, those the next
  token no longer needs (before its last W - 1 tokens / before its current chunk) are freed
  to the free queue and replaced by the null block (`remove_skipped_blocks`, positions from
  the last needed one down to the first null); new positions already outside the window are
  null from the start (the skipped-block allocation of v0.11+). A freed full block keeps
  its hash: it is still a prefix hit until a pop reuses it.
* Mamba / linear attention, mode `none`: one state block per request, nothing cached (vLLM's
  Mamba block size is then `max_model_len`; prefix caching is off). Modes `align` / `all`: a
  request's table has one position per block of tokens, null except its running state block
  (at its last position) and the blocks that received a state this step; the running block
  of the previous step is freed at the next one (`last_state_block_idx` in `align`; the
  skipped tokens are all but the last in `all`). A block whose position ended on a block
  boundary holds the state there and is hashed like a full attention block. `all` gives
  every boundary a block; `align` only the boundary a scheduler step ends on: vLLM's
  scheduler cuts a prefill chunk at the prompt's last block boundary
  (`_mamba_block_aligned_split`), modelled here as the state at the last boundary a grow
  call crosses being kept.

A decode step (w -> w + 1 tokens) takes a block in every group but Mamba `none` exactly when
w is a multiple of the block size (`allocates`): the decode stretch (kvcore/vllm/stretch.py)
relies on it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from itertools import repeat

import numpy as np

from kvcore.contract.validation import cdiv
from kvcore.model.layers import FULL
from kvcore.vllm.block_hash import NONE_HASH
from kvcore.vllm.block_pool import BlockPool
from kvcore.vllm.block_table import BlockTable
from kvcore.vllm.kv_cache_groups import Cached, GroupSpec, spec_hit
from kvcore.vllm.request import Request

#: (start position, end position) of a run of blocks to cache, each its own caching
Run = tuple[int, int]
#: a decode stretch's free: (step, request index, group, -position, block; -1: a block the
#: stretch itself allocates at that position)
Free = tuple[int, int, int, int, int]
#: a request to cache: (its index in the call, the request, its full blocks with known ids)
Todo = tuple[int, Request, int]


class GroupRule(ABC):
    """One KV cache group `gid` of spec `spec` with blocks of `block_size` tokens."""

    #: frees blocks the next token no longer needs (`remove_skipped_blocks`)
    skips = False
    #: takes a block at every block boundary (everything but Mamba in mode none)
    allocates = True
    #: holds tokens' KV (its last block's unwritten tail is reserved or rounding)
    attention = True

    def __init__(self, gid: int, spec: GroupSpec, block_size: int) -> None:
        self.gid = gid
        self.spec = spec
        self.block_size = block_size

    def columns(self, max_context_len: int) -> int:
        """Its block table's columns per request (vLLM's `MultiGroupBlockTable`)."""
        return cdiv(max_context_len, self.block_size)

    def capacity(self, final_len: int) -> int:
        """Positions a request of final length `final_len` reaches."""
        return cdiv(final_len, self.block_size)

    @abstractmethod
    def new_blocks(self, have: int, w: int, t: int) -> int:
        """Blocks growing a request that holds `have` positions from w to t tokens
        allocates here."""

    @abstractmethod
    def grow(self, table: BlockTable, w: int, t: int, got: np.ndarray) -> None:
        """Place the `new_blocks` blocks `got` of growing from w to t tokens."""

    def counts(self, reqs: Sequence[Request], ws: Sequence[int],
               ts: Sequence[int]) -> list[int]:
        """`new_blocks` of each request of an `extend` (written ws, targets ts)."""
        g = self.gid
        return [self.new_blocks(r.tables[g].n, w, t) for r, w, t in zip(reqs, ws, ts,
                                                                         strict=True)]

    def grow_all(self, tables: Sequence[BlockTable], ws: Sequence[int], ts: Sequence[int],
                 new: np.ndarray, offsets: Sequence[int], counts: Sequence[int]) -> None:
        """`grow` of each request of an `extend`: request i's blocks are
        new[offsets[i] : offsets[i] + counts[i]]."""
        for tb, w, t, o, k in zip(tables, ws, ts, offsets, counts, strict=True):
            self.grow(tb, w, t, new[o : o + k])

    def remove_skipped(self, table: BlockTable, w: int, skip_at: int) -> list[int]:
        """Null the positions the next token after w tokens no longer needs; their blocks,
        in the order they are freed (none unless `skips`)."""
        return []

    @abstractmethod
    def cache_runs(self, table: BlockTable, full: int, hashed: np.ndarray) -> list[Run]:
        """The runs of newly full blocks (the first `full` positions have known ids) to
        cache, in order; marks them offered. `hashed`: the pool's per-block flag (a hit
        block is cached already)."""

    def extend(self, reqs: Sequence[Request], ws: Sequence[int], ts: Sequence[int],
               new: np.ndarray, starts: Sequence[int], counts: Sequence[int],
               fulls: Sequence[int] | None, pool: BlockPool) -> None:
        """An `extend`'s growth of each request (written ws, targets ts; its blocks are
        new[starts[i] : starts[i] + counts[i]]), then its caching: each request's full
        blocks with known ids (`fulls`: as many, its chain hashed that far; None: caching
        off)."""
        g = self.gid
        self.grow_all([r.tables[g] for r in reqs], ws, ts, new, starts, counts)
        if fulls is not None:
            self.cache([(i, r, f) for i, (r, f) in enumerate(zip(reqs, fulls, strict=True))
                        if f > r.tables[g].hashed], pool)

    def cache(self, todo: Sequence[Todo], pool: BlockPool) -> None:
        """Cache this group's newly full blocks of each request (its chain hashed as far as
        `full`) in one `BlockPool.cache_runs` call, each run its own caching, in request
        order (copies: these tables null positions later)."""
        g, bs = self.gid, self.block_size
        runs: list[tuple[int, int, int, int]] = []  # (length, parent, start, after)
        parts = []
        for _, req, full in todo:
            table = req.tables[g]
            for lo, hi in self.cache_runs(table, full, pool.is_hashed):
                runs.append((hi - lo, req.chain.item(lo - 1) if lo else NONE_HASH, lo,
                             table.block_at(lo - 1) if lo else 0))
                parts.append((req, table.block_slice(lo, hi), lo, hi))
        if parts:
            pool.cache_runs(np.concatenate([b for _, b, _, _ in parts]),
                            np.concatenate([r.chain[lo:hi] for r, _, lo, hi in parts]),
                            np.concatenate([r.ids[lo * bs : hi * bs]
                                            for r, _, lo, hi in parts]).reshape(-1, bs),
                            runs, g)

    def hit(self, cached: Cached, max_len: int) -> tuple[int, int]:
        """The longest hit this kind accepts up to `max_len` tokens: (tokens, the first
        position the request needs)."""
        return spec_hit(self.spec, cached, max_len, self.block_size)

    def held(self, blocks: np.ndarray) -> np.ndarray:
        """Of a table's `blocks`, those held (null positions left out), in position order."""
        return blocks[blocks != 0]

    def hashed_count(self, table: BlockTable) -> int:
        """How many of `held` carry a hash, if known without reading the pool (-1)."""
        return -1

    def stretch_frees(self, table: BlockTable, w0: int, skip_at: int, n: int,
                      ri: int) -> list[Free]:
        """The frees of n decode steps from w0 tokens (none unless `skips`)."""
        return []


def _runs(table: BlockTable, lo: int, hi: int, hashed: np.ndarray) -> list[Run]:
    """Runs of consecutive real positions in lo..hi-1; a run holding blocks cached already
    (hits) becomes its uncached blocks one by one."""
    out: list[Run] = []
    blocks = table.block_slice(lo, hi)
    i, n = 0, hi - lo
    while i < n:
        if not blocks[i]:
            i += 1
            continue
        j = i
        while j < n and blocks[j]:
            j += 1
        fresh = ~hashed[blocks[i:j]]
        if fresh.all():
            out.append((lo + i, lo + j))
        else:
            out.extend((lo + i + k, lo + i + k + 1) for k in np.flatnonzero(fresh).tolist())
        i = j
    return out


class FullAttention(GroupRule):
    """Every position's block is kept; the hit is a prefix."""

    def new_blocks(self, have: int, w: int, t: int) -> int:
        return max(-(-t // self.block_size) - have, 0)

    def grow(self, table: BlockTable, w: int, t: int, got: np.ndarray) -> None:
        table.append(got)

    def counts(self, reqs: Sequence[Request], ws: Sequence[int],
               ts: Sequence[int]) -> list[int]:
        bs, g = self.block_size, self.gid
        return [-(-t // bs) - r.tables[g].n for r, t in zip(reqs, ts, strict=True)]  # t >= w

    def extend(self, reqs: Sequence[Request], ws: Sequence[int], ts: Sequence[int],
               new: np.ndarray, starts: Sequence[int], counts: Sequence[int],
               fulls: Sequence[int] | None, pool: BlockPool) -> None:
        """`GroupRule.extend` in one pass per request: a run's blocks are read from the
        popped array (never rewritten, so kept by reference) when the call just appended
        them, and that array itself is handed over when the runs are exactly every
        request's new blocks, in order."""
        g, bs = self.gid, self.block_size
        runs: list[tuple[int, int, int, int]] = []  # (length, parent, start, after)
        blocks, hashes, tokens = [], [], []
        whole, covered = True, 0  # every run its request's new blocks, `new` in order
        for req, o, k, full in zip(reqs, starts, counts, fulls or repeat(0), strict=False):
            table = req.tables[g]
            first, before = table.n, table.last  # the first position appended, the block before
            if k:
                got = new[o : o + k]
                table.append(got)
            done = table.hashed
            if full <= done:
                continue
            table.hashed = full
            if k and first == done:
                blocks.append(got if full == table.n else got[: full - done])
                whole = whole and full == table.n and covered == o
                covered += k
                after = before if done else 0
            else:  # blocks written earlier, ids known only now
                blocks.append(table.block_slice(done, full))
                whole = False
                after = table.block_at(done - 1) if done else 0
            chain = req.chain
            runs.append((full - done, chain.item(done - 1) if done else NONE_HASH, done, after))
            hashes.append(chain[done:full])
            tokens.append(req.ids[done * bs : full * bs])
        if len(runs) == 1:
            pool.cache_runs(blocks[0], hashes[0], tokens[0].reshape(-1, bs), runs, g)
        elif runs:
            pool.cache_runs(new if whole and covered == len(new) else np.concatenate(blocks),
                            np.concatenate(hashes), np.concatenate(tokens).reshape(-1, bs),
                            runs, g)

    def cache_runs(self, table: BlockTable, full: int, hashed: np.ndarray) -> list[Run]:
        done = table.hashed
        if full <= done:
            return []
        table.hashed = full
        return [(done, full)]  # (no null position, and no hit past `hashed`)

    def held(self, blocks: np.ndarray) -> np.ndarray:
        return blocks

    def hashed_count(self, table: BlockTable) -> int:
        return table.hashed


class Windowed(GroupRule):
    """A sliding window or chunked local attention: blocks before what the next token
    attends to are freed (`GroupSpec.skipped_tokens`)."""

    skips = True

    def new_blocks(self, have: int, w: int, t: int) -> int:
        first = max(have, self.spec.skipped_tokens(w) // self.block_size)
        return max(-(-t // self.block_size) - first, 0)

    def grow(self, table: BlockTable, w: int, t: int, got: np.ndarray) -> None:
        table.pad(max(table.n, self.spec.skipped_tokens(w) // self.block_size))
        table.append(got)
        table.pad(-(-t // self.block_size))

    def remove_skipped(self, table: BlockTable, w: int, skip_at: int) -> list[int]:
        freed: list[int] = []
        for i in range(min(self.spec.skipped_tokens(w) // self.block_size, table.n) - 1,
                       -1, -1):
            b = table.block_at(i)
            if not b:
                break  # nulled by an earlier call, and so is everything before it
            freed.append(b)
            table.put(i, 0)
        return freed

    def cache_runs(self, table: BlockTable, full: int, hashed: np.ndarray) -> list[Run]:
        done, end = table.hashed, min(full, table.n)
        table.hashed = max(done, end)
        return _runs(table, done, end, hashed) if end > done else []

    def stretch_frees(self, table: BlockTable, w0: int, skip_at: int, n: int,
                      ri: int) -> list[Free]:
        bs, skipped, g = self.block_size, self.spec.skipped_tokens, self.gid
        skip0 = skipped(w0) // bs
        out: list[Free] = []
        for i in range(min(skip0, table.n) - 1, -1, -1):  # down to the first null
            b = table.block_at(i)
            if not b:
                break
            out.append((0, ri, g, -i, b))
        out.extend(_later_frees(self, table, w0, n, ri, skip0))
        return out


def _later_frees(rule: GroupRule, table: BlockTable, w0: int, n: int, ri: int,
                 skip0: int) -> list[Free]:
    """A stretch's frees after its first step: every position from the first step's skip
    point on is real (the invariants), one block freed as the skip point passes its end
    (`GroupSpec.first_skipping` names the step)."""
    bs, spec = rule.block_size, rule.spec
    return [(spec.first_skipping((pos + 1) * bs) - w0, ri, rule.gid, -pos,
             table.block_at(pos) if pos < table.n else -1)
            for pos in range(skip0, spec.skipped_tokens(w0 + n - 1) // bs)]


class MambaState(GroupRule):
    """Mamba / linear attention in mode `align` or `all`: the running state block and the
    blocks holding a boundary's state."""

    skips = True
    attention = False

    def __init__(self, gid: int, spec: GroupSpec, block_size: int, every: bool) -> None:
        super().__init__(gid, spec, block_size)
        self.every = every  # `all`: every boundary keeps its state; `align`: the last one

    def boundaries(self, w: int, t: int) -> list[int]:
        """Positions whose state block receives the state at its end boundary when a request
        grows from w to t tokens: `all`, every boundary in (w, t]; `align`, the last one (the
        step vLLM's aligned split ends there; none when no boundary is crossed)."""
        bs = self.block_size
        last = t // bs
        if last * bs <= w:
            return []
        return list(range(w // bs, last)) if self.every else [last - 1]

    def _positions(self, have: int, w: int, t: int) -> list[int]:
        """The running block's position and those receiving a boundary state, past the
        `have` positions held."""
        keep = {-(-t // self.block_size) - 1, *self.boundaries(w, t)}
        return sorted(i for i in keep if i >= have)

    def new_blocks(self, have: int, w: int, t: int) -> int:
        return len(self._positions(have, w, t))

    def grow(self, table: BlockTable, w: int, t: int, got: np.ndarray) -> None:
        positions = self._positions(table.n, w, t)
        table.pad(-(-t // self.block_size))
        for i, b in zip(positions, got.tolist(), strict=True):
            table.put(i, b)
        table.states.update(self.boundaries(w, t))

    def remove_skipped(self, table: BlockTable, w: int, skip_at: int) -> list[int]:
        bs, skipped = self.block_size, self.spec.skipped_tokens
        lo = skipped(skip_at) // bs  # positions before the last call's skip point are null
        freed: list[int] = []
        for i in range(min(skipped(w) // bs, table.n) - 1, lo - 1, -1):
            b = table.block_at(i)
            if b:
                freed.append(b)
                table.put(i, 0)
        return freed

    def cache_runs(self, table: BlockTable, full: int, hashed: np.ndarray) -> list[Run]:
        done, end = table.hashed, min(full, table.n)
        runs = [(i, i + 1) for i in sorted(p for p in table.states if done <= p < end)
                if (b := table.block_at(i)) and not hashed[b]]
        table.states = {p for p in table.states if p >= end}
        table.hashed = max(done, end)
        return runs

    def stretch_frees(self, table: BlockTable, w0: int, skip_at: int, n: int,
                      ri: int) -> list[Free]:
        bs, skipped, g = self.block_size, self.spec.skipped_tokens, self.gid
        skip0 = skipped(w0) // bs
        lo = skipped(skip_at) // bs  # from the last call's skip point, passing over nulls
        out: list[Free] = [(0, ri, g, -i, b) for i in range(min(skip0, table.n) - 1, lo - 1, -1)
                           if (b := table.block_at(i))]
        out.extend(_later_frees(self, table, w0, n, ri, skip0))
        return out


class MambaSingle(GroupRule):
    """Mamba / linear attention in mode `none`: one state block per request from its first
    token on, nothing cached (vLLM's Mamba block size is then max_model_len)."""

    allocates = False
    attention = False

    def columns(self, max_context_len: int) -> int:
        return 1

    def capacity(self, final_len: int) -> int:
        return 1

    def new_blocks(self, have: int, w: int, t: int) -> int:
        return 1 if not have and t > 0 else 0

    def grow(self, table: BlockTable, w: int, t: int, got: np.ndarray) -> None:
        table.append(got)

    def cache_runs(self, table: BlockTable, full: int, hashed: np.ndarray) -> list[Run]:
        return []


def group_rules(specs: tuple[GroupSpec, ...], block_size: int,
                mamba_cache_mode: str) -> list[GroupRule]:
    """One rule per KV cache group, groups in spec order (full attention first)."""
    rules: list[GroupRule] = []
    for spec in specs:
        for _ in range(spec.count):
            gid = len(rules)
            if spec.kind == FULL:
                rules.append(FullAttention(gid, spec, block_size))
            elif not spec.is_state:
                rules.append(Windowed(gid, spec, block_size))
            elif mamba_cache_mode == "none":
                rules.append(MambaSingle(gid, spec, block_size))
            else:
                rules.append(MambaState(gid, spec, block_size, mamba_cache_mode == "all"))
    return rules


__all__ = ["Free", "FullAttention", "GroupRule", "MambaSingle", "MambaState", "Run",
           "Windowed", "group_rules"]
