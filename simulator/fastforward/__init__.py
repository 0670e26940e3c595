"""The fast-forward: the engine's iterations whose outcome is fixed in advance, many at once,
with results identical to stepping them (summaries, request rows, timeline).

* `rules.py`: the run's options and the policy's capabilities turned into `StretchRules` once;
* `planner.py`: `FastForward`, the one planner (which iterations a stretch may take, and how
  long) and the one run path (the policy's batched call, the recorder, the clock), over the
  engine's narrow `StretchHost`;
* `steps.py`: what the steps hand the recorder and the clock, from their start and growth.
"""

from simulator.fastforward.planner import FastForward, Stretch, StretchHost
from simulator.fastforward.rules import EvictLimit, StretchRules, stretch_rules

__all__ = ["EvictLimit", "FastForward", "Stretch", "StretchHost", "StretchRules",
           "stretch_rules"]
