"""`vllm` with lower KV tiers: a host (and storage) store of blocks keyed by the block hash
chain behind vLLM v1's block pool (vLLM's CPU offload, LMCache), LRU on the host.

`TieredVLLMManager` is the `vllm` manager (kvcore/vllm/manager.py) of a full-attention model
whose admission continues the device hit (whole blocks of `prompt[:P-1]`) along the same hash
chain into the host tier, then the storage tier (kvcore/vllm/block_tiers.py), and loads that
hit into new device blocks: they are hashed on the
device under the same hashes, the request holds them and `cached_len` covers them (they are
not prefilled). The host blocks a load reads stay held until the request's prefill completes
(`cache_prefix`) or it leaves (`release` / `finish`): the load's time in flight, which the
engine charges from `AdmitResult.host_hit` / `storage_hit` and `tier_state()`.

The tier controller (kvcore/tiers/controller.py, `self.tiers`) builds the stores, decides the
write policy and the reuse counts, and keeps the loads in flight, the traffic and the tier
state; this module finds a prefix in the block stores and loads it. Write policies:
* `write_back`: a block the device pool lazily evicts is stored on the host (the pool's
  `on_evict` hook, before its hash is dropped): vLLM's offloading of evicted cached blocks.
* `write_through`: a request's hashed chain is stored when its prefill completes and when it
  finishes (the moments `paged` inserts into its tree); blocks already on the host are only
  touched, so the whole chain becomes recent, head most recent.
* `write_through_selective`: a device block is stored once the controller finds it reused
  (`TierController.reused`: 1 when hashed, 1 per device hit since, up to SGLang's threshold
  2), at the admission that reaches the count: the first reuse backs a block up.

Loads take device blocks from the free queue (lazily evicting device cache; the device hit is
already touched, so safe); if the device cannot give room for the whole hit, what fits is
loaded, head first, as kvcore/contract/tiers.py's fetch does. The `vllm` factory (kvcore/vllm/
__init__.py) builds this class only when the configuration asks for a host tier, so a run
without one is `VLLMManager` itself. A hybrid model has no host tier (the factory refuses
one), so the device blocks here are the one full-attention group's (`tables[0]`).
"""

from __future__ import annotations

import numpy as np

from kvcore.contract.breakdown import MemoryBreakdown
from kvcore.contract.capabilities import LowerTiers
from kvcore.contract.policy import AdmitResult, PolicyConfig
from kvcore.contract.tiers import TierConfig, TierHit, TierState
from kvcore.contract.validation import InvariantError
from kvcore.tiers.controller import TierController
from kvcore.vllm.block_hash import NONE_HASH
from kvcore.vllm.block_tiers import BlockTier
from kvcore.vllm.manager import VLLMManager, as_ids
from kvcore.vllm.request import Request

_U64 = np.uint64


class TieredVLLMManager(VLLMManager, LowerTiers):
    """vLLM block pool + hash-keyed prefix cache + host tier (+ storage tier)."""

    def __init__(self, config: PolicyConfig, tier_config: TierConfig) -> None:
        super().__init__(config)
        self.tiers: TierController[BlockTier, np.ndarray] = TierController(
            tier_config, BlockTier, self.page_size, self.groups.num_blocks)
        # write_through: rid -> (host block of each chain block at its last store, gens),
        # and the stores due: (rid, hashes, parents, tokens, known host blocks), chain order
        self._placed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._pending: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        if self.tiers.write_on_evict or self.tiers.counts_reuse:
            self.pool.on_evict = self._device_evicted

    # -- writing to the host -----------------------------------------------------------------
    def _device_evicted(self, blocks: np.ndarray) -> None:
        """The device pool evicts `blocks` (LRU first): their reuse counts end with their
        content; write_back stores them."""
        self.tiers.forget(blocks)
        if self.tiers.write_on_evict:
            self._flush()
            p = self.pool
            self.tiers.host.store(p.block_hash[blocks], p.parent_hash[blocks],
                                  p.block_tokens[blocks])

    def _store_device_blocks(self, chain: np.ndarray) -> None:
        """Store device blocks of one chain (head first) on the host, the head most recent."""
        p = self.pool
        rev = chain[::-1]
        self.tiers.host.store(p.block_hash[rev], p.parent_hash[rev], p.block_tokens[rev])

    def _write_through(self, rid: int, req: Request) -> None:
        """write_through: the request's hashed chain is due on the host (held blocks only
        touched). Due stores wait in `_pending` until the host is next read (`_flush`): one
        store for all of an iteration's requests costs about half of one store each, and a
        request's later chain (at finish) replaces its earlier one (at cache_prefix), which it
        extends: the host ends the same. Where its last store put each block is remembered
        (`_placed`), so the next one looks up only blocks since, or whose host copy changed."""
        n = req.tables[0].hashed
        if not (self.tiers.write_on_insert and n):
            return
        ps = self.page_size
        hashes = req.chain[:n]
        parents = np.empty(n, dtype=_U64)
        parents[0] = NONE_HASH
        parents[1:] = hashes[:-1]
        known = np.zeros(n, dtype=np.int64)
        placed = self._placed.get(rid)
        if placed is not None:
            k = min(len(placed[0]), n)
            known[:k] = self.tiers.host.still_held(placed[0][:k], placed[1][:k])
        if self._pending and any(p[0] == rid for p in self._pending):
            self._pending = [p for p in self._pending if p[0] != rid]
        self._pending.append((rid, hashes, parents, req.ids[: n * ps].reshape(n, ps), known))

    def _flush(self) -> None:
        """Store the due chains, in the order they were due, each reversed (its head most
        recent); remember where each live request's blocks went."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        host = self.tiers.host
        if len(pending) == 1:
            rid, hashes, parents, tokens, known = pending[0]
            wheres = [host.store(hashes[::-1], parents[::-1], tokens[::-1], known[::-1],
                                 distinct=True).where[::-1]]
        else:  # one batch; a block in several chains is placed where it is due last
            where = host.store(np.concatenate([p[1][::-1] for p in pending]),
                               np.concatenate([p[2][::-1] for p in pending]),
                               np.concatenate([p[3][::-1] for p in pending]),
                               np.concatenate([p[4][::-1] for p in pending])).where
            ends = np.cumsum([len(p[1]) for p in pending])
            wheres = [w[::-1] for w in np.split(where, ends[:-1])]
        gen = host.pool.gen
        for (rid, *_), w in zip(pending, wheres, strict=True):
            if rid in self.requests:
                self._placed[rid] = (w, gen[w])

    # -- admission ---------------------------------------------------------------------------
    def peek_tiers(self, token_ids: np.ndarray) -> TierHit:
        self._flush()
        ids = as_ids(token_ids)
        ps = self.page_size
        n = len(ids) // ps
        d = self.coordinator.peek(ids, len(ids)).tokens // ps
        hashes = self.memo.chain(ids, n)[1] if n else np.zeros(0, dtype=_U64)
        host, storage = self.tiers.host, self.tiers.storage
        h = len(host.lookup(hashes, ids, d))
        s = len(storage.lookup(hashes, ids, d + h)) if storage is not None else 0
        return TierHit(d * ps, h * ps, s * ps)

    def admit(self, rid: int, token_ids: np.ndarray, final_len: int,
              max_new_tokens: int) -> AdmitResult | None:
        return self.admit_prefetched(rid, token_ids, final_len, max_new_tokens, 0)

    def admit_prefetched(self, rid: int, token_ids: np.ndarray, final_len: int,
                         max_new_tokens: int, storage_allowance: int) -> AdmitResult | None:
        self._flush()  # the host as the due stores leave it
        res = super().admit(rid, token_ids, final_len, max_new_tokens)
        if res is None:
            return None
        req = self.requests[rid]
        table = req.tables[0]
        d = table.n
        if self.tiers.counts_reuse and d:
            blocks = table.blocks
            due = blocks[self.tiers.reused(blocks)]
            if len(due):
                self._store_device_blocks(due)
        n = (len(req.ids) - 1) // self.page_size  # whole blocks a hit may cover
        if d >= n:
            return res
        held, from_storage = self._find_lower(req, d, n, storage_allowance)
        if not len(held):
            return res
        loaded = self._load(rid, req, held)
        if not loaded:
            return res
        ps = self.page_size
        storage = max(loaded - (len(held) - from_storage), 0)
        return AdmitResult(res.row, req.written, res.token_hit, (loaded - storage) * ps,
                           storage * ps)

    def _find_lower(self, req: Request, d: int, n: int,
                    storage_allowance: int) -> tuple[np.ndarray, int]:
        """Host blocks continuing the device hit of `d` blocks (of `n` possible), held, with
        what the storage tier adds past them (copied to the host first, at most the prefetch
        allowance). Returns (the held host chain, how many of its blocks came from storage)."""
        hashes, ids, host = req.chain[:n], req.ids, self.tiers.host
        held = host.lookup(hashes, ids, d)
        host.hold(held)
        st = self.tiers.storage
        allow = self.tiers.prefetch_pages(storage_allowance)
        if st is None or not allow or d + len(held) >= n:
            return held, 0
        base = d + len(held)
        found = st.lookup(hashes[: min(n, base + allow)], ids, base)
        if not len(found):
            return held, 0
        st.hold(found)  # read while the host makes room
        sp = st.pool
        rev = found[::-1]
        self.tiers.copied_up(host.store(sp.block_hash[rev], sp.parent_hash[rev],
                                        sp.block_tokens[rev]).written)
        st.unhold(found)
        more = host.lookup(hashes[: base + len(found)], ids, base)
        host.hold(more)
        return np.concatenate([held, more]), len(more)

    def _load(self, rid: int, req: Request, held: np.ndarray) -> int:
        """Copy the held host chain into new device blocks, as many as the device can give
        (head first); the rest is released. Returns the blocks loaded."""
        room = min(len(held), self.pool.get_num_free_blocks())
        if room < len(held):
            self.tiers.host.unhold(held[room:])
            held = held[:room]
        if not room:
            return 0
        ps = self.page_size
        table = req.tables[0]
        d = table.n
        new = self.pool.get_new_blocks(room)  # lazily evicts device cache (write_back: stored)
        parent = int(req.chain[d - 1]) if d else NONE_HASH
        self.pool.cache_full_blocks(new, req.chain[d : d + room], parent,
                                    req.ids[d * ps : (d + room) * ps].reshape(room, ps), d)
        table.append(new)
        start = req.written
        table.hashed = d + room
        req.written = (d + room) * ps
        self.page_table.write_grow(req.row, table, start, req.written)
        self.hit_tokens += room * ps
        self.tiers.loaded(rid, held, room)
        return room

    # -- ending ------------------------------------------------------------------------------
    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        super().cache_prefix(rid, token_ids)
        self.tiers.landed(rid)  # prefill done: the load has landed
        self._write_through(rid, self._req(rid))

    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        super().cache_prefix(rid, token_ids)  # learn the ids, hash the full blocks
        self._write_through(rid, self._req(rid))
        self.release(rid)

    def release(self, rid: int) -> None:
        self._req(rid)
        self.tiers.landed(rid)
        self._placed.pop(rid, None)
        super().release(rid)

    # -- observation -------------------------------------------------------------------------
    def tier_state(self) -> TierState:
        self._flush()
        return self.tiers.state()

    def host_breakdown(self) -> MemoryBreakdown:
        self._flush()
        return self.tiers.host_breakdown()

    def check_invariants(self) -> None:
        """The device policy's invariants (loaded blocks carry the chain's hashes), the
        controller's (each tier's; loads in flight; reuse counts only on hashed blocks), and:
        every remembered write-through placement is of a live request and still names its
        chain's content. Due write-through stores are made first (they wait only for the next
        host read)."""
        self._flush()
        super().check_invariants()
        self.tiers.check_invariants(self.requests, self.pool.is_hashed)
        host = self.tiers.host
        for rid, (where, gens) in self._placed.items():
            if rid not in self.requests:
                raise InvariantError(f"request {rid} left with its write-through remembered")
            live = host.still_held(where, gens)
            ok = live > 0
            chain = self.requests[rid].chain[: len(where)]
            if not np.array_equal(host.pool.block_hash[live[ok]], chain[ok]):
                raise InvariantError(f"request {rid}: a remembered host block changed content")


__all__ = ["TieredVLLMManager"]
