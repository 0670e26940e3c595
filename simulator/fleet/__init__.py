"""Fleets: several replicas of one engine behind a router, in one simulation.

`simulate_fleet` (run_fleet.py) runs them; `Fleet` (fleet.py) wires the replicas, the router
and the arrivals; the routers are registered in `ROUTERS` (router.py), one module per family:
basic_routers.py (random, round robin, least load, session affinity, consistent hashing with
bounded loads), sglang_router.py (SGLang's cache-aware), llmd_router.py (llm-d's scorers
and its benchmark presets), dynamo_router.py (Dynamo's KV router). Their structures:
approx_tree.py, lru_index.py, hash_ring.py, kv_index.py (fed by kv_events.py).
"""

from simulator.fleet import basic_routers, dynamo_router, llmd_router, sglang_router  # noqa: F401  (register the routers)
from simulator.fleet.router import ROUTERS, parse_settings
from simulator.fleet.run_fleet import FleetOutcome, FleetSetup, simulate_fleet

__all__ = ["ROUTERS", "FleetOutcome", "FleetSetup", "parse_settings", "simulate_fleet"]
