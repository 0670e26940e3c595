"""The one interface every KV allocation policy implements.

The simulator, the CLI and the reports only ever talk to `KVPolicy`, so a new policy is a new
class plus one `register_policy` line. All quantities are in KV *slots* (one token of KV in
every layer), never bytes: bytes are capacity x the model's KV bytes per token. What a policy
reports, `MemoryBreakdown`, and the fragmentation metrics live in kvcore/breakdown.py.

Conventions shared by all policies
----------------------------------
* A request's KV is written for `prompt + output - 1` tokens (the last sampled token is never
  written back). That count is the request's *final length* L.
* `written` is how many of the request's tokens have KV in the pool (its device length).
* Every operation that can fail for lack of memory is all-or-nothing: on failure it returns
  False/None and no request's state changes (a policy may still have evicted cache to try).
* Bad arguments to `extend` / `decode` are checked by one implementation here
  (`check_extend_args`, `check_decode_args`, `check_distinct`) before anything changes, so
  every policy rejects them with the same one-line ValueError.
* `check_invariants()` raises `InvariantError` naming the broken rule; it is cheap enough to call
  after every operation in tests and with `--check-invariants`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

import numpy as np

from kvcore.breakdown import MemoryBreakdown
from kvcore.registry import Registry
from kvcore.tiers import TierConfig, TierState

__all__ = [
    "POLICIES",
    "AdmitResult",
    "KVPolicy",
    "PolicyConfig",
    "PolicyKind",
    "PrefixPeek",
    "make_policy",
    "policy_help",
    "policy_kind",
    "policy_names",
    "register_policy",
]

#: how an extend/decode past the model's context is worded (policies with per-request
#: reservations pass their own phrase)
BEYOND_CONTEXT = "exceeds max_context_len"

Ints = Sequence[int] | np.ndarray


@dataclass(frozen=True)
class AdmitResult:
    """What admission gave a request: its page-table row and the prefix already cached.

    `cached_len` tokens of the prompt were found in the prefix cache (page-aligned, at most
    prompt - 1); the request's `written` starts there. `token_hit` is the match a token-granular
    cache holding the same content would give (>= cached_len): the difference is the reuse
    lost to page alignment.
    """

    row: int
    cached_len: int
    token_hit: int = -1
    host_hit: int = 0  # of cached_len: tokens loaded from the host tier (kvcore/tiers.py)
    storage_hit: int = 0  # of cached_len: tokens loaded from the storage tier

    @property
    def unaligned_hit(self) -> int:
        return self.cached_len if self.token_hit < 0 else self.token_hit


class PrefixPeek(NamedTuple):
    """What admission would find in the prefix cache now: `hit` tokens (page-aligned), of
    which `evictable` are held by the cache alone (unlocked: counted in evictable_tokens)."""

    hit: int
    evictable: int


class KVPolicy(ABC):
    """A KV allocation policy driven request by request.

    Lifecycle of one request `rid` (the simulator guarantees this order):

        admit -> extend* (prefill chunks) -> cache_prefix? -> decode* -> finish
                    \\-> release (preempted or aborted; may be re-admitted later as new)

    Invariants every implementation keeps (checked by `check_invariants`):
    * no slot is owned twice (free list, one request's private memory, the prefix cache);
    * nothing leaks: free + privately owned + cached == capacity;
    * `breakdown()` parts are non-negative and sum to `capacity`.
    """

    #: registry name, e.g. "paged"
    name: str = ""
    #: tokens a storage tier may deliver at the next `admit` (set by the engine's prefetch
    #: policy; read by policies with lower tiers only)
    storage_allowance: int = 0

    def __init__(self, capacity: int, page_size: int) -> None:
        self.capacity = capacity
        self.page_size = page_size

    # -- argument checks shared by every policy ----------------------------------------------
    @staticmethod
    def check_distinct(op: str, rids: Sequence[int]) -> None:
        """A batch names each request once (a repeat would allocate for it twice)."""
        if len(set(rids)) != len(rids):
            raise ValueError(f"{op} got the same request twice")

    @staticmethod
    def check_extend_args(rids: Sequence[int], targets: Ints, written: Ints,
                          limit: int | Ints, beyond: str = BEYOND_CONTEXT) -> None:
        """`extend(rids, targets)` is well formed: as many targets as requests, no request
        twice, and written[i] <= targets[i] <= limit (one limit, or one per request: the
        context length, or a reservation). A bad target names the first offending request.
        One request (a prefill chunk, the common call) is checked with plain comparisons."""
        n = len(rids)
        if len(targets) != n:
            raise ValueError(f"rids and target_lens differ in length: {n} != {len(targets)}")
        if n == 1:
            if written[0] <= targets[0] <= (limit if isinstance(limit, int) else limit[0]):
                return
        else:
            KVPolicy.check_distinct("extend", rids)
            t = np.asarray(targets, dtype=np.int64)
            if ((np.asarray(written) <= t) & (t <= np.asarray(limit))).all():
                return
        limits = repeat(limit) if isinstance(limit, int) else limit
        for rid, t, w, lim in zip(rids, targets, written, limits, strict=False):
            if t < w:
                raise ValueError(f"target_len {t} of request {rid} is below written {w}")
            if t > lim:
                raise ValueError(f"target_len {t} of request {rid} {beyond} {lim}")

    @staticmethod
    def check_decode_args(rids: Sequence[int], written: Ints, limit: int | Ints,
                          beyond: str = BEYOND_CONTEXT, steps: int = 1) -> None:
        """`steps` more tokens fit every request: written[i] + steps <= limit (one limit, or
        one per request). The caller checks repeats (`check_distinct`) where it has none
        memoised. With one limit this is one reduction over the batch."""
        if isinstance(limit, int):
            if not len(written):
                return
            top = max(written) if isinstance(written, list) else int(np.max(written))
            if top + steps <= limit:
                return
            limits: Ints | repeat[int] = repeat(limit)
        else:
            if all(w + steps <= lim for w, lim in zip(written, limit, strict=True)):
                return
            limits = limit
        for rid, w, lim in zip(rids, written, limits, strict=False):
            if w + steps > lim:
                raise ValueError(f"decode of request {rid} {beyond} {lim}")

    # -- admission -------------------------------------------------------------------------
    @abstractmethod
    def peek_prefix(self, token_ids: np.ndarray) -> int:
        """Tokens of `token_ids` (already capped by the caller) the cache would serve now.

        Read-only: no lock, no LRU touch; used by schedulers to order and budget the queue."""

    def peek_admission(self, token_ids: np.ndarray) -> PrefixPeek:
        """`peek_prefix` and the part of that hit which `available_tokens()` counts now as
        evictable. Admitting the request locks its hit, so that part stops being available:
        an admission budget must leave it out, or it counts the same slots twice (as memory it
        could free and as prefix it already has). Default: no cache, nothing evictable."""
        return PrefixPeek(self.peek_prefix(token_ids), 0)

    @abstractmethod
    def reservation(self, prompt_len: int, final_len: int, max_new_tokens: int) -> int:
        """Slots this policy reserves up front for such a request (0 for on-demand paging)."""

    @abstractmethod
    def admit(
        self, rid: int, token_ids: np.ndarray, final_len: int, max_new_tokens: int
    ) -> AdmitResult | None:
        """Give `rid` a page-table row, lock its cached prefix, and make any up-front
        reservation. `token_ids` is the prompt. None (nothing changed) when there is no row or,
        for reserving policies, no hole that fits."""

    # -- growth ----------------------------------------------------------------------------
    @abstractmethod
    def extend(self, rids: Sequence[int], target_lens: Sequence[int]) -> bool:
        """Allocate and write KV so that each `rids[i]` has `target_lens[i]` written tokens
        (a prefill chunk). Batched, all-or-nothing; evicts unlocked cache when short."""

    @abstractmethod
    def decode(self, rids: Sequence[int]) -> bool:
        """One more written token for each request (a decode step). Batched, all-or-nothing."""

    def decode_cost(self, rids: Sequence[int], n: int) -> int:
        """Slots of new memory that `n` decode steps of `rids` would take (whole pages).
        Default: page-granular on-demand growth; reserving policies return 0."""
        ps = self.page_size
        total = 0
        for rid in rids:
            w = self.written(rid)
            total += (-(-(w + n) // ps) - -(-w // ps)) * ps
        return total

    def decode_steps(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """`n` decode steps at once, with exactly the result of `n` calls of `decode(rids)`;
        returns the breakdown parts (columns in PARTS order) after each step, so the engine
        keeps exact time-weighted averages.

        The engine only asks when `decode_cost(rids, n) <= available_tokens()`, so no step
        can fail. Default: the predicted profile, then n single steps."""
        if self.decode_cost(rids, n) > self.available_tokens():
            raise ValueError("decode_steps needs decode_cost <= available_tokens")
        profile = self.decode_profile(rids, n, head_reservation)
        for _ in range(n):
            if not self.decode(rids):
                raise RuntimeError("a decode step failed although memory was available")
        return profile

    def decode_profile(self, rids: Sequence[int], n: int, head_reservation: int) -> np.ndarray:
        """The breakdown parts (columns in PARTS order) after each of the next `n` decode
        steps of `rids`, without changing anything; lets the engine keep exact time-weighted
        averages when it advances many steps at once. Default: reserving policies, where a step
        only turns one reserved slot per request into token state."""
        row = self.breakdown(head_reservation).as_array()
        out = np.repeat(row[None, :], n, axis=0)
        steps = np.arange(1, n + 1, dtype=np.int64) * len(rids)
        out[:, 0] += steps
        out[:, 2] -= steps
        return out

    def free_tokens(self) -> int:
        """Slots free right now (without evicting anything)."""
        return self.available_tokens() - self.evictable_tokens()

    def fresh_tokens(self) -> int:
        """Slots the next allocations take before the first one evicts cached content. A
        scheduler that orders its queue by cache hits must look again after an eviction.
        Default: the free slots (a cache is evicted only when free memory runs out)."""
        return self.free_tokens()

    # -- ending ----------------------------------------------------------------------------
    @abstractmethod
    def cache_prefix(self, rid: int, token_ids: np.ndarray) -> None:
        """Offer the request's written tokens (`token_ids` are their ids) to the prefix cache
        while it keeps running, so later requests can match them (SGLang's
        cache_unfinished_req). A no-op for policies without a cache."""

    @abstractmethod
    def finish(self, rid: int, token_ids: np.ndarray) -> None:
        """The request completed: cache its `written` tokens (ids in `token_ids`), free what is
        private, release its row."""

    @abstractmethod
    def release(self, rid: int) -> None:
        """Preempt or abort: give back everything `rid` holds without caching its new KV."""

    # -- observation -----------------------------------------------------------------------
    @abstractmethod
    def written(self, rid: int) -> int:
        """KV tokens written for `rid` so far."""

    @abstractmethod
    def available_tokens(self) -> int:
        """Slots obtainable right now without preempting anyone: free + evictable cache."""

    @abstractmethod
    def evictable_tokens(self) -> int:
        """Slots held only by the prefix cache."""

    @abstractmethod
    def breakdown(self, head_reservation: int) -> MemoryBreakdown:
        """Where every slot is now. `head_reservation` is what the request at the head of the
        waiting queue would need (the max context length when none waits); it decides which
        free holes count as external fragmentation."""

    @abstractmethod
    def page_table_entries(self) -> int:
        """Block-table entries of live requests: sum of ceil(context / page_size)."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise InvariantError if any invariant of the policy or its structures is broken."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release tensors early (optional)."""

    def live_requests(self) -> int:
        """Requests holding memory or a row now (default: not tracked)."""
        return 0

    def tier_state(self) -> TierState | None:
        """Lower KV tiers' occupancy and the pages moved between tiers so far (None: the
        policy has no lower tier). The engine charges the traffic as transfer time."""
        return None


@dataclass(frozen=True)
class PolicyConfig:
    """Everything a policy factory needs; one shape for every policy.

    `kv_tokens` is the pool size in slots; paged policies use `kv_tokens // page_size` pages
    (capacity = pages x page_size), so a capacity is always a whole number of pages.
    `max_requests` is the number of page-table rows (concurrent requests). `placement` is read
    by contiguous policies only, `eviction` by cache-holding ones; `store_kv` allocates a real
    K/V buffer (tests, small pools) instead of shape-only accounting.
    """

    kv_tokens: int
    page_size: int = 1
    max_context_len: int = 2048
    max_requests: int = 256
    device: str = "cpu"
    placement: str = "first-fit"
    eviction: str = "lru"
    num_layers: int = 1
    num_kv_heads: int = 1
    head_dim: int = 1
    kv_dtype: str = "bf16"
    store_kv: bool = False
    # lower KV tiers behind the device pool (kvcore/tiers.py), in slots; 0: none
    host_tokens: int = 0
    storage_tokens: int = 0
    hicache_write_policy: str = "write_through"

    @property
    def num_pages(self) -> int:
        return self.kv_tokens // self.page_size

    @property
    def capacity(self) -> int:
        return self.num_pages * self.page_size

    @property
    def tiers(self) -> TierConfig:
        """The lower tiers asked for (`enabled` when there is a host tier)."""
        return TierConfig(self.host_tokens, self.storage_tokens, self.hicache_write_policy)


# -- registry --------------------------------------------------------------------------------

PolicyFactory = Callable[[PolicyConfig], KVPolicy]


@dataclass(frozen=True)
class PolicyKind:
    """A registered policy: how to build it from its `PolicyConfig`, the one-line "pick it
    when" users see, and what it can do, declared once so that option checks and the run
    builder ask the entry instead of keeping lists of names."""

    build: PolicyFactory
    when: str
    caches_prefix: bool = False  # keeps a prefix cache (--enable-prefix-caching applies)
    supports_tiers: bool = False  # can put a host (and storage) tier behind the device pool


#: every policy, registered in the module named after it (kvcore/policies/paged.py, vllm.py,
#: contiguous.py)
POLICIES: Registry[PolicyKind] = Registry("policy")


def register_policy(name: str, when: str, *, caches_prefix: bool = False,
                    supports_tiers: bool = False) -> Callable[[PolicyFactory], PolicyFactory]:
    """Register a factory under `name` with its capabilities; `when` is the one-line 'pick it
    when' shown to users."""

    def deco(factory: PolicyFactory) -> PolicyFactory:
        POLICIES.add(name, PolicyKind(factory, when, caches_prefix, supports_tiers), when)
        return factory

    return deco


def policy_names() -> list[str]:
    return POLICIES.names()


def policy_help() -> dict[str, str]:
    return POLICIES.help()


def policy_kind(name: str) -> PolicyKind:
    """The registered entry of `name`; an unknown name lists the known ones."""
    return POLICIES.get(name)


def make_policy(name: str, config: PolicyConfig) -> KVPolicy:
    """Build a registered policy by name; an unknown name lists the known ones."""
    return POLICIES.get(name).build(config)
