"""docs/cli.md, generated whole: the prose of experiments/console/cli_reference.md with the
commands' usage lines (from the typer app, cli.py) and the option tables (from the specs' fields)
put in.

`kvsim cli-reference > docs/cli.md` regenerates it; tests/cli/test_cli_reference.py compares
the whole file with it. The template marks what is generated: `<<options>>` (every option
under its help panel, experiments/options/run_options.py `option_reference`, then the grid axes) and
`<<usage COMMAND>>` (the command's usage: the options it shares with the others as
`[OPTIONS]`, its arguments, its own flags) and `<<default pool>>` (the KV pool a `kvsim run`
without options simulates, computed by the planner: a number in prose goes stale when a
rule changes). Every command has exactly one row, so a new command without prose, or a row
for a command that is gone, fails the generation.

The commands' examples (`--help` epilogs) live here too: one list per command.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from experiments.options.grid import SWEEP_AXES
from experiments.options.run_options import OPTIONS, RunOptions, option_reference

TEMPLATE = Path(__file__).with_name("cli_reference.md")
_USAGE = re.compile(r"<<usage ([a-z -]+)>>")

COMMAND_EXAMPLES: dict[str, tuple[str, ...]] = {
    "run": ("kvsim run --workload kshot --policy vllm --block-size 16",
            "kvsim run --trace conv.jsonl --model-config ./Llama-3.1-8B --tp 2 --out out/run",
            "kvsim run --workload chat --gpu-memory-utilization 0.9 --max-num-seqs 128"),
    "sweep": ("kvsim sweep --workload chat --page-sizes 1..256 --policies paged,vllm --jobs 2 "
              "--out out/sweep",
              "kvsim sweep --workload sharegpt --rates 1,2,4,8 --slo-ttft 1 --out out/rates",
              "kvsim report out/sweep"),
    "compare": ("kvsim compare --workload kshot --policies paged,vllm,contiguous-pow2",
                "kvsim compare --workload mooncake-conv --num-requests 500 "
                "--mem-fraction-static 0.85 --out out/cmp"),
    "plan": ("kvsim plan --model llama-3.1-70b --gpu h100 --tp 4 --budget vllm",
             "kvsim plan --model-config ./Llama-3.1-8B --gpu-memory-utilization 0.9 --json",
             "kvsim plan --workload chat --num-requests 300 --page-sizes 1..128 --out out/plan"),
    "plot": ("kvsim plot out/sweep --slo-ttft 1",),
    "report": ("kvsim report out/sweep    # out/sweep/report.md and report.html",),
}


def epilog(command: str) -> str:
    """A command's `--help` epilog: its examples as a Markdown code block."""
    return "\n\n".join(["Examples:", *(f"  {line}" for line in COMMAND_EXAMPLES[command])])


def axis_reference() -> str:
    """The grid axes: each option a grid can vary and the flag of its list."""
    lines = ["#### Grid axes", "", "| option | list flag | type |", "|---|---|---|"]
    lines += [f"| `{OPTIONS[name].flag}` | `{flag}` | {OPTIONS[name].type.__name__} |"
              for name, flag in SWEEP_AXES.items()]
    return "\n".join(lines) + "\n"


def default_pool() -> str:
    """The pool `kvsim run` simulates without options, as the planner computes it."""
    from experiments.answers.planning import static_plan

    plan = static_plan(RunOptions.from_mapping({}))
    return f"{plan.kv_tokens:,} slots at page {plan.page_size}"


def render(usages: Mapping[str, str], template: str | None = None) -> str:
    """docs/cli.md: the template with the usages (command path without `kvsim`, e.g. `trace
    stats` -> its usage line) and the option tables put in. ValueError when a command has no
    row, or two, or a row names no command."""
    text = TEMPLATE.read_text(encoding="utf-8") if template is None else template
    named = _USAGE.findall(text)
    missing = sorted(set(usages) - set(named))
    unknown = sorted(set(named) - set(usages))
    twice = sorted({n for n in named if named.count(n) > 1})
    if missing or unknown or twice:
        raise ValueError(f"{TEMPLATE.name}: commands without a row: {missing or 'none'}; rows "
                         f"for no command: {unknown or 'none'}; rows given twice: "
                         f"{twice or 'none'}")
    text = _USAGE.sub(lambda m: f"`{usages[m.group(1)]}`", text)
    if "<<default pool>>" in text:
        text = text.replace("<<default pool>>", default_pool())
    return text.replace("<<options>>\n", option_reference() + "\n" + axis_reference())


__all__ = ["COMMAND_EXAMPLES", "TEMPLATE", "axis_reference", "default_pool", "epilog", "render"]
