"""`--engine vllm|sglang`: one flag for "as this engine runs by default".

A faithful vLLM run needs four options that each default to something else in kvsim: the
policy (vLLM's block manager), the admission (vLLM's scheduler), the budget rule (vLLM's
`gpu_memory_utilization`) and the latency profile (vLLM on Hopper). `--engine` sets them
together, each to the engine's own default as listed in `ENGINE_DEFAULTS` (with the engine
source it is read from). Every one of them stays an option of its own: **an explicit option
wins** over `--engine`, flag by flag (`--engine vllm --admission sglang` is vLLM's policy,
budget rule and profile under SGLang's admission).

Precedence, level by level (defaults < `--config` file < command line): `--engine` given at a
level sets the options not given at that level or above, so `--config saved.json --engine
sglang` runs the file under SGLang's defaults, while a file's own `policy` still wins over a
file's `engine`. Two defaults step aside for an explicit choice that leaves them nothing to
set: the budget rule when the pool is sized directly (`--kv-tokens`, `--num-pages`,
`--kv-mem-gib`), and the latency profile under `--latency constant`.

No `--engine` means kvsim's own defaults, and they stay what they were (recorded results
unchanged): SGLang's policy, admission and budget rule (so `--engine sglang` sets the same
three), a latency profile that follows the budget rule (`--budget vllm` alone still picks
`vllm-hopper`; under `--engine sglang` the profile is SGLang's whatever the rule), and a
16-token page for both (vLLM's default block; SGLang's own default page is 1: add
`--page-size 1`). A run with `--engine` carries an `engine` column in summary.csv and
config.json, and every running command prints `engine_header` first.

Engine versions: each entry names the release its defaults are read from (`release`). An
`--engine-version` option would pick among releases here: `ENGINE_DEFAULTS` would then be
keyed by (engine, version), and `engine_defaults` is the one function that reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvcore.model.memory import DIRECT_SIZES

ENGINE_OPTION = "engine"


@dataclass(frozen=True)
class Default:
    """One option an engine sets: its value and where the engine sets it."""

    option: str
    value: Any
    source: str


@dataclass(frozen=True)
class EngineDefaults:
    """What `--engine NAME` sets, read from one release of that engine."""

    name: str
    release: str
    defaults: tuple[Default, ...]

    def values(self) -> dict[str, Any]:
        return {d.option: d.value for d in self.defaults}


ENGINE_DEFAULTS: dict[str, EngineDefaults] = {e.name: e for e in (
    EngineDefaults("vllm", "vLLM v0.19.1", (
        Default("policy", "vllm", "prefix caching on by default (vllm/config/cache.py "
                "enable_prefix_caching; vllm/v1/core/kv_cache_manager.py, block_pool.py)"),
        Default("admission", "vllm", "the V1 scheduler admits while allocate_slots finds the "
                "blocks (vllm/v1/core/sched/scheduler.py; simulator/admission.py)"),
        Default("budget", "vllm", "gpu_memory_utilization 0.9 of total memory (vllm/config/"
                "cache.py, vllm/engine/arg_utils.py; kvcore/model/memory.py)"),
        Default("latency_profile", "vllm-hopper", "FLASH_ATTN (FA3) on Hopper, fitted to "
                "v0.19.1's ITL line (simulator/latency_profiles.py)"),
    )),
    EngineDefaults("sglang", "SGLang v0.5", (
        Default("policy", "paged", "the radix cache on by default (python/sglang/srt/"
                "server_args.py disable_radix_cache; mem_cache/radix_cache.py)"),
        Default("admission", "sglang", "PrefillAdder's budget with new_token_ratio "
                "(python/sglang/srt/managers/schedule_policy.py; simulator/admission.py)"),
        Default("budget", "sglang", "mem_fraction_static by TP size (python/sglang/srt/"
                "server_args.py; kvcore/model/memory.py)"),
        Default("latency_profile", "sglang-hopper", "fa3 on Hopper, fitted to SGLang PR "
                "#4832 (simulator/latency_profiles.py)"),
    )),
)}


def engine_defaults(name: str) -> EngineDefaults:
    """The defaults of engine `name` (ValueError naming the known engines)."""
    try:
        return ENGINE_DEFAULTS[name]
    except KeyError:
        raise ValueError(f"--engine {name!r} is not one of: "
                         f"{', '.join(ENGINE_DEFAULTS)}") from None


def _steps_aside(option: str, merged: Mapping[str, Any]) -> bool:
    """A default with nothing to set under the explicit choices in `merged`."""
    if option == "budget":
        return any(merged.get(n) is not None for n in DIRECT_SIZES)
    if option == "latency_profile":
        return merged.get("latency", "roofline") != "roofline"
    return False


def apply_engine(levels: Sequence[Mapping[str, Any]], typed: bool = False) -> dict[str, Any]:
    """Option values given at each level (lowest first; names normalized) merged, with the
    engine's defaults filled in at the level `--engine` was given: an option given at that
    level or above keeps its value (see the module notes). `typed`: the last level is what
    the user typed (the command line), where an --engine that sets nothing is refused (a
    saved config.json, which echoes every option, may hold one)."""
    merged: dict[str, Any] = {}
    for level in levels:
        merged.update(level)
    at = max((i for i, lv in enumerate(levels) if lv.get(ENGINE_OPTION) is not None),
             default=None)
    if at is None:
        return merged
    name = levels[at][ENGINE_OPTION]
    set_any = False
    for option, value in engine_defaults(name).values().items():
        if any(option in lv for lv in levels[at:]) or _steps_aside(option, merged):
            continue
        merged[option] = value
        set_any = True
    if typed and at == len(levels) - 1 and not set_any:  # typed, and a no-op
        raise ValueError(f"--engine {name} sets nothing here: --policy, --admission, "
                         "--budget (or a direct pool size) and --latency-profile (or "
                         "--latency constant) are all given; drop it")
    return merged


def engine_header(values: Mapping[str, Any],
                  swept: Mapping[str, str] | None = None) -> str | None:
    """The line every running command prints first under `--engine` (None without it):
    which engine, its release, the defaults in effect and those an explicit option
    replaced. `values`: the run's options by name (RunOptions.to_dict()); `swept`: option
    name -> the list flag as given (`--policies paged,vllm`) for the options a grid command
    runs several values of, which replace the engine's one value in every cell."""
    name = values.get(ENGINE_OPTION)
    if name is None:
        return None
    e = engine_defaults(name)
    kept, replaced = [], []
    for d in e.defaults:
        flag = "--" + d.option.replace("_", "-")
        got = values.get(d.option)
        if swept and d.option in swept:
            replaced.append(swept[d.option])
        elif got == d.value:
            kept.append(f"{flag} {d.value}")
        elif not _steps_aside(d.option, values):
            replaced.append(f"{flag} {got}")
    line = f"engine: {e.name} ({e.release} defaults): {', '.join(kept) or 'none'}"
    if replaced:
        line += f"; given instead: {', '.join(replaced)}"
    return line


__all__ = ["ENGINE_DEFAULTS", "ENGINE_OPTION", "Default", "EngineDefaults", "apply_engine",
           "engine_defaults", "engine_header"]
