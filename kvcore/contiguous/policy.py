"""Contiguous reservation policies: the Orca baselines of the vLLM paper (§6.1).

Each request gets one contiguous slot range, reserved at admission and never grown:

* `contiguous-max`: the maximum context length (Orca (Max), also how FasterTransformer sizes);
* `contiguous-pow2`: the prompt plus the next power of two of the true output (a true 25
  reserves 32), capped at the maximum context length (Orca (Pow2));
* `contiguous-oracle`: exactly the final length L (Orca (Oracle): an unbuildable upper bound).

The true output here is `final_len - prompt + 1` (L excludes the last sampled token).
Where the range goes is decided by a `Placement` (PolicyConfig.placement: first-fit, best-fit,
buddy). The page size is the allocation granularity: a reservation is rounded up to a whole
number of pages (never past the maximum context length), then to the placement's block size
(a power of two for buddy); both roundings count as `rounding` in the breakdown.

Slots are addressed after the dummy page: placement offset `o` is slot `page_size + o`, so slot
numbers share one address space with the paged policies (page 0 is never handed out).
There is no prefix cache (not a `PrefixCache`): every admission starts at written = 0.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import numpy as np
import torch

from kvcore.contiguous.placement import make_placement
from kvcore.contract.breakdown import MemoryBreakdown
from kvcore.contract.capabilities import DecodeStretch, Reserving
from kvcore.contract.policy import AdmitResult, PolicyConfig
from kvcore.contract.req_to_token_pool import ReqToTokenPool, step_column
from kvcore.contract.validation import (
    InvariantError,
    cdiv,
    check_request_lengths,
    non_negative_int,
    positive_int,
)

#: how a write past a request's reservation is worded in errors
_BEYOND = "is beyond its reservation"


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class _Req:
    __slots__ = ("block", "final_len", "reservation", "row", "start", "written")

    def __init__(self, row: int, start: int, final_len: int, reservation: int, block: int) -> None:
        self.row = row
        self.start = start  # first slot of the range (placement offset + page_size)
        self.final_len = final_len
        self.reservation = reservation  # what the policy asked for (before rounding)
        self.block = block  # what the placement handed out
        self.written = 0


class ContiguousPolicy(Reserving, DecodeStretch):
    """One contiguous range per request, sized by `target_reservation` at admission."""

    name = ""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config.capacity, positive_int("page_size", config.page_size))
        positive_int("kv_tokens // page_size", config.num_pages)
        self.max_context_len = positive_int("max_context_len", config.max_context_len)
        self.placement = make_placement(config.placement, self.capacity, self.max_context_len)
        self.req_to_token_pool = ReqToTokenPool(
            config.max_requests, self.max_context_len, config.device
        )
        self._reqs: dict[int, _Req] = {}
        self._base = self.page_size  # slot of placement offset 0 (page 0 is the dummy page)
        self.failed_allocs = 0
        # the breakdown's sums over live requests, kept as they change (it is asked for every
        # engine iteration): written tokens, tokens written past final_len, final lengths,
        # reservations and placement blocks
        self._tokens = self._excess = self._finals = self._reserved = self._blocks = 0
        self._entries = 0  # page-table entries in pages: sum of ceil(written / page_size)
        # the last head reservation the breakdown was asked about and its block (placement
        # rounding is a function of the size alone)
        self._head_block: tuple[int, int] = (-1, 0)

    # -- sizing ----------------------------------------------------------------------------
    @abstractmethod
    def target_reservation(self, prompt_len: int, final_len: int) -> int:
        """Slots the policy asks for before any rounding (>= final_len)."""

    def _alloc_size(self, reservation: int) -> int:
        """Reservation rounded to whole pages, but never past the maximum context length."""
        paged = cdiv(reservation, self.page_size) * self.page_size
        return paged if paged <= max(self.max_context_len, reservation) else reservation

    def _block_for(self, reservation: int) -> int:
        return self.placement.block_size(self._alloc_size(reservation))

    def _check_lengths(self, prompt_len: int, final_len: int) -> None:
        check_request_lengths(prompt_len, final_len, self.max_context_len, min_prompt=0)

    def reservation(self, prompt_len: int, final_len: int, max_new_tokens: int) -> int:
        """Slots the request takes from the pool: the policy's reservation after page and
        placement rounding (what admission needs one hole of). Asked for every engine
        iteration, so plain ints in range skip the checks' generic path."""
        if not (type(prompt_len) is int and type(final_len) is int
                and type(max_new_tokens) is int and max_new_tokens >= 0
                and 0 <= prompt_len <= final_len <= self.max_context_len and final_len):
            self._check_lengths(prompt_len, final_len)
            non_negative_int("max_new_tokens", max_new_tokens)
        return self._block_for(self.target_reservation(prompt_len, final_len))

    # -- admission -------------------------------------------------------------------------
    def admit(
        self, rid: int, token_ids: np.ndarray, final_len: int, max_new_tokens: int
    ) -> AdmitResult | None:
        if rid in self._reqs:
            raise ValueError(f"request {rid} is already admitted")
        prompt_len = len(token_ids)
        self._check_lengths(prompt_len, final_len)
        non_negative_int("max_new_tokens", max_new_tokens)
        if self.req_to_token_pool.available_size() == 0:
            return None
        target = self.target_reservation(prompt_len, final_len)
        size = self._alloc_size(target)
        offset = self.placement.allocate(size)
        if offset is None:
            if self.placement.free_total() >= self.placement.block_size(size):
                self.failed_allocs += 1
            return None
        row = self.req_to_token_pool.alloc_row()
        assert row is not None  # checked above
        block = self.placement.size_of(offset)
        self._reqs[rid] = _Req(row, self._base + offset, final_len, target, block)
        self._finals += final_len
        self._reserved += target
        self._blocks += block
        return AdmitResult(row=row, cached_len=0)

    def _wrote(self, req: _Req, end: int) -> None:
        """`req` has `end` tokens written (from req.written): the breakdown's sums follow."""
        w, fin = req.written, req.final_len
        self._tokens += end - w
        self._excess += max(end - fin, 0) - max(w - fin, 0)
        ps = self.page_size
        self._entries += -(-end // ps) + w // -ps
        req.written = end

    # -- growth ----------------------------------------------------------------------------
    def _req(self, rid: int) -> _Req:
        try:
            return self._reqs[rid]
        except KeyError:
            raise ValueError(f"request {rid} is not admitted") from None

    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        reqs = [self._req(r) for r in rids]
        self.check_extend_args(rids, target_lens, [r.written for r in reqs],
                               [r.reservation for r in reqs], _BEYOND)
        write = self.req_to_token_pool.write_range
        for req, t in zip(reqs, target_lens, strict=True):
            t = int(t)
            w = req.written
            if t > w:  # the range's slots in order: one slice of the row
                write(req.row, w, np.arange(req.start + w, req.start + t, dtype=np.int64))
                self._wrote(req, t)
        return True

    def decode_cost(self, rids: Sequence[int], n: int) -> int:
        return 0  # decode writes into the reservation made at admission

    def decode(self, rids: Sequence[int]) -> bool:
        reqs = [self._req(r) for r in rids]
        self.check_distinct("decode", rids)
        pos = [r.written for r in reqs]
        self.check_decode_args(rids, pos, [r.reservation for r in reqs], _BEYOND)
        if not reqs:
            return True
        self.req_to_token_pool.write_at(
            np.array([r.row for r in reqs], dtype=np.int64), np.array(pos, dtype=np.int64),
            np.array([r.start + r.written for r in reqs], dtype=np.int64))
        for r in reqs:
            self._wrote(r, r.written + 1)
        return True

    def decode_steps(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """n decode steps in one write: a reservation needs no allocation, so step s of
        request i writes slot start_i + written_i + s (the same entries as n `decode`s)."""
        reqs = [self._req(r) for r in rids]
        if n <= 0 or not reqs:
            return super().decode_steps(rids, n, head_reservation)
        self.check_distinct("decode", rids)
        w = np.array([r.written for r in reqs], dtype=np.int64)
        self.check_decode_args(rids, w, [r.reservation for r in reqs], _BEYOND, steps=n)
        profile = self.decode_profile(rids, n, head_reservation)
        self._write_decodes(reqs, w, n)
        return profile

    def _write_decodes(self, reqs: list[_Req], w: np.ndarray, n: int) -> None:
        """n decode steps' page-table entries of `reqs` (written lengths `w`), inside their
        reservations: step s of request i is slot start_i + w_i + s, each row's next n
        positions in one `write_run`."""
        starts = np.array([r.start for r in reqs], dtype=np.int64)
        rows = np.array([r.row for r in reqs], dtype=np.int64)
        slots = (starts + w)[None, :] + step_column(n)  # (step, request)
        self.req_to_token_pool.write_run(rows, w, n, slots)
        for r in reqs:
            self._wrote(r, r.written + n)

    def prefill_steps(self, prefill_rids: Sequence[int], rooms: Sequence[int],
                      decode_rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """n iterations of chunks and decode steps in one write per prefilling request and
        one for the decoders: step s of a chunk of `room` writes slots start + w + s*room ..,
        of a decode slot start + w + s, the entries of n `extend`s and `decode`s. Each
        iteration turns sum(rooms) + len(decode_rids) reserved slots into token states
        (nobody passes its final length: the engine's precondition, checked) and nothing
        else changes, so the profile is the breakdown before plus that per step."""
        preqs = [self._req(r) for r in prefill_rids]
        dreqs = [self._req(r) for r in decode_rids]
        positive_int("n", n)
        self.check_distinct("prefill_steps", [*prefill_rids, *decode_rids])
        if len(rooms) != len(preqs):
            raise ValueError(f"prefill_rids and rooms differ in length: {len(preqs)} != "
                             f"{len(rooms)}")
        for rid, req, m in zip(prefill_rids, preqs, rooms, strict=True):
            positive_int(f"room of request {rid}", m)
            if req.written + n * m > req.final_len:
                raise ValueError(f"prefill_steps: request {rid} would write "
                                 f"{req.written + n * m} tokens, past its final length "
                                 f"{req.final_len}")
        for rid, req in zip(decode_rids, dreqs, strict=True):
            if req.written + n > req.final_len:
                raise ValueError(f"prefill_steps: decode of request {rid} would pass its "
                                 f"final length {req.final_len}")
        out = np.repeat(self.breakdown(head_reservation).as_array()[None, :], n, axis=0)
        grown = np.arange(1, n + 1, dtype=np.int64) * (sum(rooms) + len(dreqs))
        out[:, 0] += grown  # token states
        out[:, 2] -= grown  # reserved
        write = self.req_to_token_pool.write_range
        for req, m in zip(preqs, rooms, strict=True):
            w, t = req.written, req.written + n * m
            write(req.row, w, np.arange(req.start + w, req.start + t, dtype=np.int64))
            self._wrote(req, t)
        if dreqs:
            self._write_decodes(dreqs, np.array([r.written for r in dreqs], dtype=np.int64), n)
        return out

    # -- ending ----------------------------------------------------------------------------
    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        self.release(rid)

    def release(self, rid: int) -> None:
        req = self._req(rid)
        self.placement.free(req.start - self._base)
        self.req_to_token_pool.free_row(req.row)
        self._wrote(req, 0)
        self._finals -= req.final_len
        self._reserved -= req.reservation
        self._blocks -= req.block
        del self._reqs[rid]

    # -- observation -----------------------------------------------------------------------
    def written(self, rid: int) -> int:
        return self._req(rid).written

    def available_tokens(self) -> int:
        return self.placement.free_total()

    def evictable_tokens(self) -> int:
        return 0

    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        """token_states = written; reserved = L - written; over_reservation = reservation - L;
        rounding = block - reservation; external = free slots in holes smaller than the
        head's block (its reservation after page and placement rounding)."""
        if type(head_reservation) is not int or head_reservation < 0:  # asked every pass
            non_negative_int("head_reservation", head_reservation)
        # sums over live requests: reserved = sum max(fin - w, 0) = finals - tokens + excess,
        # over = sum (reservation - max(fin, w)) = reservations - finals - excess
        tokens, excess = self._tokens, self._excess
        reserved = self._finals - tokens + excess
        over = self._reserved - self._finals - excess
        rounding = self._blocks - self._reserved
        pl = self.placement
        if head_reservation != self._head_block[0]:  # the same head pass after pass
            self._head_block = (head_reservation, self._block_for(head_reservation)
                                if head_reservation > 0 else 0)
        need = self._head_block[1]
        external = pl.external(need) if need else 0
        return MemoryBreakdown(
            capacity=self.capacity,
            token_states=tokens,
            cached=0,
            reserved=reserved,
            over_reservation=over,
            rounding=rounding,
            external=external,
            free=pl.free_total() - external,
            largest_free_hole=pl.largest_free_hole(),
            failed_allocs=self.failed_allocs,
        )

    def page_table_entries(self) -> int:
        return self._entries  # sum of ceil(written / page_size), kept by `_wrote`

    def page_table_bytes(self) -> int:
        """The request-to-token table's device bytes."""
        return int(self.req_to_token_pool.nbytes)

    def check_invariants(self) -> None:
        pl = self.placement
        pl.check_invariants()
        self.req_to_token_pool.check_invariants()
        used = pl.allocated()
        if len(used) != len(self._reqs):
            raise InvariantError(
                f"{self.name}: {len(used)} placement blocks for {len(self._reqs)} requests"
            )
        rows = set()
        owned = 0
        sums = [0] * 5
        for rid, r in self._reqs.items():
            off = r.start - self._base
            if used.get(off) != r.block:
                raise InvariantError(f"{self.name}: request {rid} block {off} not owned by it")
            if not r.final_len <= r.reservation <= r.block:
                raise InvariantError(f"{self.name}: request {rid} L <= reservation <= block fails")
            if not 0 <= r.written <= r.reservation:
                raise InvariantError(f"{self.name}: request {rid} written out of range")
            if r.row in rows or not self.req_to_token_pool.in_use(r.row):
                raise InvariantError(f"{self.name}: row {r.row} of request {rid} is bad")
            rows.add(r.row)
            owned += r.block
            sums[0] += r.written
            sums[1] += max(r.written - r.final_len, 0)
            sums[2] += r.final_len
            sums[3] += r.reservation
            sums[4] += r.block
            got = self.req_to_token_pool.req_to_token[r.row, : r.written].cpu()
            want = torch.arange(r.start, r.start + r.written, dtype=torch.int32)
            if not torch.equal(got, want):
                raise InvariantError(f"{self.name}: page-table row of request {rid} is wrong")
        if pl.free_total() + owned != self.capacity:
            raise InvariantError(
                f"{self.name}: free {pl.free_total()} + owned {owned} != capacity {self.capacity}"
            )
        if sums != [self._tokens, self._excess, self._finals, self._reserved, self._blocks] \
                or self._entries != sum(cdiv(r.written, self.page_size)
                                        for r in self._reqs.values()):
            raise InvariantError(f"{self.name}: the breakdown's running sums are out of sync")
        if len(rows) != self.req_to_token_pool.size - self.req_to_token_pool.available_size():
            raise InvariantError(f"{self.name}: rows in use do not match live requests")
        self.breakdown(self.max_context_len).check_invariants()


class ContiguousMax(ContiguousPolicy):
    name = "contiguous-max"

    def target_reservation(self, prompt_len: int, final_len: int) -> int:
        return self.max_context_len


class ContiguousPow2(ContiguousPolicy):
    name = "contiguous-pow2"

    def target_reservation(self, prompt_len: int, final_len: int) -> int:
        true_output = final_len - prompt_len + 1
        return min(prompt_len + next_pow2(true_output), self.max_context_len)


class ContiguousOracle(ContiguousPolicy):
    name = "contiguous-oracle"

    def target_reservation(self, prompt_len: int, final_len: int) -> int:
        return final_len
