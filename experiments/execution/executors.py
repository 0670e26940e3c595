"""Where the cells of a sweep run: local processes or a Dask cluster.

An executor is given the cell function when it is made (`fn`: a plain dict of option values
-> a summary row; the sweep passes experiments.answers.runner.run_cell) and has one method,
`run_cells(cells, jobs, on_result)`: each cell is shipped to `fn` wherever the executor runs
it, and `on_result(row)` is called in this process as each cell finishes (any order). The
sweep itself (what is pending, writing summary.csv, de-duplicating rows) stays in
experiments.answers.runner.run_sweep, so the executors only differ in where the work happens; and
since they receive the function instead of importing it, nothing here imports the runner.

Dask is an optional dependency: it is imported when a `DaskExecutor` is made, and a missing
install is a user error (one line saying how to install it).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol

import kvcore

EXECUTORS = ("local", "dask")
MAX_JOBS = 1024
DASK_MISSING = ("--executor dask needs Dask, which is not installed: pip install "
                "'kvsim[dask]' (in a checkout: pip install -e \".[dask]\")")

Cell = Mapping[str, Any]
Row = dict[str, Any]
CellFn = Callable[[Cell], Row]


AUTO = 0  # no --jobs (the default): as many processes as help (`auto_jobs`)
# below this many simulated requests in all cells together a sweep runs in this process: such
# a sweep takes a few seconds of CPU, about what starting a worker costs (a fork server
# importing torch, SimPy and pandas), so workers would not pay for themselves
# (docs/performance.md, "Sweeps")
AUTO_MIN_REQUESTS = 10_000


def check_jobs(jobs: int | None) -> int:
    """--jobs: how many processes run cells; without it (None) AUTO (`auto_jobs`)."""
    if jobs is None:
        return AUTO
    if not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"--jobs must be in [1, {MAX_JOBS}], got {jobs}")
    return jobs


def cores() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's count)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS, Windows)
        return os.cpu_count() or 1


def auto_jobs(cells: int, requests: int | None, available: int | None = None) -> int:
    """No --jobs: one process per core present, at most one per cell; one process when the
    sweep is small (`requests`, the simulated requests of all cells together, below
    AUTO_MIN_REQUESTS; None: unknown, taken as large)."""
    n = cores() if available is None else available
    if cells <= 1 or (requests is not None and requests < AUTO_MIN_REQUESTS):
        return 1
    return max(1, min(n, cells, MAX_JOBS))


class Executor(Protocol):
    def run_cells(self, cells: Sequence[Cell], jobs: int,
                  on_result: Callable[[Row], None]) -> None: ...

    def warm_up(self, jobs: int) -> None:
        """Start what the workers need now, so it overlaps with the caller's set-up."""


class LocalExecutor:
    """`jobs` processes on this machine: this one (already warm: its imports are done) plus
    `jobs - 1` workers from a fork server. This process starts on the first cell at once
    while the workers start up, so worker start-up is off the critical path; cells are handed
    out one at a time, whoever is free next takes the next one.

    `preload`: modules the fork server imports once, before it forks workers (the cell
    function's module is always among them)."""

    def __init__(self, fn: CellFn, preload: Sequence[str] = ()) -> None:
        self.fn = fn
        self.preload = list(dict.fromkeys([fn.__module__, *preload]))

    def warm_up(self, jobs: int) -> None:
        """With jobs > 1, start the fork server (it imports torch, SimPy, pandas and kvsim,
        about 2 s on a small machine) while this process is still setting up."""
        ctx = _process_context(self.preload)
        if jobs > 1 and ctx.get_start_method() == "forkserver":
            from multiprocessing import forkserver

            forkserver.ensure_running()

    def run_cells(self, cells: Sequence[Cell], jobs: int,
                  on_result: Callable[[Row], None]) -> None:
        if jobs <= 1 or len(cells) <= 1:
            for c in cells:
                on_result(self.fn(c))
            return
        todo = deque(cells)
        lock = threading.Lock()
        finished: queue.SimpleQueue[Future] = queue.SimpleQueue()

        def take() -> Cell | None:
            with lock:
                return todo.popleft() if todo else None

        def feed(pool: ProcessPoolExecutor) -> None:
            """Keep one cell in flight per worker; hand finished futures to this thread."""
            running = set()
            for _ in range(jobs - 1):
                c = take()
                if c is not None:
                    running.add(pool.submit(self.fn, c))
            while running:
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    finished.put(fut)
                    c = take() if fut.exception() is None else None
                    if c is not None:
                        running.add(pool.submit(self.fn, c))

        def drain() -> None:
            while not finished.empty():
                on_result(finished.get().result())  # a worker's error is raised here

        with ProcessPoolExecutor(max_workers=jobs - 1,
                                 mp_context=_process_context(self.preload)) as pool:
            feeder = threading.Thread(target=feed, args=(pool,), name="kvsim-feeder",
                                      daemon=True)
            feeder.start()
            try:
                while (c := take()) is not None:
                    on_result(self.fn(c))
                    drain()
                while feeder.is_alive() or not finished.empty():
                    try:
                        on_result(finished.get(timeout=0.05).result())
                    except queue.Empty:
                        continue
            except BaseException:
                with lock:
                    todo.clear()  # the feeder hands out nothing more; in-flight cells end
                raise
            feeder.join()


def _process_context(preload: list[str]):
    """Worker processes that start warm: where available a fork server that has already
    imported `preload` (torch, SimPy, pandas and kvsim) hands out forks, so no worker pays for
    those imports again; elsewhere plain spawn. Never a bare fork of this
    process, whose threads and torch state a fork would copy."""
    import multiprocessing

    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(preload)
        return ctx
    return multiprocessing.get_context("spawn")


def _worker_version() -> str:
    return kvcore.__version__


class DaskExecutor:
    """Cells as Dask tasks on the scheduler at `address`, or, with no address, on a
    `LocalCluster` of `jobs` single-threaded worker processes started for this sweep and
    closed after it.

    A worker lost mid-sweep is handled by the scheduler: the tasks it held are run again on
    another worker (up to `distributed.scheduler.allowed-failures` times); `retries` also
    re-runs a cell whose function raised. `timeout` (seconds, None: none) bounds the whole
    sweep, so a test can never hang.
    """

    def __init__(self, address: str | None = None, *, fn: CellFn, retries: int = 2,
                 timeout: float | None = None, connect_timeout: float = 10.0) -> None:
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise ValueError(DASK_MISSING) from None
        self.address = address
        self.fn = fn
        self.retries = retries
        self.timeout = timeout
        self.connect_timeout = connect_timeout

    def warm_up(self, jobs: int) -> None:
        """Nothing to start early: the cluster is connected or started in run_cells."""

    def _connect(self, jobs: int):
        """(client, cluster or None). Connection failures are user errors (exit 2)."""
        from distributed import Client, LocalCluster

        if self.address is None:
            cluster = LocalCluster(n_workers=max(1, jobs), threads_per_worker=1,
                                   processes=True, dashboard_address=None, memory_limit=0,
                                   silence_logs=logging.ERROR)
            return Client(cluster), cluster
        try:
            client = Client(self.address, timeout=self.connect_timeout)
        except (OSError, TimeoutError, ValueError) as e:
            raise ValueError(f"--scheduler-address {self.address!r}: cannot connect to a Dask "
                             f"scheduler there ({e})") from None
        try:
            versions = client.run(_worker_version)
        except Exception as e:
            client.close()
            raise ValueError(f"the Dask workers at {self.address} cannot run kvsim ({e}); "
                             "install kvsim on every worker") from None
        wrong = {w: v for w, v in versions.items() if v != kvcore.__version__}
        if wrong:
            client.close()
            w, v = next(iter(wrong.items()))
            raise ValueError(f"Dask worker {w} runs kvsim {v}, this is kvsim "
                             f"{kvcore.__version__} ({len(wrong)} worker(s) differ); install "
                             "the same version everywhere")
        return client, None

    def run_cells(self, cells: Sequence[Cell], jobs: int,
                  on_result: Callable[[Row], None]) -> None:
        if not cells:
            return
        from distributed import KilledWorker, as_completed

        client, cluster = self._connect(jobs)
        futures: list[Any] = []
        try:
            futures = [client.submit(self.fn, dict(c), retries=self.retries, pure=False)
                       for c in cells]
            for fut in as_completed(futures, timeout=self.timeout):
                try:
                    row = fut.result()
                except KilledWorker as e:
                    raise RuntimeError(f"a sweep cell took down every Dask worker that ran it "
                                       f"(out of memory?): {e}") from e
                on_result(row)
        except BaseException:
            client.cancel(futures)  # the other cells stop too (this client's share of them)
            raise
        finally:
            client.close()
            if cluster is not None:
                cluster.close(timeout=30)


def make_executor(name: str, fn: CellFn, scheduler_address: str | None = None,
                  preload: Sequence[str] = ()) -> Executor:
    """The executor for `--executor NAME [--scheduler-address ADDR]`, running `fn`."""
    if name not in EXECUTORS:
        raise ValueError(f"--executor {name!r} is not one of: {', '.join(EXECUTORS)}")
    if name == "dask":
        return DaskExecutor(scheduler_address, fn=fn)
    if scheduler_address is not None:
        raise ValueError("--scheduler-address needs --executor dask")
    return LocalExecutor(fn, preload)
