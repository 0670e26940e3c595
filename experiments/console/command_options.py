"""A command's parameters generated from the options' metadata (typer).

Every command that runs simulations (`run`, `sweep`, `compare`, `plan`, `capacity`) takes
every option (experiments/options/run_options.py `OPTIONS`: one parameter per field, named and typed
from it, in the help panel of its spec), the other spellings of each
(experiments/options/spellings.py; one that implies other options is its own parameter, so the
command knows which was typed),
`--config`, and for a command that runs a grid the comma list of each axis it varies
(experiments/options/grid.py `SWEEP_AXES`: `--page-sizes`, `--policies`, ...). Nothing here names an
option: adding a field to a spec adds its flag to every command, with the same meaning.

`with_options` merges defaults < `--config` file < command line into the `RunOptions` the
command receives, and refuses an option neither the run nor any cell of its grid reads
(experiments/options/option_rules.py). An option whose list flag is its own flag (`--kv-tokens`)
takes a comma list everywhere: a command that runs one value of it refuses more than one,
naming `kvsim sweep`.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

from experiments.options.config_file import options_from
from experiments.options.grid import AXIS_PARAMS, AXIS_TYPES, SWEEP_AXES, parse_list
from experiments.options.option_rules import check_options_apply
from experiments.options.run_options import IMPLIED, OPTIONS
from experiments.options.spellings import key as spelling_key


def _option_param(name: str) -> inspect.Parameter:
    o = OPTIONS[name]
    help_text = o.help
    allowed = o.allowed()
    if allowed:
        joined = ", ".join(allowed)
        help_text += f" [{joined}]" if len(joined) < 160 else f" [{len(allowed)} values]"
    # a boolean is a --x/--no-x pair; a spelling that implies other options is its own
    # parameter (the command must know which spelling was typed)
    plain = [f for f in o.flags if spelling_key(f) not in IMPLIED]
    decls = [f"{o.flag}/--no-{o.flag[2:]}"] if o.type is bool else [o.flag, *plain]
    annotation: Any = Optional[o.type] if o.default is None else o.type  # noqa: UP045 (typer)
    if _is_own_list(o.name):  # `--kv-tokens`: its own list flag, a comma list everywhere
        annotation, help_text = Optional[str], f"{help_text}; {_LIST_HELP}"  # noqa: UP045
    option = typer.Option(o.default, *decls, help=help_text, rich_help_panel=o.panel,
                          show_default=o.default is not None)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=annotation)


_LIST_HELP = "a comma list runs each value (kvsim sweep)"


def _is_own_list(name: str) -> bool:
    """An axis whose list flag is its own flag (kv_tokens); False for a spelling."""
    o = OPTIONS.get(name)
    return o is not None and o.axis and o.list_flag == o.flag


def _grid_param(name: str, default: str | None) -> inspect.Parameter:
    """The comma list of axis `name` (`--page-sizes`), as a command that runs a grid offers
    it; `default`: the command's own list, else the option's single value."""
    o = OPTIONS[name]
    powers = " (a..b: the powers of two from a to b)" if o.type is int else ""
    help_text = f"{o.flag} values to run, comma list{powers} [default: {default or o.flag}]"
    option = typer.Option(default, o.list_flag, help=help_text, rich_help_panel="Grid",
                          show_default=False)
    return inspect.Parameter(AXIS_PARAMS[name], inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=Optional[str])  # noqa: UP045


def _implied_params(name: str) -> list[inspect.Parameter]:
    """One parameter per engine spelling of option `name` that implies other options
    (`--gpu-memory-utilization`: `--mem-fraction` with `--budget vllm`)."""
    o = OPTIONS[name]
    out = []
    for f in o.flags:
        key = spelling_key(f)
        if key not in IMPLIED:
            continue
        also = " ".join(f"{OPTIONS[k].flag} {v}" for k, v in IMPLIED[key].items())
        option = typer.Option(None, f, help=f"{o.flag} with {also}", rich_help_panel=o.panel)
        out.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=option,
                                     annotation=Optional[o.type]))  # noqa: UP045
    return out


def _config_param() -> inspect.Parameter:
    return inspect.Parameter(
        "config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],  # noqa: UP045
        default=typer.Option(None, "--config", help="experiment file (TOML with the option "
                             "names as keys, or a saved config.json); flags override it",
                             rich_help_panel="Output"))


def _one_value(ctx: typer.Context, name: str, text: str) -> Any:
    """`--kv-tokens 4096` in a command that runs one value of it; a list is refused."""
    o = OPTIONS[name]
    values = parse_list(text, o.type, o.flag) or []
    if len(values) > 1:
        raise ValueError(f"{o.flag} {text!r}: kvsim {ctx.info_name} runs one value; "
                         f"kvsim sweep {o.flag} {text} runs each")
    return values[0]


def with_options(*, grid: dict[str, str | None] | None = None) -> Callable:
    """Give a command every option, `--config`, and the list flag of each axis in `grid` (axis
    -> the command's default list, None: the option's value); the command receives the
    merged `opts: RunOptions` and, with a grid, `lists` (axis -> its list's text or None)."""
    grid = dict(grid or {})

    def deco(fn: Callable) -> Callable:
        hints = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in sig.parameters.values() if p.name not in ("opts", "lists", "ctx")]
        own_names = {p.name for p in own}
        lists = [_grid_param(name, default) for name, default in grid.items()]
        taken = own_names | {p.name for p in lists}
        gen = [p for name in OPTIONS if name not in taken
               for p in (_option_param(name), *_implied_params(name))]
        ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                      annotation=typer.Context)
        params = [ctx_param, *own, *lists, *gen, _config_param()]

        def wrapper(ctx: typer.Context, **kwargs: Any) -> Any:
            config = kwargs.pop("config", None)
            texts = {name: kwargs.pop(AXIS_PARAMS[name]) for name in grid}
            given = {k: (_one_value(ctx, k, v) if _is_own_list(k) else v)
                     for k, v in kwargs.items()
                     if (k in OPTIONS or k in IMPLIED) and from_user(ctx, k)}
            params_of_grid = {AXIS_PARAMS[n]: n for n in grid}
            opts, extras = options_from(config, given, own_names | set(params_of_grid))
            call = {k: v for k, v in kwargs.items() if k in own_names}
            for k, v in extras.items():  # the file's values for the command's own options
                axis = k if k in grid else params_of_grid.get(k)
                target = k if k in own_names else None if axis is None else AXIS_PARAMS[axis]
                if target is None:
                    raise ValueError(f"--config: {k!r} is a list; only kvsim sweep takes "
                                     f"lists (of {', '.join(SWEEP_AXES)})")
                if not from_user(ctx, target):
                    text = ",".join(str(x) for x in v) if isinstance(v, list) else v
                    if axis is None:
                        call[k] = text
                    else:
                        texts[axis] = text
            # an option the run (or every cell of the grid) would not read is refused
            check_options_apply(opts, {a: parse_list(t, AXIS_TYPES[a], SWEEP_AXES[a])
                                       for a, t in texts.items()})
            if grid:
                call["lists"] = texts
            if "ctx" in sig.parameters:
                call["ctx"] = ctx
            return fn(opts=opts, **call)

        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        wrapper.__name__ = fn.__name__
        wrapper.__doc__ = fn.__doc__
        return wrapper

    return deco


def from_user(ctx: typer.Context, name: str) -> bool:
    """True when option `name` was typed on the command line (or came from the environment),
    not left at its default: only such values override the --config file."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")



def command_usages(group: Any, prefix: str = "") -> dict[str, str]:
    """Each visible command's usage line (command path -> `kvsim run [OPTIONS] [--events
    PATH] ...`): `[OPTIONS]` for the options every running command shares, then its
    arguments and its own flags (docs/cli.md's commands table)."""
    out: dict[str, str] = {}
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        if cmd.hidden:
            continue
        if hasattr(cmd, "commands"):  # a group (kvsim trace)
            out.update(command_usages(cmd, f"{path} "))
            continue
        options = [p for p in cmd.params if p.param_type_name == "option"]
        generated = "config" in {p.name for p in options}  # with_options: the shared ones
        shared = {*OPTIONS, *IMPLIED, "config"} if generated else set()
        parts = [f"kvsim {path}", *(["[OPTIONS]"] if generated else [])]
        parts += [p.metavar or p.name.upper() for p in cmd.params
                  if p.param_type_name == "argument"]
        parts += [f"[{_usage_of(p)}]" for p in options
                  if p.name not in shared or p.rich_help_panel == "Grid"]
        out[path] = " ".join(parts)
    return out


def _usage_of(p: Any) -> str:
    """--events PATH, --progress/--no-progress, --page-sizes L (a grid's list)."""
    flag = max(p.opts, key=len)
    if p.is_flag:
        return f"{flag}/{p.secondary_opts[0]}" if p.secondary_opts else flag
    if p.name in AXIS_PARAMS.values():
        return f"{flag} L"
    kind = {int: "N", float: "X", Path: "PATH"}.get(p.type_descriptor.annotation, "TEXT")
    return f"{flag} {kind}"


__all__ = ["command_usages", "from_user", "with_options"]
