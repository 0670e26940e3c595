"""Experiment files: `--config exp.toml` (or a saved config.json) under the command line.

The keys are the option names (`page_size = 16` or `page-size = 16`, old spellings accepted);
a list value for a sweep axis (`page_size = [1, 16]`) is a grid axis. Precedence: defaults <
file < command line (`--engine` at the level it is given: experiments/options/engines.py). A saved
config.json holds the options under `options` and is re-run as it is (its `out` is left
out, so a re-run does not write over the original).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from experiments.options.engines import apply_engine
from experiments.options.grid import SWEEP_AXES
from experiments.options.run_options import RunOptions, normalize

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI (a dependency there)
    import tomli as tomllib


def load_toml(path: str | Path) -> dict[str, Any]:
    """An experiment file's keys (same names as the options)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ValueError(f"--config {str(p)!r}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"--config {str(p)!r}: not valid TOML ({e})") from None


def load_config(path: str | Path) -> dict[str, Any]:
    """The keys of a TOML experiment file or of a saved config.json (its `options`)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--config {str(p)!r}: no such file")
    if p.suffix != ".json":
        return load_toml(p)
    try:
        doc = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"--config {str(p)!r}: not valid JSON ({e})") from None
    if isinstance(doc, dict) and "options" in doc:
        doc = doc["options"]
    if not isinstance(doc, dict):
        raise ValueError(f"--config {str(p)!r}: expected a JSON object of options")
    return {k: v for k, v in doc.items() if k != "out"}


def options_from(config: str | Path | None, given: Mapping[str, Any],
                 own: Iterable[str] = ()) -> tuple[RunOptions, dict[str, Any]]:
    """Defaults < config file < command line (`given`: option name -> value). Returns the
    options and the file's values that are not options: keys in `own` (the command's own
    parameters) and list-valued sweep axes."""
    own = set(own)
    extras: dict[str, Any] = {}
    from_file: dict[str, Any] = {}
    if config is not None:
        for key, value in load_config(config).items():
            name = key.replace("-", "_")
            if name in own or (name in SWEEP_AXES and isinstance(value, list)):
                extras[name] = value
            else:
                from_file[key] = value
    # an --engine's defaults at the level it was given: the options given there or above win
    merged = apply_engine([normalize(from_file, where=f"key in {config}"), normalize(given)],
                          typed=True)
    return RunOptions.from_mapping(merged), extras


__all__ = ["load_config", "load_toml", "options_from"]
