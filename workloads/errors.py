"""The one error type for bad workload input.

The CLI turns a `WorkloadError` into exit code 2 and prints its message, so the message is a
single line that points at the offending place (`file:line: what is wrong`) - a user fixing a
trace should never have to read a traceback.
"""

from __future__ import annotations


class WorkloadError(ValueError):
    """A user mistake in a trace file or a workload option.

    `source` and `line` (1-based) are kept as attributes so callers that skip bad rows can count
    them and tests can check where an error points.
    """

    def __init__(self, message: str, source: str | None = None, line: int | None = None):
        self.source = source
        self.line = line
        self.reason = " ".join(str(message).split())  # one line, whatever the input held
        if source is not None and line is not None:
            text = f"{source}:{line}: {self.reason}"
        elif source is not None:
            text = f"{source}: {self.reason}"
        else:
            text = self.reason
        super().__init__(text)
