"""The `vllm` manager of a hybrid model, as the engine sees its pools: one pool kind per layer
kind (full attention, sliding window, chunked local, Mamba state), each with its bytes and its
prefix hits (the `PoolKinds` capability). vLLM's groups share one block pool, so every kind's
capacity is the whole pool; what differs is what each kind's groups hold."""

from __future__ import annotations

import numpy as np

from kvcore.contract.capabilities import PoolKinds, PoolUsage
from kvcore.contract.policy import PolicyConfig
from kvcore.vllm.manager import VLLMManager
from kvcore.vllm.stretch import Stretch


class PooledVLLMManager(VLLMManager, PoolKinds):
    """`VLLMManager` reporting its pools per layer kind (`pool_usage`), stretches included."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self._stretch_pools: dict[str, np.ndarray] = {}

    def group_blocks(self) -> list[tuple[int, int]]:
        """Per group, (blocks it holds for live requests or as cache, of them as cache): a
        block is its group's while a live table holds it, or while it is cached idle in the
        group's index."""
        pool = self.pool
        cached = pool.is_hashed & (pool.ref_cnt == 0)
        out = []
        mine = np.zeros(self.groups.num_blocks + 1, dtype=bool)
        for rule, index in zip(self.rules, pool.indexes, strict=True):
            np.greater(index.gen, 0, out=mine)  # indexed: hashed, held or cached
            for r in self.requests.values():
                mine[rule.held(r.tables[rule.gid].blocks)] = True
            out.append((int(np.count_nonzero(mine & ((pool.ref_cnt > 0) | cached))),
                        int(np.count_nonzero(mine & cached))))
        return out

    def caches_no_prefix(self) -> bool:
        """Mamba mode none turns prefix caching off for a model with state layers (vLLM
        keeps no state to resume from): the state rule, not capacity, loses every hit."""
        return not self.caching

    @property
    def shared_pool(self) -> bool:
        return True  # every group draws block ids from one BlockPool

    def pool_usage(self) -> dict[str, PoolUsage]:
        """Per pool kind: the shared pool's bytes as capacity, the bytes its groups' blocks
        hold for live requests or as cache (PoolUsage's `used` counts both; `cached` the cache
        alone), and the hits that kind alone would give."""
        bb = self.groups.block_bytes
        per_group = self.group_blocks()
        out: dict[str, PoolUsage] = {}
        for k, spec in enumerate(self.specs):
            mine = [per_group[rule.gid] for rule in self.rules if rule.spec is spec]
            used = sum(u for u, _ in mine) * bb
            cach = sum(c for _, c in mine) * bb
            prev = out.get(spec.pool_kind)
            hits = self.spec_hits[k]
            if prev is not None:  # two specs of one kind (two windows): summed, least hit
                used, cach = used + prev.used_bytes, cach + prev.cached_bytes
                hits = min(hits, prev.hit_tokens)
            out[spec.pool_kind] = PoolUsage(spec.pool_kind, self.groups.num_blocks * bb, used,
                                            cach, hits, self.queried_tokens)
        return out

    def _before_stretch(self, plan: Stretch) -> None:
        """Per pool kind, its (used, cached) bytes after each of the plan's steps, as
        `pool_usage` would give them then: a pop adds a used block to its group's kind and,
        when it evicts, takes a used and cached one from the evicted block's kind; a block
        left with no holder stays used as cache when hashed, else leaves."""
        n, bb = plan.n, self.groups.block_bytes
        kind_of = [rule.spec.pool_kind for rule in self.rules]
        now = self.pool_usage()
        col = {kind: i for i, kind in enumerate(now)}
        d = np.zeros((len(now), n, 2), dtype=np.int64)
        steps, gids = plan.pops()
        popped = self.pool.peek_free(len(steps))
        indexes = self.pool.indexes
        for j, g, b in zip(steps.tolist(), gids.tolist(), popped.tolist(), strict=True):
            d[col[kind_of[g]], j, 0] += 1
            if self.pool.is_hashed[b]:
                evicted = next(e for e, index in enumerate(indexes) if index.gen[b])
                d[col[kind_of[evicted]], j] -= 1
        for j, hashed, g in plan.idle_events():
            d[col[kind_of[g]], j, 1 if hashed else 0] += 1 if hashed else -1
        self._stretch_pools = {
            kind: np.array([now[kind].used_bytes, now[kind].cached_bytes], dtype=np.int64)
            + np.cumsum(d[col[kind]], axis=0) * bb for kind in now}

    def stretch_pool_usage(self) -> dict[str, np.ndarray]:
        """Per pool kind, (used, cached) bytes after each step of the last `decode_steps`
        ((steps, 2)): the Recorder integrates them step by step, as stepping does."""
        return self._stretch_pools


__all__ = ["PooledVLLMManager"]
