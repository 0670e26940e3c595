"""kvsim command line (typer). Every command is a thin shell over the packages."""

from __future__ import annotations

import typer

import kvcore

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="KV-cache simulator and planner."
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvsim {kvcore.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True),
) -> None:
    """kvsim: which page size, which allocator policy, how much memory, for your traffic."""


@app.command()
def info() -> None:
    """Versions and devices."""
    import torch

    typer.echo(f"kvsim {kvcore.__version__}  torch {torch.__version__}  "
               f"cuda {'yes' if torch.cuda.is_available() else 'no'}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
