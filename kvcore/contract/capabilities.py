"""What a policy can do beyond the lifecycle: explicit, typed capabilities.

Each capability is an abstract subclass of `KVPolicy`; a policy class derives from the ones it
has and the engine asks `isinstance(policy, Capability)` once, when it starts, never a probe of
a value (such as "does a 1-token request reserve anything?") nor a name. Without one the engine
takes the plain path: no cache peeks (hit 0), no reservation (0), one decode step per
iteration, no tier traffic.

* `PrefixCache`: the policy keeps a prefix cache; admission may peek at it, and a request's
  prefix is offered to it once its prefill completes (SGLang's cache_unfinished_req).
* `Reserving`: admission reserves memory up front; its placement, not a budget, decides.
* `DecodeStretch`: `n` decode steps in one call with the result of `n` single steps, and the
  cost of those steps known in advance: what the fast-forward (simulator/fastforward/) needs.
* `LowerTiers`: host (and storage) tiers behind the device pool; admission may load from them,
  at most what the storage prefetch delivered. Both tiered policies keep them in one tier
  controller (kvcore/tiers/controller.py).
* `PoolKinds`: a hybrid model's pools, one per layer kind (full attention, sliding window,
  chunked local, Mamba / linear-attention state), each with its bytes and its prefix hits;
  `breakdown()` still reports the full-attention pool in slots.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvcore.contract.breakdown import PARTS, MemoryBreakdown
from kvcore.contract.policy import AdmitResult, KVPolicy, PrefixPeek
from kvcore.contract.tiers import TierHit, TierState

__all__ = ["CAPABILITIES", "POOL_KINDS", "DecodeStretch", "LowerTiers", "PoolKinds",
           "PoolUsage", "PrefixCache", "Reserving"]

#: the pool kinds a hybrid policy reports, in the order summaries list them
POOL_KINDS: tuple[str, ...] = ("full", "swa", "chunked", "mamba")


class PrefixCache(KVPolicy):
    """A policy with a prefix cache."""

    @abstractmethod
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        """Tokens of `token_ids` (already capped by the caller) the cache would serve now.

        Read-only: no lock, no LRU touch; used by schedulers to order and budget the queue."""

    def peek_admission(self, token_ids: np.ndarray) -> PrefixPeek:
        """`peek_prefix` and the part of that hit which `available_tokens()` counts now as
        evictable (read-only). Admitting the request locks its hit, so that part stops being
        available: an admission budget must leave it out, or it counts the same slots twice.
        Default: nothing of the hit is evictable."""
        return PrefixPeek(self.peek_prefix(token_ids), 0)

    @abstractmethod
    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        """Offer `rid`'s written tokens (ids `token_ids`) to the prefix cache while it keeps
        running, so later requests can match them. Before: `rid` admitted, its prefill done.
        Inserts its whole written pages into the cache (which then owns them), moves `rid`'s
        lock to the end of the cached prefix; allocates and frees nothing else."""


class Reserving(KVPolicy):
    """A policy that reserves each request's memory at admission."""

    @abstractmethod
    def reservation(self, prompt_len: int, final_len: int, max_new_tokens: int) -> int:
        """Slots `admit` would reserve for such a request (read-only; > 0). Admission cannot
        budget around it: the placement decides, and a refused head waits until memory is
        given back."""

    def prefill_steps(self, prefill_rids: Sequence[int], rooms: Sequence[int],
                      decode_rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """`n` engine iterations at once, each extending every `prefill_rids[i]` by `rooms[i]`
        tokens (a prefill chunk) and then decoding `decode_rids` one token, with exactly the
        result of `n` calls of `extend` and `decode` in that order; returns the breakdown
        parts (columns in PARTS order) after each iteration. The engine's prefill stretch
        (simulator/fastforward/) asks this while a reserving policy refused the queue
        head: nothing else can change the pool until memory is given back.

        Before: the rids admitted, the two lists disjoint, every room >= 1, and every write
        inside its request's reservation and final length (so over-reservation and
        fragmentation stay as they are); `n` >= 1. Allocates nothing: the reservation holds
        every token. Default: `n` single extends and decodes, the breakdown after each."""
        rows = []
        for _ in range(n):
            targets = [self.written(r) + m for r, m in zip(prefill_rids, rooms, strict=True)]
            if prefill_rids and not self.extend(prefill_rids, targets):
                raise RuntimeError("a prefill chunk failed inside its reservation")
            if decode_rids and not self.decode(decode_rids):
                raise RuntimeError("a decode step failed inside its reservation")
            rows.append(self.breakdown(head_reservation).as_tuple())
        return np.array(rows, dtype=np.int64).reshape(n, len(PARTS))


class DecodeStretch(KVPolicy):
    """A policy that runs many decode steps in one call (the fast-forward). The defaults
    grow page by page on demand and step one at a time; policies override them with batched
    versions whose results are identical."""

    def decode_cost(self, rids: Sequence[int], n: int) -> int:
        """Slots of new memory `n` decode steps of `rids` would take (whole pages; read-only).
        Default: page-granular on-demand growth."""
        ps = self.page_size
        total = 0
        for rid in rids:
            w = self.written(rid)
            total += (-(-(w + n) // ps) - -(-w // ps)) * ps
        return total

    def steps_within(self, rids: Sequence[int], k: int, slots: int) -> int:
        """The most decode steps n <= k of `rids` with decode_cost(rids, n) <= slots (0 if
        none; read-only): how far the fast-forward can go before memory runs short. Default:
        a binary search over `decode_cost` (it grows with the steps); a policy with a closed
        form overrides it with the same answer."""
        if self.decode_cost(rids, k) <= slots:
            return k
        lo, hi = 0, k - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.decode_cost(rids, mid) <= slots:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def fresh_tokens(self) -> int:
        """Slots the next allocations take before the first one evicts cached content
        (read-only). A scheduler that orders its queue by cache hits must look again after an
        eviction. Default: the free slots (a cache is evicted only when free memory runs out)."""
        return self.free_tokens()

    def steps_before_release(self, rids: Sequence[int], n: int) -> int:
        """The decode steps of `rids` (<= n) through the first one that gives memory back to
        the free pool (read-only): admission, which assumes free memory only shrinks while
        decoding (`Admission.horizon`), could take the queue head right after it. Default n:
        on-demand growth frees nothing while decoding; a hybrid policy frees sliding-window
        and Mamba blocks as requests decode (kvcore/vllm/stretch.py)."""
        return n

    def decode_steps(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """`n` decode steps at once, with exactly the result of `n` calls of `decode(rids)`;
        returns the breakdown parts (columns in PARTS order) after each step.

        Before: `decode_cost(rids, n) <= available_tokens()` (the engine asks only then), so
        no step can fail. Allocates (and evicts) as the `n` steps would. Default: the
        predicted profile, then n single steps."""
        if self.decode_cost(rids, n) > self.available_tokens():
            raise ValueError("decode_steps needs decode_cost <= available_tokens")
        profile = self.decode_profile(rids, n, head_reservation)
        for _ in range(n):
            if not self.decode(rids):
                raise RuntimeError("a decode step failed although memory was available")
        return profile

    def decode_profile(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """The breakdown parts (columns in PARTS order) after each of the next `n` decode
        steps of `rids`, without changing anything. Default: reserving policies, where a step
        only turns one reserved slot per request into token state."""
        row = self.breakdown(head_reservation).as_array()
        out = np.repeat(row[None, :], n, axis=0)
        steps = np.arange(1, n + 1, dtype=np.int64) * len(rids)
        out[:, 0] += steps
        out[:, 2] -= steps
        return out


class LowerTiers(KVPolicy):
    """A policy with a host (and optionally a storage) tier behind the device pool."""

    @abstractmethod
    def admit_prefetched(self, rid: int, token_ids: np.ndarray, final_len: int,
                         max_new_tokens: int, storage_allowance: int) -> AdmitResult | None:
        """`admit`, continuing the device hit into the host, then the storage tier, at most
        `storage_allowance` tokens from storage (what the prefetch delivered while the request
        waited). The hit is loaded into new device pages (evicting device cache for them),
        which `rid` holds as cached prefix; the host copy it is read from stays locked until
        the prefill completes (`cache_prefix`) or `rid` leaves. `admit` is this call with no
        storage allowance."""

    @abstractmethod
    def peek_tiers(self, token_ids: np.ndarray) -> TierHit:
        """Tokens of `token_ids` (already capped by the caller) each tier would serve now, in
        load order: the device hit, the host's past it, the storage's past both (read-only:
        no lock, no LRU touch; deferred host stores are made first)."""

    @abstractmethod
    def tier_state(self) -> TierState:
        """Lower tiers' occupancy and the pages moved between tiers so far (read-only but for
        deferred host stores, which are made first). The engine charges the traffic."""

    @abstractmethod
    def host_breakdown(self) -> MemoryBreakdown:
        """The host pool in the six parts: loads in flight hold token states, the rest of
        what it holds is cache, the rest is free."""


@dataclass(frozen=True)
class PoolUsage:
    """One pool kind of a hybrid policy now: its bytes on one rank (capacity, in use by
    running requests or the cache, of which held by the cache alone) and its prefix hits so
    far (tokens this pool served to admissions, of the tokens admissions asked it for). The
    run turns these into the per-kind summary columns (simulator/pool_columns.py)."""

    kind: str
    capacity_bytes: int
    used_bytes: int
    cached_bytes: int
    hit_tokens: int
    queried_tokens: int

    def __post_init__(self) -> None:
        if self.kind not in POOL_KINDS:
            raise ValueError(f"pool kind {self.kind!r} is not one of: {', '.join(POOL_KINDS)}")
        if not 0 <= self.cached_bytes <= self.used_bytes <= self.capacity_bytes:
            raise ValueError(f"{self.kind} pool: need 0 <= cached <= used <= capacity bytes, "
                             f"got {self.cached_bytes}, {self.used_bytes}, "
                             f"{self.capacity_bytes}")
        if not 0 <= self.hit_tokens <= self.queried_tokens:
            raise ValueError(f"{self.kind} pool: need 0 <= hit <= queried tokens, got "
                             f"{self.hit_tokens}, {self.queried_tokens}")


class PoolKinds(KVPolicy):
    """A hybrid policy: one pool (or KV cache group set) per layer kind."""

    @abstractmethod
    def pool_usage(self) -> dict[str, PoolUsage]:
        """Each pool kind the policy holds (keys from POOL_KINDS), read-only."""

    def caches_no_prefix(self) -> bool:
        """True when the layout's own rule turns the prefix cache off (vLLM's Mamba mode
        `none`): every hit is then lost to that rule, not to capacity. Default: False."""
        return False

    def stretch_pool_usage(self) -> dict[str, np.ndarray]:
        """Per pool kind, the (used, cached) bytes after each step of the last
        `decode_steps` call ((steps, 2)), which the Recorder integrates step by step as
        stepping integrates `pool_usage`: a PoolKinds policy that is a DecodeStretch must
        give them. Default: none (a policy that steps every decode)."""
        return {}

    @property
    def shared_pool(self) -> bool:
        """True when every kind draws its blocks from one pool (vLLM's KV cache groups over
        one block pool): each kind's `capacity_bytes` is then that one pool, and the kinds'
        bytes in use are shares of it, not pools of their own. Default: separate pools
        (SGLang's full / SWA / state pools)."""
        return False


#: every capability, in the order DEVELOPERS.md lists them
CAPABILITIES: tuple[type[KVPolicy], ...] = (PrefixCache, Reserving, DecodeStretch, LowerTiers,
                                            PoolKinds)
