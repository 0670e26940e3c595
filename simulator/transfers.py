"""What moving KV between tiers costs in time (the engine's side of kvcore/contract/tiers.py).

The cost model (docs/tiers.md):
* bytes = pages x page bytes per layer x layers (one rank's KV: the pool's unit of cost);
* host <-> device at the link bandwidth (`--host-link-gbps`, default the GPU preset's: PCIe Gen5
  x16 ~64 GB/s on H100-class, NVLink-C2C ~450 GB/s on GH200); storage at its bandwidth plus a
  per-operation latency;
* a storage prefetch starts when the request arrives: `best_effort` admits with what arrived
  while it waited, `wait_complete` waits for all of it, `timeout` waits at most the timeout;
  the wait past admission is the request's storage stall;
* a host -> device load of L seconds beside C seconds of compute in L layers: `overlap` loads
  layer i while layer i-1 computes, so the iteration grows by max(L/n, L - C + C/n) (the first
  layer's load cannot hide; the rest hides under compute); `block` adds L;
* device -> host write-backs (and host -> storage spills, at the storage bandwidth, latency
  pipelined away) run beside compute, full duplex with loads: they lengthen an iteration only
  by what exceeds it.
The stall of an iteration is charged to every request that loaded in it: TTFT shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcore.contract.fields import MAX_I32
from kvcore.contract.tiers import TierState
from kvcore.model.presets import GpuPreset, ModelPreset
from simulator.request import SimRequest
from simulator.specs import TierSpec

GiB = 2**30
MAX_TIER_SLOTS = MAX_I32  # slot ids are int32 like the device pool's
#: a prefetch allowance meaning "all of it" (wait_complete)
UNLIMITED = 1 << 60


def tier_tokens(tier: TierSpec, model: ModelPreset, kv_dtype: str, tp: int,
                kv_tokens: int) -> tuple[int, int]:
    """(host, storage) tier sizes in slots: GiB per rank over one rank's KV bytes per token,
    or the ratio times the device pool."""
    per_token = model.kv_bytes_per_token(kv_dtype, tp)
    host = (int(tier.hicache_size * GiB // per_token) if tier.hicache_size
            else int(tier.hicache_ratio * kv_tokens))
    storage = int(tier.storage_size * GiB // per_token)
    for name, slots in (("--hicache-size / --hicache-ratio", host), ("--storage-size", storage)):
        if slots > MAX_TIER_SLOTS:
            raise ValueError(f"{name}: a tier of {slots:,} slots is more than the "
                             f"{MAX_TIER_SLOTS:,} a page table can address")
    return host, storage


@dataclass(frozen=True)
class TransferModel:
    """Seconds for the traffic between tiers (see the module docstring)."""

    page_bytes: float
    num_layers: int
    link_bytes_s: float
    storage_bytes_s: float
    storage_latency_s: float
    load_mode: str
    prefetch: str
    prefetch_timeout_s: float

    @classmethod
    def of(cls, tier: TierSpec, model: ModelPreset, gpu: GpuPreset, kv_dtype: str, tp: int,
           page_size: int) -> TransferModel:
        link = tier.host_link_gbps * 1e9 if tier.host_link_gbps else gpu.host_link_bytes_s
        return cls(page_size * model.kv_bytes_per_token(kv_dtype, tp), model.num_layers, link,
                   tier.storage_gbps * 1e9, tier.storage_latency_us * 1e-6, tier.hicache_load,
                   tier.hicache_prefetch_policy, tier.hicache_prefetch_timeout_s)

    def link_s(self, pages: int) -> float:
        return pages * self.page_bytes / self.link_bytes_s

    def storage_s(self, pages: int) -> float:
        return self.storage_latency_s + pages * self.page_bytes / self.storage_bytes_s \
            if pages else 0.0

    def allowance(self, waited_s: float, page_size: int) -> int:
        """Tokens of a storage hit the prefetch policy lets admission take after the request
        waited `waited_s` since it arrived."""
        if self.prefetch == "wait_complete":
            return UNLIMITED
        budget = waited_s + (self.prefetch_timeout_s if self.prefetch == "timeout" else 0.0)
        budget -= self.storage_latency_s
        if budget <= 0:
            return 0
        return int(budget * self.storage_bytes_s // self.page_bytes) * page_size

    def storage_stall(self, tokens: int, page_size: int, waited_s: float) -> float:
        """How long admission waits for `tokens` of prefetch begun `waited_s` ago."""
        if not tokens:
            return 0.0
        return max(self.storage_s(-(-tokens // page_size)) - waited_s, 0.0)

    def load_stall(self, load_s: float, compute_s: float) -> float:
        """What a host -> device load of `load_s` adds to an iteration of `compute_s`."""
        if load_s <= 0:
            return 0.0
        if self.load_mode == "block":
            return load_s
        n = self.num_layers
        return max(load_s / n, load_s - compute_s + compute_s / n)

    def writeback_stall(self, d2h_pages: int, h2s_pages: int, busy_s: float) -> float:
        """Write-backs run beside the iteration: only what exceeds it (`busy_s`) is added.
        Writes are pipelined: their bandwidth counts, not the per-operation latency."""
        write = self.link_s(d2h_pages) + h2s_pages * self.page_bytes / self.storage_bytes_s
        return max(write - busy_s, 0.0)


@dataclass
class TierTraffic:
    """The engine's running totals of tier traffic (pages) and stalls, read from the policy's
    cumulative `TierState` so that each page is charged once."""

    model: TransferModel
    last: TierState
    load_stall_s: float = 0.0
    host_tokens: int = 0
    storage_tokens: int = 0

    def written_since(self, now: TierState) -> tuple[int, int]:
        """Pages written device -> host and host -> storage since the last charge."""
        d2h = now.pages_d2h - self.last.pages_d2h
        h2s = now.pages_h2s - self.last.pages_h2s
        self.last = now
        return d2h, h2s

    def admitted(self, sreq: SimRequest, host: int, storage: int, waited_s: float,
                 page_size: int, first: bool) -> None:
        """An admission loaded `host` + `storage` tokens: charged in its first iteration."""
        sreq.load_tokens = host + storage
        sreq.storage_wait = self.model.storage_stall(storage, page_size, waited_s)
        if first:
            sreq.host_hit, sreq.storage_hit = host, storage
            self.host_tokens += host
            self.storage_tokens += storage

    def unadmitted(self, sreq: SimRequest, first: bool) -> None:
        sreq.load_tokens, sreq.storage_wait = 0, 0.0
        if first:
            self.host_tokens -= sreq.host_hit
            self.storage_tokens -= sreq.storage_hit
            sreq.host_hit = sreq.storage_hit = 0

    def iteration_stall(self, batch: Sequence[SimRequest], compute_s: float, now: TierState,
                        page_size: int) -> float:
        """Seconds the tiers add to an iteration of `compute_s` running `batch`: the loads of
        the requests admitted with a lower-tier hit, their storage waits, and write-backs
        beyond the iteration. Each loading request is charged the stall (its TTFT)."""
        loaders = [s for s in batch if s.load_tokens]
        stall = self._stall(loaders, compute_s, *self.written_since(now), page_size)
        for s in loaders:
            s.load_stall_s += stall
            s.load_tokens, s.storage_wait = 0, 0.0
        if loaders:
            self.load_stall_s += stall
        return stall

    def _stall(self, loaders: Sequence[SimRequest], compute_s: float, d2h: int, h2s: int,
               page_size: int) -> float:
        pages = sum(-(-s.load_tokens // page_size) for s in loaders)
        stall = self.model.load_stall(self.model.link_s(pages), compute_s)
        stall += max((s.storage_wait for s in loaders), default=0.0)
        return stall + self.model.writeback_stall(d2h, h2s, compute_s + stall)

    def decode_stall(self, now: TierState, compute_s: float, page_size: int) -> float:
        """What `iteration_stall` would add to a decode-only iteration of `compute_s` now,
        without charging anything: the write-backs not charged yet that exceed it."""
        return self._stall((), compute_s, now.pages_d2h - self.last.pages_d2h,
                           now.pages_h2s - self.last.pages_h2s, page_size)


__all__ = ["UNLIMITED", "TierTraffic", "TransferModel", "tier_tokens"]
