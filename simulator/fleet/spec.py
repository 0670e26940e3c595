"""`FleetSpec`: the fleet options of a run (replicas, router, its settings, the KV events'
delay), and the checks that need the policy too.

`--replicas 1` (the default) is today's single engine: the fleet options then stay out of the
summary and the config hash (experiments/options/run_options.py), and giving a router option with
one replica is a mistake (`check`). A grid that varies `--replicas` drops the router options
from its one-replica cells instead (`grid_cell`), and the event delay from the cells whose
router reads no events.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvcore.contract.fields import Domain, check_fields, spec_field
from simulator.fleet import ROUTERS, FleetSetup, parse_settings

__all__ = ["DEFAULT_ROUTER", "ROUTER_OPTIONS", "FleetSpec", "grid_cell"]

#: the router of a fleet that names none: each replica in turn (production-stack's default,
#: and the "router off" arm of Dynamo's and SGLang's published A/B tests)
DEFAULT_ROUTER = "round-robin"
#: the options that only a fleet of two or more replicas reads
ROUTER_OPTIONS = ("router", "router_args", "kv_event_delay_s")


def _routers() -> list[str]:
    return ROUTERS.names()


@dataclass(frozen=True)
class FleetSpec:
    """Replicas of the engine behind a router (docs/fleet.md)."""

    replicas: int = spec_field(
        1, "engine replicas behind a router, each a whole engine (its own pool, prefix "
        "cache, queue and latency; --tp and the memory rule apply per replica)",
        domain=Domain(1, 4096), axis=True)
    router: str | None = spec_field(
        None, f"how a fleet routes arrivals (default {DEFAULT_ROUTER}; docs/fleet.md)",
        choices=_routers, axis=True)
    router_args: str | None = spec_field(
        None, "the router's settings, key=value pairs separated by commas (each router's "
        "keys and upstream defaults: docs/fleet.md)")
    kv_event_delay_s: float | None = spec_field(
        None, "a router reading the replicas' caches through KV events: seconds before an "
        "event reaches it (default 0)", domain=Domain(0))

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def resolved_router(self) -> str:
        return self.router or DEFAULT_ROUTER

    @property
    def reads_kv_events(self) -> bool:
        r = self.resolved_router
        return ROUTERS.get(r).reads_kv_events(parse_settings(r, self.router_args))

    def check(self, policy: str, caching: list[str], hybrid_model: str | None = None) -> None:
        """The rules across options of one run: router options need two replicas or more; a
        router reading the replicas' caches needs a policy that keeps one, on a model whose
        cache publishes KV events (`hybrid_model`: the hybrid model run, whose pools do
        not)."""
        if self.replicas == 1:
            given = [o for o in ROUTER_OPTIONS if getattr(self, o) is not None]
            if given:
                flags = ", ".join("--" + o.replace("_", "-") for o in given)
                raise ValueError(f"{flags}: a router needs --replicas 2 or more (one replica "
                                 "takes every request)")
            return
        parse_settings(self.resolved_router, self.router_args)
        if self.kv_event_delay_s is not None and not self.reads_kv_events:
            raise ValueError(f"--kv-event-delay-s: --router {self.resolved_router} reads no "
                             "KV events (llm-d-precise, dynamo, or llm-d with precise=...)")
        if self.reads_kv_events and policy not in caching:
            raise ValueError(f"--router {self.resolved_router} reads the replicas' prefix "
                             f"caches through KV events; --policy {policy} keeps none "
                             f"({', '.join(caching)} do)")
        if self.reads_kv_events and hybrid_model is not None:
            raise ValueError(f"--router {self.resolved_router} reads the replicas' prefix "
                             f"caches through KV events; --model {hybrid_model} is hybrid "
                             "and its pools publish none here (use a router without "
                             "KV events: cache-aware, llm-d, dynamo with kv-events=false)")

    def setup(self) -> FleetSetup:
        return FleetSetup(self.replicas, self.resolved_router, self.router_args,
                          self.kv_event_delay_s or 0.0)

    def resolved(self) -> dict[str, Any]:
        """The fleet's summary columns: none for one replica (today's columns), else every
        option at the value in effect."""
        if self.replicas == 1:
            return {}
        return {"replicas": self.replicas, "router": self.resolved_router,
                "router_args": self.router_args,
                "kv_event_delay_s": (self.kv_event_delay_s or 0.0) if self.reads_kv_events
                else None}


def grid_cell(spec: FleetSpec) -> FleetSpec:
    """A grid cell's fleet options: a one-replica cell drops the router options (the cells of
    every router are then one run), a cell whose router reads no events drops the delay."""
    if spec.replicas == 1:
        return replace(spec, router=None, router_args=None, kv_event_delay_s=None)
    if spec.kv_event_delay_s is not None and not spec.reads_kv_events:
        return replace(spec, kv_event_delay_s=None)
    return spec
