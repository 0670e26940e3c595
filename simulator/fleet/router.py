"""What a router is: the registry of routers, their settings, the request they route and the
only window they have on the replicas.

A router (one class per published rule, registered by name in `ROUTERS`) picks a replica for
each arriving request. It sees what its real counterpart sees and nothing else:

* the request: its id, session id and prompt token ids (`RoutedRequest`);
* its own history: what it sent where, which of those finished (`finished`), and, through
  the response stream, whether a request's first token came back (`FleetView.prefill_done`);
* the load each replica reports (`FleetView.waiting` / `running` / `kv_usage`: vLLM's and
  SGLang's metrics, read when the router decides);
* the replicas' caches only as their KV events told it, after the events' delay
  (`FleetView.kv_index`), for the routers that subscribe (`reads_kv_events`).

Settings: each router declares a frozen dataclass of its knobs with the upstream defaults
(`Settings`); `--router-args key=value,...` overrides them (`parse_settings`). A preset (a
published benchmark's configuration) is a subclass with other defaults.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol

import numpy as np

from kvcore.contract.registry import Registry
from kvcore.vllm.block_hash import NONE_HASH, ChainHasher, block_hashes
from simulator.fleet.kv_index import KVEventIndex

__all__ = ["LOAD", "MATCH", "ROUTERS", "Decision", "FleetView", "PoolReport", "RoutedRequest",
           "Router", "parse_settings", "setting", "settings_help"]

#: how a decision was taken, for the router's statistics: sent where the router's prefix
#: information pointed, or by load (a fallback: imbalance, match below threshold, no match)
MATCH, LOAD = "match", "load"


def setting(default: Any, help: str) -> Any:
    """A router setting: its upstream default and what it means."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class PoolReport:
    """What every replica's engine reports about its KV pool once, at start (vLLM's
    `cache_config_info` metric: block size, number of GPU blocks), the block of its KV events
    (simulator/fleet/kv_events.py `event_block`) and the context bound: a prompt is hashed up
    to it (a longer one is rejected by every replica anyway)."""

    page_size: int
    blocks: int
    max_len: int
    event_block: int


@dataclass(frozen=True)
class Decision:
    replica: int
    how: str = ""  # MATCH, LOAD, or "" for a router without prefix information


class FleetView(Protocol):
    """What a router may read of the fleet at the instant it decides."""

    now: float
    kv_index: KVEventIndex | None

    def waiting(self, replica: int) -> int: ...
    def running(self, replica: int) -> int: ...
    def kv_usage(self, replica: int) -> float: ...
    def prefill_done(self, rid: int) -> bool: ...


class RoutedRequest:
    """A request as a router sees it; hashes of its prompt are computed once per block size
    and shared by the scorers that need them."""

    __slots__ = ("_hashes", "limit", "prompt", "rid", "session_id")

    def __init__(self, rid: int, session_id: int | None, prompt: np.ndarray,
                 limit: int) -> None:
        self.rid = rid
        self.session_id = session_id
        self.prompt = prompt
        self.limit = limit  # tokens hashed at most (the context bound: PoolReport.max_len)
        self._hashes: dict[tuple[int, bool, int | None], list[int]] = {}

    def block_hashes(self, hasher: ChainHasher, max_blocks: int | None = None,
                     partial: bool = False) -> list[int]:
        """The chained hashes of the prompt's full blocks (at most `max_blocks`), and with
        `partial` one more for a trailing partial block (llm-d's approximate scorer hashes
        it; its precise scorer and Dynamo drop it). `hasher`: built for `limit` tokens."""
        block = hasher.page_size
        key = (block, partial, max_blocks)
        got = self._hashes.get(key)
        if got is None:
            prompt = self.prompt[: self.limit]
            if max_blocks is not None:
                prompt = prompt[: max_blocks * block]
            full = hasher.chain(NONE_HASH, prompt)
            got = full.tolist()
            tail = prompt[len(full) * block:]
            if partial and len(tail):
                parent = full[-1:] if len(full) else np.array([NONE_HASH], dtype=np.uint64)
                got.append(int(block_hashes(parent, tail[None, :])[0]))
            self._hashes[key] = got
        return got


class Router(ABC):
    """One routing rule over `replicas` replicas."""

    name: ClassVar[str] = ""
    #: the knobs of this rule and their upstream defaults (a frozen dataclass)
    Settings: ClassVar[type] = dataclass(frozen=True)(type("NoSettings", (), {}))
    #: each decision depends only on the requests and the earlier decisions (no load, no
    #: clock): the fleet may route an open-loop stream before it runs
    decides_ahead: ClassVar[bool] = False
    #: reports how its decisions were taken (MATCH / LOAD); a router whose settings can
    #: leave out its prefix information sets it per instance
    prefix_aware: bool = False

    def __init__(self, replicas: int, settings: Any, rng: np.random.Generator,
                 pool: PoolReport) -> None:
        self.replicas = replicas
        self.settings = settings
        self.rng = rng
        self.pool = pool
        #: requests sent to each replica and not finished (every gateway counts them)
        self.in_flight = [0] * replicas

    @classmethod
    def reads_kv_events(cls, settings: Any) -> bool:
        """Whether these settings subscribe to the replicas' KV events (a policy that
        publishes them is then required)."""
        return False

    @abstractmethod
    def choose(self, req: RoutedRequest, view: FleetView) -> Decision:
        """The replica for `req` (and how it was chosen); the router records the decision."""

    def sent(self, replica: int, req: RoutedRequest) -> None:
        """`req` went to `replica` (after `choose`)."""
        self.in_flight[replica] += 1

    def finished(self, replica: int, rid: int) -> None:
        """A request sent to `replica` completed or was rejected (its response ended)."""
        self.in_flight[replica] -= 1

    def kv_block(self) -> int:
        """The block size (tokens) of the KV events this router reads."""
        return self.pool.event_block

    def check_invariants(self) -> None:  # noqa: B027  (a router without structures)
        """The router's own structures (none by default)."""


ROUTERS: Registry[type[Router]] = Registry("router")


def _coerce(f: dataclasses.Field, text: str, where: str) -> Any:
    kind = type(f.default)
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return kind(text)
    except ValueError:
        raise ValueError(f"{where}: {f.name}={text!r} is not a {kind.__name__}") from None


def parse_settings(router: str, text: str | None) -> Any:
    """`router`'s settings with `text` ("key=value,key=value") applied; one line naming the
    key and the known ones for a mistake."""
    cls = ROUTERS.get(router)
    where = f"--router-args for --router {router}"
    base = cls.Settings()
    if not text:
        return base
    known: dict[str, dataclasses.Field] = {f.name.replace("_", "-"): f
                                            for f in fields(base)}
    changes: dict[str, Any] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        f = known.get(key.strip().replace("_", "-"))
        if not eq or f is None:
            names = ", ".join(known) or "none"
            raise ValueError(f"{where}: {part!r} is not key=value with a known key "
                             f"({names})")
        changes[f.name] = _coerce(f, value.strip(), where)
    out = dataclasses.replace(base, **changes)
    check = getattr(out, "check", None)
    if callable(check):  # a router's own rules across its settings
        check(where)
    return out


def settings_help(router: str) -> list[tuple[str, Any, str]]:
    """(key, default, meaning) of each of `router`'s settings (docs/fleet.md)."""
    cls = ROUTERS.get(router)
    return [(f.name.replace("_", "-"), f.default, f.metadata.get("help", ""))
            for f in fields(cls.Settings())]
