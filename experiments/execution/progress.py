"""One progress bar over the simulated requests of several runs (`compare`, `plan --trace`).

A bar per cell stands still for minutes on a long trace and then jumps; a bar per request
moves as requests finish. The runs' sizes are learned as each starts (a workload is built only
once, by the run itself): until then the others are assumed to be as large as the last.
"""

from __future__ import annotations

from collections.abc import Callable


class RequestBar:
    """tqdm over the requests of `runs` simulations; `start_run(n)` before each returns the
    callback the engine calls as requests finish."""

    def __init__(self, runs: int, *, enabled: bool = True, desc: str = "simulating") -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=None, unit="req", desc=desc, disable=not enabled, leave=False)
        self.runs_left = max(runs, 0)
        self.known = 0
        self.done = 0  # requests finished so far, over every run (counted even when hidden)
        self.total = 0

    def start_run(self, num_requests: int) -> Callable[[int], None]:
        self.runs_left = max(self.runs_left - 1, 0)
        self.known += num_requests
        self.total = self.known + self.runs_left * num_requests
        self.bar.total = self.total
        self.bar.refresh()
        return self._tick

    def _tick(self, n: int = 1) -> None:
        self.done += n
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


__all__ = ["RequestBar"]
