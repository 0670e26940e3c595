"""How options are spelled on the command line besides their name.

An option's name is its field's (kvcore/contract/fields.py `spec_field`): `page_size` is
`--page-size`, the experiment-file key `page_size` or `page-size`, the summary column
`page_size`. This module holds the other spellings, which are the command line's business and
so live above kvcore:

* `SPELLINGS`: extra flags an option answers to, accepted on the command line and (without the
  dashes) as experiment-file keys: the engines' own names, so a command copied from a vLLM or
  SGLang launch line works, and the old names of renamed options, so old experiment files and
  saved config.json files run unchanged.
* `IMPLIES`: an engine's own name that carries that engine's meaning sets other options too
  (vLLM's `--gpu-memory-utilization` is the fraction of vLLM's budget rule, so it also sets
  `--budget vllm`).
* `list_flag`: the flag a grid of runs takes a comma list of values under (an option declared
  `axis=True`): the plural of the option's name.

Adding an option needs nothing here (its field is the one place); adding a spelling is one
line of `SPELLINGS` (and of `IMPLIES` when it carries a meaning).
"""

from __future__ import annotations

from typing import Any

# option name -> its other flags. Engine names: vLLM v0.19.1 EngineArgs
# (vllm/engine/arg_utils.py: --block-size, --max-num-seqs, --gpu-memory-utilization,
# --num-gpu-blocks-override) and SGLang v0.5 ServerArgs (python/sglang/srt/server_args.py:
# --mem-fraction-static; --max-running-requests and --chunked-prefill-size are the options'
# own names).
SPELLINGS: dict[str, tuple[str, ...]] = {
    # workload (old names, before times were spelled with their unit)
    "duration_s": ("--duration",),
    "think_time_s": ("--think-time",),
    "level_interval_s": ("--level-interval",),
    # policy
    "page_size": ("--block-size",),
    # memory
    "num_pages": ("--num-gpu-blocks-override",),
    "mem_fraction": ("--gpu-memory-utilization", "--mem-fraction-static"),
    # hybrid models: one version flag for the engine whose rules apply; SGLang's name of the
    # recurrent-state dtype (python/sglang/srt/server_args.py --mamba-ssm-dtype)
    "vllm_version": ("--engine-version",),
    "mamba_ssm_cache_dtype": ("--mamba-ssm-dtype",),
    # engine
    "max_running_requests": ("--max-num-seqs",),
    "warmup_s": ("--warmup",),
    "timeline_interval_s": ("--timeline-interval",),
    # output: an SLO target at a percentile (experiments/answers/slo.py)
    "slo_ttft": ("--slo-ttft-p99", "--slo-ttft-p90", "--slo-ttft-p50"),
    "slo_tpot": ("--slo-tpot-p99", "--slo-tpot-p90", "--slo-tpot-p50"),
}

# a spelling of SPELLINGS -> the other options it sets (option name -> value)
IMPLIES: dict[str, dict[str, Any]] = {
    "--gpu-memory-utilization": {"budget": "vllm"},
    "--mem-fraction-static": {"budget": "sglang"},
    **{f"--slo-{m}-p{p}": {"slo_percentile": float(p)}
       for m in ("ttft", "tpot") for p in (99, 90, 50)},
}


def key(spelling: str) -> str:
    """A flag as a parameter / file key: --block-size -> block_size."""
    return spelling.lstrip("-").replace("-", "_")


def list_flag(name: str) -> str:
    """The flag of an axis's comma list: its name's plural (page_size -> --page-sizes, policy
    -> --policies; kv_tokens is plural already, so `--kv-tokens` is the list in every
    command)."""
    if name.endswith("s"):
        plural = name
    elif name.endswith("y"):
        plural = name[:-1] + "ies"
    else:
        plural = name + "s"
    return "--" + plural.replace("_", "-")


def check_spellings(options: set[str]) -> None:
    """Every spelling belongs to an option and is given once; every implying spelling is one
    of SPELLINGS and sets options that exist (ValueError naming the spelling)."""
    seen: set[str] = set()
    for name, flags in SPELLINGS.items():
        if name not in options:
            raise ValueError(f"SPELLINGS names {name!r}, which is no option")
        for f in flags:
            if f in seen or key(f) in options:
                raise ValueError(f"spelling {f} is given twice or is an option's own name")
            seen.add(f)
    for f, values in IMPLIES.items():
        unknown = sorted(set(values) - options)
        if f not in seen or unknown:
            raise ValueError(f"IMPLIES {f}: not a spelling of SPELLINGS, or sets no option "
                             f"({', '.join(unknown)})")


__all__ = ["IMPLIES", "SPELLINGS", "check_spellings", "key", "list_flag"]
