"""The vocabulary of the lower KV tiers (host DRAM, storage) both tiered policies share: the
write policies, the tier sizes (`TierConfig`), a prefix's hit in each tier (`TierHit`) and the
tiers' cumulative state (`TierState`).

Who does what:
* kvcore/tiers/controller.py `TierController`: the one tier controller, whatever the store is
  keyed by: which write policy is on and when a page counts as reused, the loads in flight
  and what they hold, the storage prefetch allowance, the traffic counters, the tier state and
  the host breakdown.
* The stores (one per tier, the host spilling into storage): kvcore/sglang/tier_tree.py
  `TierTree`, keyed by radix-tree path (`paged`), and kvcore/vllm/block_tiers.py `BlockTier`, keyed
  by block hash chain (`vllm`).
* The policies (kvcore/sglang/hicache.py, kvcore/vllm/tiered.py) find a prefix in
  their stores and load it into device pages: the only part keyed by how the policy names a
  prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvcore.contract.registry import Registry


@dataclass(frozen=True)
class WritePolicy:
    """When device KV is copied to the host tier (SGLang HiCache's --hicache-write-policy,
    python/sglang/srt/mem_cache/hiradix_cache.py): on every device insert, once a prefix is
    reused (selective), or when the device evicts it (write-back). One flag each, so callers
    ask what the policy does rather than compare its name."""

    on_insert: bool = False
    on_reuse: bool = False
    on_evict: bool = False


#: the host write policies by name (TierConfig.write_policy, --hicache-write-policy)
WRITES: Registry[WritePolicy] = Registry("write policy")
WRITES.add("write_through", WritePolicy(on_insert=True))
WRITES.add("write_through_selective", WritePolicy(on_reuse=True))
WRITES.add("write_back", WritePolicy(on_evict=True))
WRITE_POLICIES: tuple[str, ...] = tuple(WRITES.names())
#: write_through_selective's threshold: SGLang's HiRadixCache sets `write_through_threshold =
#: 1 if hicache_write_policy == "write_through" else 2` (python/sglang/srt/mem_cache/
#: hiradix_cache.py, `HiRadixCache.__init__`, SGLang main as read in late 2026); what counts
#: toward it is `TierController.reused` (kvcore/tiers/controller.py, docs/tiers.md)
SELECTIVE_THRESHOLD = 2


@dataclass(frozen=True)
class TierConfig:
    """Sizes of the lower tiers in slots (0: none) and the host write policy."""

    host_tokens: int = 0
    storage_tokens: int = 0
    write_policy: str = "write_through"
    write_threshold: int = SELECTIVE_THRESHOLD

    def __post_init__(self) -> None:
        for name in ("host_tokens", "storage_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        WRITES.get(self.write_policy)  # an unknown name lists the known ones
        if self.write_threshold < 1:
            raise ValueError(f"write_threshold must be >= 1, got {self.write_threshold!r}")
        if self.storage_tokens and not self.host_tokens:
            raise ValueError("a storage tier needs a host tier (storage loads go through host)")

    @property
    def enabled(self) -> bool:
        return self.host_tokens > 0

    @property
    def writes(self) -> WritePolicy:
        """What the write policy does."""
        return WRITES.get(self.write_policy)


def tier_pages(name: str, num_tokens: int, page_size: int, unit: str = "page") -> int:
    """Whole pages (blocks) of a lower tier of `num_tokens` slots; one error, named for the
    tier, when not even one fits (both tier stores size themselves with it)."""
    pages = num_tokens // page_size
    if pages < 1:
        raise ValueError(f"the {name} tier of {num_tokens} slots is smaller than one {unit} "
                         f"of {page_size} tokens")
    return pages


class TierHit(NamedTuple):
    """Tokens of a prefix found in each tier, in load order: `device` from the root, `host`
    past it, `storage` past both (page-aligned)."""

    device: int
    host: int
    storage: int


@dataclass(frozen=True, slots=True)
class TierState:
    """The lower tiers now, cumulative: pages moved each way (host -> device loads, device ->
    host writes, storage -> host copies, host -> storage spills) and the slots each tier uses
    / holds for loads in flight / has. Built in one place, `TierController.state`, for both
    backends; the engine charges the traffic from the difference of two states."""

    pages_h2d: int
    pages_d2h: int
    pages_s2h: int
    pages_h2s: int
    host_used: int
    host_locked: int
    host_capacity: int
    storage_used: int
    storage_capacity: int


__all__ = [
    "SELECTIVE_THRESHOLD",
    "WRITES",
    "WRITE_POLICIES",
    "TierConfig",
    "TierHit",
    "TierState",
    "WritePolicy",
]
