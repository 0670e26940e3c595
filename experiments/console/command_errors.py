"""How the kvsim command line fails: one line on stderr and an exit status.

User mistakes (ValueError / WorkloadError from any package, OSError on a path the user gave,
bad flags) exit with status 2 and one line; a bug the simulator caught in itself (a broken
invariant, a livelock) exits with status 3 and one line saying so; `kvsim --debug ...`
(`STATE["debug"]`) re-raises instead, to show the traceback.
"""

from __future__ import annotations

import sys
import typing

import typer
from typer.core import TyperGroup

from kvcore.contract.validation import InvariantError
from simulator.guard import LivelockError

STATE = {"debug": False}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, code: int = 2) -> typing.NoReturn:
    typer.echo(f"kvsim: error: {_one_line(message)}", err=True)
    sys.exit(code)


class KvsimGroup(TyperGroup):
    """The root command: user mistakes become exit status 2 and one line on stderr.

    Parsing errors (unknown option, bad value) and ValueError from any package (kvcore,
    simulator, workloads' WorkloadError) are caught here, around the whole app, so a test
    runner sees the same behaviour as the shell; `kvsim --debug` re-raises instead.
    """

    def main(self, args=None, prog_name=None, complete_var=None,  # type: ignore[override]
             standalone_mode=True, **extra):
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except (ValueError, OSError) as e:  # OSError: a path the user gave, or a full disk
            if STATE["debug"]:
                raise
            _fail(str(e))
        except (InvariantError, LivelockError) as e:  # a bug in kvsim, not the user's input
            if STATE["debug"]:
                raise
            _fail(f"internal error ({type(e).__name__}; a kvsim bug, please report it with the "
                  f"command; --debug shows the traceback): {e}", 3)
        except Exception as e:
            if hasattr(e, "exit_code") and hasattr(e, "format_message"):  # a parse error
                ctx = getattr(e, "ctx", None)
                hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
                _fail(e.format_message() + hint, int(e.exit_code))
            raise
        if isinstance(rv, int) and not isinstance(rv, bool):
            sys.exit(rv)  # an explicit exit status (--help, --version, typer.Exit)
        return rv


__all__ = ["STATE", "KvsimGroup"]
