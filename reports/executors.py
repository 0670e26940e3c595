"""Where the cells of a sweep run: local processes or a Dask cluster.

Every executor has one method, `run_cells(cells, jobs, on_result)`: each cell is a plain dict
of option values, shipped to `run_cell` (reports/results.py) wherever the executor runs it,
and `on_result(row)` is called in this process as each cell finishes (any order). The sweep
itself (what is pending, writing summary.csv, de-duplicating rows) stays in `run_sweep`, so
the executors only differ in where the work happens.

Dask is an optional dependency: it is imported when a `DaskExecutor` is made, and a missing
install is a user error (one line saying how to install it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Protocol

import kvcore

EXECUTORS = ("local", "dask")
DASK_MISSING = ("--executor dask needs Dask, which is not installed: pip install "
                "'kvsim[dask]' (in a checkout: pip install -e \".[dask]\")")

Cell = Mapping[str, Any]
Row = dict[str, Any]
CellFn = Callable[[Cell], Row]


def _run_cell(cell: Cell) -> Row:
    from reports.results import run_cell

    return run_cell(cell)


class Executor(Protocol):
    def run_cells(self, cells: Sequence[Cell], jobs: int,
                  on_result: Callable[[Row], None]) -> None: ...


class LocalExecutor:
    """In this process (one job or one cell), else a pool of `jobs` spawned processes."""

    def __init__(self, fn: CellFn = _run_cell) -> None:
        self.fn = fn

    def run_cells(self, cells: Sequence[Cell], jobs: int,
                  on_result: Callable[[Row], None]) -> None:
        if jobs <= 1 or len(cells) <= 1:
            for c in cells:
                on_result(self.fn(c))
            return
        ctx = _process_context()
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            pending = {pool.submit(self.fn, c) for c in cells}
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    on_result(fut.result())


def _process_context():
    """Worker processes that start warm: where available a fork server that has already
    imported torch, SimPy, pandas and kvsim hands out forks (about 2 s of imports saved per
    worker on a small machine); elsewhere plain spawn. Never a bare fork of this process,
    whose threads and torch state a fork would copy."""
    import multiprocessing

    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["reports.results", "simulator.run", "workloads.registry"])
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

    def __init__(self, address: str | None = None, *, fn: CellFn = _run_cell,
                 retries: int = 2, timeout: float | None = None,
                 connect_timeout: float = 10.0) -> None:
        try:
            import distributed  # noqa: F401
        except ImportError:
            raise ValueError(DASK_MISSING) from None
        self.address = address
        self.fn = fn
        self.retries = retries
        self.timeout = timeout
        self.connect_timeout = connect_timeout

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


def make_executor(name: str, scheduler_address: str | None = None) -> Executor:
    """The executor for `--executor NAME [--scheduler-address ADDR]`."""
    if name not in EXECUTORS:
        raise ValueError(f"--executor {name!r} is not one of: {', '.join(EXECUTORS)}")
    if name == "dask":
        return DaskExecutor(scheduler_address)
    if scheduler_address is not None:
        raise ValueError("--scheduler-address needs --executor dask")
    return LocalExecutor()
