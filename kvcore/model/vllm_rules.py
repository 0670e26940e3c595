"""vLLM's rules for a hybrid model's KV cache report, as data chosen by the vLLM version.

vLLM changed how it sizes and reports a hybrid model's KV cache several times between v0.11
and v0.31. Each rule below is a list of changes, each with the first version it holds from
and the file that states it; `vllm_rules(version)` folds them into the `VllmRules` of one
version. The planner (kvcore.model.hybrid_plan), the simulated `vllm` policy (through
kvcore/vllm/kv_cache_groups.py) and the validation rows read the same `VllmRules`, so a plan,
a run and a reproduced engine log follow one rule set.

Versions are read from the released source distributions of vLLM (one per version named
below; v0.15 has none and is taken as v0.14). Rules after v0.31 are not followed: v0.32
removed the Mamba cache mode "all" and v0.33 aligns blocks to prefill checkpoints, so a
later version is refused with one line rather than planned by rules that no longer hold.
A pre-release (`0.20.1rc1.dev16+g7a1eb8ac2`) counts as the release before it: that build
still printed the v0.20.0 token figure.

The rules (their sources are in `CHANGES`):

* token formula of "GPU KV cache size: N tokens": `num_blocks // len(kv_cache_groups) x
  min(block sizes)` up to v0.20.0, `int(max_concurrency x max_model_len)` from v0.20.1;
* prefix caching on by default for a hybrid model: no up to v0.25 (the model config says
  hybrids do not support it), yes from v0.26;
* what the prefix cache does with Mamba / linear-attention states: v0.11 turns prefix caching
  off on any model with Mamba layers; v0.12 - v0.15 keep it only for Mamba-2 models (a state
  per block); from v0.16 the mamba cache mode: with prefix caching on, "all" for models that
  support Mamba prefix caching (Mamba-2 here) and "align" otherwise (GDN), "align" also when
  speculative decoding is on (from v0.20.1); "none" with prefix caching off;
* state pages one request may hold (`MambaSpec.max_memory_usage_bytes`): 1 (none), 2 (align)
  or cdiv(max_model_len, block) (all), plus one per speculative token in none and align from
  v0.16 and in all from v0.22 (v0.11 counts none);
* block alignment of attention + state models: 16 tokens (the attention kernels') with a
  larger requested block kept, up to v0.19; from v0.20 the alignment is the larger of 16 and
  the block size in effect (`--block-size`, or the backend's preferred 16), so a requested 32
  makes the block a multiple of 32; in mode "all" the block is a multiple of
  lcm(mamba chunk size, alignment);
* grouping of layers into KV cache groups: the smallest kind's layer count; from v0.12 the
  largest when it is under 1.25 x the smallest (vllm #29303), 1.5 x from v0.18;
* recurrent-state dtype of Nemotron-H models: float32 unless the config names another, from
  v0.13 (before: the conv state's dtype, as for every model).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: a version as (major, minor, patch, 0 for a release or -1 for a pre-release of it)
Version = tuple[int, int, int, int]

FIRST_VERSION: Version = (0, 11, 0, 0)
#: the newest minor line whose rules were read; later ones are refused
LAST_MINOR: tuple[int, int] = (0, 31)
#: the version plans and runs follow unless told otherwise: the newest line read
DEFAULT_VLLM_VERSION = "0.31.0"
MAMBA_CACHE_MODES: tuple[str, ...] = ("none", "align", "all")

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(.*)$")


def parse_version(text: str) -> Version:
    """`0.19`, `0.19.0`, `v0.20.1` or `0.20.1rc1.dev16+g7a1eb8ac2` as a Version; ValueError
    (one line, naming the versions followed) for anything else or outside them."""
    m = _VERSION.match(str(text).strip())
    if not m:
        raise ValueError(f"--vllm-version {text!r} is not a version like 0.19.0")
    major, minor, patch = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    rest = m.group(4)
    pre = -1 if re.search(r"(rc|dev|a\d|b\d)", rest) else 0
    if rest and not pre and not rest.startswith("+"):
        raise ValueError(f"--vllm-version {text!r} is not a version like 0.19.0")
    v: Version = (major, minor, patch, pre)
    if v < FIRST_VERSION or (major, minor) > LAST_MINOR:
        raise ValueError(f"--vllm-version {text}: kvsim follows vLLM's hybrid rules of "
                         f"v0.11.0 to v{LAST_MINOR[0]}.{LAST_MINOR[1]}.x (later versions "
                         "changed the Mamba cache modes and block alignment)")
    return v


@dataclass(frozen=True)
class RuleChange:
    """From `since` on, `rule` has `value`; `source` is the vLLM file (and version) saying so."""

    rule: str
    since: Version
    value: Any
    source: str


def _v(text: str) -> Version:
    major, minor, patch = (int(x) for x in text.split("."))
    return (major, minor, patch, 0)


KV = "vllm/v1/kv_cache_interface.py"
UTILS = "vllm/v1/core/kv_cache_utils.py"
MODELS = "vllm/model_executor/models/config.py"
# fmt: off
CHANGES: tuple[RuleChange, ...] = (
    RuleChange("token_formula", _v("0.11.0"), "blocks", f"{UTILS} _report_kv_cache_config (v0.11.0 - v0.20.0): num_blocks // len(kv_cache_groups) * min_block_size"),
    RuleChange("token_formula", _v("0.20.1"), "concurrency", f"{UTILS} _report_kv_cache_config (v0.20.1; get_kv_cache_capacity from v0.24.0): int(max_concurrency * max_model_len)"),
    RuleChange("hybrid_prefix_caching", _v("0.11.0"), False, "vllm/config/model.py is_prefix_caching_supported (v0.12.0 - v0.25.x): attn_type 'hybrid' does not support prefix caching; v0.11.0: MambaModelConfig turns it off"),
    RuleChange("hybrid_prefix_caching", _v("0.26.0"), True, "vllm/config/model.py is_prefix_caching_supported (v0.26.0): 'Generative hybrid models support prefix caching'"),
    RuleChange("state_prefix_caching", _v("0.11.0"), "off", f"{MODELS} MambaModelConfig (v0.11.0): prefix caching disabled for hybrid or mamba-based models"),
    RuleChange("state_prefix_caching", _v("0.12.0"), "mamba2", f"{MODELS} MambaModelConfig (v0.12.0 - v0.14.x): kept for models with SupportsMambaPrefixCaching (mamba_block_size = block_size), else disabled"),
    RuleChange("state_prefix_caching", _v("0.16.0"), "modes", f"{MODELS} MambaModelConfig (v0.16.0): mamba_cache_mode 'all' if supports_mamba_prefix_caching else 'align'"),
    RuleChange("align_with_spec_decode", _v("0.11.0"), False, f"{MODELS} MambaModelConfig (v0.16.0 - v0.20.0)"),
    RuleChange("align_with_spec_decode", _v("0.20.1"), True, f"{MODELS} MambaModelConfig (v0.20.1): 'align' when prefix caching and speculative decoding are enabled"),
    RuleChange("spec_blocks_none_align", _v("0.11.0"), False, f"{KV} MambaSpec.max_memory_usage_bytes (v0.11.0): page_size_bytes"),
    RuleChange("spec_blocks_none_align", _v("0.16.0"), True, f"{KV} MambaSpec.max_memory_usage_bytes (v0.16.0): (2 or 1 + num_speculative_blocks) pages"),
    RuleChange("spec_blocks_all", _v("0.11.0"), False, f"{KV} MambaSpec.max_memory_usage_bytes (v0.12.0 - v0.21.x): cdiv(max_model_len, block_size) pages"),
    RuleChange("spec_blocks_all", _v("0.22.0"), True, f"{KV} MambaSpec.max_memory_usage_bytes (v0.22.0): + num_speculative_blocks in mode 'all'"),
    RuleChange("block_alignment", _v("0.11.0"), "fixed", f"{MODELS} HybridAttentionMambaModelConfig (v0.11.0 - v0.19.x): kernel_block_alignment_size 16; a larger user block is kept"),
    RuleChange("block_alignment", _v("0.20.0"), "block_size", "vllm/platforms/interface.py _align_hybrid_block_size (v0.20.0, vllm #37467): alignment = max(smallest kernel block, cache_config.block_size)"),
    RuleChange("group_ratio", _v("0.11.0"), 1.0, f"{UTILS} _get_kv_cache_groups_uniform_page_size (v0.11.0): group size = the smallest kind's layer count"),
    RuleChange("group_ratio", _v("0.12.0"), 1.25, f"{UTILS} (v0.12.0, vllm #29303): the largest count when under 1.25 x the smallest"),
    RuleChange("group_ratio", _v("0.18.0"), 1.5, f"{UTILS} (v0.18.0): the largest count when under 1.5 x the smallest"),
    RuleChange("nemotron_fp32_ssm", _v("0.11.0"), False, "vllm/model_executor/layers/mamba/mamba_utils.py MambaStateDtypeCalculator (v0.11.0): ssm dtype 'auto' = the conv state's"),
    RuleChange("nemotron_fp32_ssm", _v("0.13.0"), True, f"{MODELS} NemotronHForCausalLMConfig (v0.13.0): mamba_ssm_cache_dtype 'auto' -> the config's mamba_ssm_cache_dtype, else float32"),
)
# fmt: on
RULE_NAMES: tuple[str, ...] = tuple(dict.fromkeys(c.rule for c in CHANGES))


@dataclass(frozen=True)
class VllmRules:
    """The rules of one vLLM version (see the module notes); `sources` names, per rule, the
    file and version its value in this version comes from."""

    version: str
    token_formula: str
    hybrid_prefix_caching: bool
    state_prefix_caching: str
    align_with_spec_decode: bool
    spec_blocks_none_align: bool
    spec_blocks_all: bool
    block_alignment: str
    group_ratio: float
    nemotron_fp32_ssm: bool
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def modes(self) -> tuple[str, ...]:
        """The mamba cache modes `--mamba-cache-mode` takes in this version."""
        if self.state_prefix_caching == "modes":
            return MAMBA_CACHE_MODES
        return ("none",)

    def mamba_cache_mode(self, mamba2: bool, prefix_caching: bool | None = None,
                         speculative_tokens: int = 0, requested: str | None = None) -> str:
        """The mode a model's states run in: `requested` (checked against the version), else
        what vLLM picks with prefix caching on or off (None: the version's default for a
        hybrid); `mamba2` when the state layers are Mamba-2 (vLLM's SupportsMambaPrefixCaching
        models: NemotronH, Mamba2, Bamba, ...), False for gated delta net."""
        if requested is not None:
            if requested not in self.modes:
                raise ValueError(f"--mamba-cache-mode {requested}: vLLM v{self.version} has "
                                 f"{', '.join(self.modes)} (the option exists from v0.16.0)")
            # MambaModelConfig (v0.16+): "all" on a model without Mamba prefix caching
            # support falls back to "align"
            return "align" if requested == "all" and not mamba2 else requested
        on = self.hybrid_prefix_caching if prefix_caching is None else prefix_caching
        if not on or self.state_prefix_caching == "off":
            return "none"
        if self.state_prefix_caching == "mamba2":
            return "all" if mamba2 else "none"
        if mamba2 and not (speculative_tokens and self.align_with_spec_decode):
            return "all"
        return "align"

    def state_pages(self, mode: str, context_len: int, block_size: int,
                    speculative_tokens: int = 0) -> int:
        """Pages one request's state may hold in one KV cache group
        (`MambaSpec.max_memory_usage_bytes` over the page size)."""
        spec = speculative_tokens
        if mode == "all":
            return -(-context_len // block_size) + (spec if self.spec_blocks_all else 0)
        base = 2 if mode == "align" else 1
        return base + (spec if self.spec_blocks_none_align else 0)


def vllm_rules(version: str | None = None) -> VllmRules:
    """The rules of `version` (default DEFAULT_VLLM_VERSION)."""
    text = DEFAULT_VLLM_VERSION if version is None else str(version)
    v = parse_version(text)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for c in CHANGES:
        if c.since <= v:
            values[c.rule] = c.value
            sources[c.rule] = c.source
    return VllmRules(version=text.lstrip("v"), sources=sources, **values)


def check_vllm_version(text: str | None) -> None:
    """ValueError (one line) for a version kvsim does not follow; None is the default."""
    if text is not None:
        parse_version(text)


__all__ = ["CHANGES", "DEFAULT_VLLM_VERSION", "LAST_MINOR", "MAMBA_CACHE_MODES", "RULE_NAMES",
           "RuleChange", "VllmRules", "check_vllm_version", "parse_version", "vllm_rules"]
