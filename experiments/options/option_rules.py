"""Every option acts or is refused: when an option given away from its default applies.

An option the run would not read is an answer to a question nobody simulated (`--placement
buddy` under `--policy paged`, which places nothing; `--hicache-write-policy write_back`
without a host tier). The project's rule (also workloads/registry.py `check_options_used`
for the workload's knobs and simulator/hybrid.py for the hybrid ones) is that such an option
is refused with one line naming it and what it needs.

`RULES` declares, per option, when it applies: a predicate over the run's options, the
options that decide it (`on`: the pairs that could conflict, which
tests/cli/test_option_pairs.py also derives from the declarations) and the words of the
error. `check_options_apply` is called by every running command on its options with the
lists of its grid (experiments/console/command_options.py): an option passes when it applies to the
run, or to at least one cell of the grid (`--placement buddy` with `--policies
paged,contiguous-max` places the contiguous cells).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from experiments.options.run_options import OPTIONS, RunOptions
from kvcore.contract.fields import flag
from kvcore.model.memory import BUDGET_RULES, DIRECT_SIZES


@functools.cache
def _reserves(policy: str) -> bool:
    """The policy reserves each request's memory at admission (the `Reserving` capability):
    a decode step never runs out of memory, so nothing is preempted."""
    from kvcore.contract.capabilities import Reserving
    from kvcore.policies import PolicyConfig, make_policy

    p = make_policy(policy, PolicyConfig(kv_tokens=64, page_size=1, max_context_len=64,
                                         max_requests=2))
    p.close()
    return isinstance(p, Reserving)


def _reads(option: str) -> Callable[[RunOptions], bool]:
    """The policy's registration says it reads this choice (PolicyKind.reads)."""
    from kvcore.policies import POLICIES

    return lambda o: option in POLICIES.get(o.policy.policy).reads


def _caches(o: RunOptions) -> bool:
    from simulator.specs import caching_policies

    return o.policy.policy in caching_policies()


def _budget_rule(o: RunOptions) -> bool:
    return o.memory.rule in BUDGET_RULES


def _gpu_read(o: RunOptions) -> bool:
    """The GPU preset gives the memory (a budget rule, or the check that weights and KV fit,
    without --gpu-mem-gib), the speed (the roofline) or the host link (a tier without
    --host-link-gbps)."""
    return (o.memory.gpu_mem_gib is None or o.engine.latency == "roofline"
            or (o.tier.enabled and not o.tier.host_link_gbps))


def _state_layers(o: RunOptions) -> bool:
    """The run stores Mamba / linear-attention states: a model with state layers run as a
    hybrid (`--kv-layout full-attention` stores every layer as full attention)."""
    layout = o.run_layout.layout
    return layout is not None and bool(layout.state_groups())


def _budget_read(o: RunOptions) -> bool:
    """The budget rule sizes the pool; with the KV memory given directly (--kv-mem-gib,
    --kv-cache-memory-bytes) it only names the engine, which reads it for a hybrid model's
    layout (SGLang's under sglang, vLLM's under every other rule: kvcore/model/memory.py
    MemorySpec.engine) and for the roofline's latency profile when none is given
    (simulator/latency_profiles.py profile_for_rule)."""
    from simulator.latency_profiles import profile_for_rule

    m = o.memory
    if not m.direct_sizes():
        return True
    if m.is_hybrid() and o.policy.kv_layout == "hybrid" and m.engine != "vllm":
        return True
    return (o.engine.latency == "roofline" and o.engine.latency_profile is None
            and profile_for_rule(m.budget) != profile_for_rule(m.rule))


def _seed_read(o: RunOptions) -> bool:
    """The seed draws the workload (workloads/registry.py draws_at_random) or a fleet's
    router (simulator/fleet/fleet.py)."""
    from workloads.registry import draws_at_random

    return o.fleet.replicas > 1 or draws_at_random(o.workload_spec())


@dataclass(frozen=True)
class Applies:
    """Option `option` is read only when `when(options)` holds; `on`: the options that decide
    it; `needs`: what the error says it needs."""

    option: str
    on: tuple[str, ...]
    when: Callable[[RunOptions], bool]
    needs: str


_TIER = ("hicache_size", "hicache_ratio")
_STORAGE = ("storage_size",)
_STATES = ("model", "model_config", "kv_layout")
RULES: tuple[Applies, ...] = (
    Applies("placement", ("policy",), _reads("placement"),
            "a policy that places contiguous reservations (--policy contiguous-*)"),
    Applies("eviction", ("policy", "enable_prefix_caching"), _reads("eviction"),
            "SGLang's radix cache (--policy paged; vllm evicts its blocks LRU, as vLLM "
            "does)"),
    Applies("admission", ("policy",), lambda o: not _reserves(o.policy.policy),
            "a policy that allocates as requests grow (a contiguous policy's placement "
            "admits or refuses; no admission budget is asked)"),
    Applies("schedule", ("policy", "enable_prefix_caching"), _caches,
            "a policy with a prefix cache (lpm orders the queue by cached prefix)"),
    Applies("preempt", ("policy", "admission"),
            lambda o: not _reserves(o.policy.policy) and o.engine.admission != "reserve",
            "a policy and an admission mode that can preempt (neither reserves each "
            "request's memory up front)"),
    Applies("activation_peak_gib", ("budget", *DIRECT_SIZES),
            lambda o: o.memory.rule in ("vllm", "trtllm"),
            "the vllm or trtllm budget rule (--budget vllm / trtllm: the rules that "
            "subtract it)"),
    Applies("non_torch_gib", ("budget", *DIRECT_SIZES), _budget_rule,
            "a budget rule (a pool sized by --kv-tokens, --num-pages or --kv-mem-gib "
            "subtracts nothing)"),
    Applies("gpu", ("gpu_mem_gib", "latency", *_TIER, "host_link_gbps"), _gpu_read,
            "no --gpu-mem-gib (its memory), --latency roofline (its speed) or a host tier "
            "without --host-link-gbps (its link)"),
    Applies("workload", ("trace",), lambda o: o.workload.trace is None,
            "no --trace (the trace file replaces the built-in workload)"),
    Applies("model", ("model_config",), lambda o: o.memory.model_config is None,
            "no --model-config (the config replaces the preset)"),
    Applies("hicache_write_policy", _TIER, lambda o: o.tier.enabled,
            "a host tier (--hicache-size or --hicache-ratio)"),
    Applies("hicache_load", _TIER, lambda o: o.tier.enabled,
            "a host tier (--hicache-size or --hicache-ratio)"),
    Applies("host_link_gbps", _TIER, lambda o: o.tier.enabled,
            "a host tier (--hicache-size or --hicache-ratio)"),
    Applies("hicache_prefetch_policy", _STORAGE, lambda o: bool(o.tier.storage_size),
            "a storage tier (--storage-size)"),
    Applies("hicache_prefetch_timeout_s", (*_STORAGE, "hicache_prefetch_policy"),
            lambda o: bool(o.tier.storage_size) and o.tier.hicache_prefetch_policy == "timeout",
            "a storage tier with --hicache-prefetch-policy timeout"),
    Applies("storage_gbps", _STORAGE, lambda o: bool(o.tier.storage_size),
            "a storage tier (--storage-size)"),
    Applies("storage_latency_us", _STORAGE, lambda o: bool(o.tier.storage_size),
            "a storage tier (--storage-size)"),
    Applies("budget", (*DIRECT_SIZES, "model", "model_config", "kv_layout", "latency",
                       "latency_profile"), _budget_read,
            "a pool the rule sizes, or, beside --kv-mem-gib / --kv-cache-memory-bytes, a "
            "hybrid model (sglang picks SGLang's layout) or --latency roofline without "
            "--latency-profile (vllm picks vllm-hopper)"),
    Applies("mamba_cache_dtype", _STATES, _state_layers,
            "a model with Mamba / linear-attention state layers run as a hybrid "
            "(--kv-layout hybrid)"),
    Applies("mamba_ssm_cache_dtype", _STATES, _state_layers,
            "a model with Mamba / linear-attention state layers run as a hybrid "
            "(--kv-layout hybrid)"),
    Applies("shared_tier_gbps", ("shared_tier_size",), lambda o: bool(o.tier.shared_tier_size),
            "a shared tier (--shared-tier-size)"),
    Applies("shared_tier_latency_us", ("shared_tier_size",),
            lambda o: bool(o.tier.shared_tier_size), "a shared tier (--shared-tier-size)"),
    Applies("seed", ("workload", "trace", "arrival", "ladder_type", "lengths", "replicas"),
            _seed_read,
            "something drawn at random: a random arrival process (poisson, gamma, diurnal, a "
            "poisson ladder), a length model that draws (--lengths other than fixed), a "
            "workload that draws or shuffles (chat, the grouped prompts, a trace) or a fleet"),
    Applies("slo_percentile", ("slo_ttft", "slo_tpot"),
            lambda o: o.output.slo_ttft is not None or o.output.slo_tpot is not None,
            "an SLO target (--slo-ttft or --slo-tpot)"),
)


def check_options_apply(opts: RunOptions, lists: Mapping[str, Any] | None = None) -> None:
    """ValueError (one line) for the first option given away from its default that applies
    neither to `opts` nor to any cell of the grid `lists` (axis name -> list of values,
    parsed; None or absent: not varied)."""
    lists = {k: v for k, v in (lists or {}).items() if v}
    for rule in RULES:
        o = OPTIONS[rule.option]
        if opts.get(rule.option) == o.default:
            continue
        axes = [a for a in rule.on if a in lists]
        combos = itertools.product(*(lists[a] for a in axes)) if axes else [()]
        if any(rule.when(_with(opts, dict(zip(axes, c, strict=True)))) for c in combos):
            continue
        raise ValueError(f"{flag(rule.option)} {opts.get(rule.option)} is read only with "
                         f"{rule.needs}; drop it (it would be a silent no-op)")


def _with(opts: RunOptions, values: dict[str, Any]) -> RunOptions:
    """`opts` with grid values set, unvalidated (a rule reads a field or two; the cell is
    validated when the command builds it)."""
    if not values:
        return opts
    changed: dict[str, dict[str, Any]] = {}
    for name, v in values.items():
        changed.setdefault(OPTIONS[name].spec, {})[OPTIONS[name].field.name] = v
    return _unchecked(opts, {s: _unchecked(getattr(opts, s), kv) for s, kv in changed.items()})


def _unchecked(spec: Any, values: dict[str, Any]) -> Any:
    new = object.__new__(type(spec))
    new.__dict__.update({**spec.__dict__, **values})
    return new


__all__ = ["RULES", "Applies", "check_options_apply"]
