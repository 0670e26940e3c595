"""Sweeps on Dask: the same rows as the local executor, and a worker killed mid-sweep loses
and duplicates nothing. Clusters are local (2 single-threaded worker processes), cells tiny,
and every wait is bounded, so the file stays well under a minute on two cores."""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.answers.runner import run_cell, run_sweep
from experiments.execution.executors import DASK_MISSING, DaskExecutor, LocalExecutor
from experiments.options.grid import cells
from experiments.options.run_options import RunOptions
from tests.cli.conftest import TINY

distributed = pytest.importorskip("distributed")

SWEEP_TIMEOUT_S = 45  # a hung cluster fails the test instead of hanging it
GRID = ["--page-sizes", "1,16,64", "--policies", "paged,vllm", "--no-progress", "--no-plot"]
BASE = {"num_requests": 8, "kv_tokens": 4096, "latency": "constant", "max_context_len": 2048,
        "input_len": 64, "output_len": 16, "lengths": "uniform"}


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows comparable across executors: every column but the wall time, in hash order."""
    return df.drop(columns=["sim_wall_s"]).sort_values("config_hash").reset_index(drop=True)


@pytest.fixture(scope="module")
def cluster():
    c = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                 dashboard_address=None, memory_limit=0,
                                 silence_logs=logging.CRITICAL)
    yield c
    c.close(timeout=20)


def _kill_first_attempt(cell: dict, *, victim: int, marker: str, log: str) -> dict:
    """The first attempt of the `victim` page size kills its own worker process (SIGKILL:
    no clean-up, as in an out-of-memory kill); the marker file makes the retry run."""
    with open(log, "a") as fh:
        fh.write(f"{cell['page_size']}\n")
    if cell["page_size"] == victim and not os.path.exists(marker):
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return run_cell(cell)


def test_dask_rows_match_local(invoke, tmp_path):
    """`--executor dask` without an address: a local cluster of --jobs processes."""
    out = tmp_path / "sw"  # one directory: the rows hold --out too
    r = invoke("sweep", *TINY, *GRID, "--out", out)
    assert r.exit_code == 0, r.output
    (out / "summary.csv").rename(out / "local.csv")
    r = invoke("sweep", *TINY, *GRID, "--out", out, "--executor", "dask", "--jobs", "2")
    assert r.exit_code == 0, r.output
    assert "6 to run, 0 already" in r.stdout
    a, b = pd.read_csv(out / "local.csv"), pd.read_csv(out / "summary.csv")
    assert len(b) == 6 and b.config_hash.is_unique
    pd.testing.assert_frame_equal(_rows(a), _rows(b))


def test_worker_killed_mid_sweep(cluster, tmp_path):
    """One worker dies running a cell: the scheduler re-runs its cells elsewhere; every cell
    has exactly one row, equal to the local result."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import tests
    grid = cells(RunOptions.from_mapping(BASE), {"page_size": [1, 2, 4, 8, 16, 32]})
    marker, log = tmp_path / "killed", tmp_path / "attempts.log"
    fn = functools.partial(_kill_first_attempt, victim=8, marker=str(marker), log=str(log))
    ex = DaskExecutor(cluster.scheduler_address, fn=fn, timeout=SWEEP_TIMEOUT_S)
    out = tmp_path / "sw"
    df = run_sweep(grid, out, jobs=2, progress=False, executor=ex)

    assert marker.exists()  # a worker really died
    attempts = pd.Series(log.read_text().split()).astype(int).value_counts()
    # the victim ran twice; a cell whose result sat in the dead worker's memory, not yet
    # fetched, may run twice as well; none more
    assert attempts[8] == 2 and set(attempts.index) == {1, 2, 4, 8, 16, 32}
    assert attempts.max() <= 2
    assert len(df) == len(grid) and df.config_hash.is_unique
    expected = pd.DataFrame([run_cell(c.to_dict()) for c in grid])
    expected.to_csv(tmp_path / "local.csv", index=False)  # the same CSV round trip
    pd.testing.assert_frame_equal(_rows(df), _rows(pd.read_csv(tmp_path / "local.csv")))


def test_scheduler_address_flag_and_resume(cluster, invoke, tmp_path):
    out = tmp_path / "addr"
    args = ["sweep", *TINY, "--no-progress", "--no-plot", "--out", out, "--executor", "dask",
            "--scheduler-address", cluster.scheduler_address]
    r = invoke(*args, "--page-sizes", "4,32")
    assert r.exit_code == 0, r.output
    assert "2 to run, 0 already" in r.stdout
    r = invoke(*args, "--page-sizes", "4,32,128")
    assert r.exit_code == 0, r.output
    assert "1 to run, 2 already" in r.stdout
    df = pd.read_csv(out / "summary.csv")
    assert sorted(df.page_size) == [4, 32, 128] and df.config_hash.is_unique


def test_duplicate_results_written_once(tmp_path):
    class Twice(LocalExecutor):
        """Reports every cell twice, as a re-run of a lost worker's task could."""

        def __init__(self) -> None:
            super().__init__(run_cell)

        def run_cells(self, cells, jobs, on_result):
            for c in cells:
                row = run_cell(c)
                on_result(row)
                on_result(dict(row))

    grid = cells(RunOptions.from_mapping(BASE), {"page_size": [4, 16]})
    df = run_sweep(grid, tmp_path / "sw", progress=False, executor=Twice())
    assert len(df) == 2 and df.config_hash.is_unique


def test_unreachable_scheduler_is_a_user_error(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ex = DaskExecutor(f"tcp://127.0.0.1:{port}", fn=run_cell, connect_timeout=1)
    grid = cells(RunOptions.from_mapping(BASE), {"page_size": [4]})
    with pytest.raises(ValueError, match="cannot connect"):
        run_sweep(grid, tmp_path / "sw", progress=False, executor=ex)


def test_executor_flag_errors(invoke, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if Dask were not installed
    r = invoke("sweep", *TINY, "--executor", "dask", "--no-progress")
    assert r.exit_code == 2
    assert r.stderr.strip() == f"kvsim: error: {DASK_MISSING}"
    assert "pip install" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = invoke("sweep", "--executor", "ray")
    assert r.exit_code == 2 and "--executor 'ray' is not one of: local, dask" in r.stderr
    r = invoke("sweep", "--scheduler-address", "tcp://127.0.0.1:8786")
    assert r.exit_code == 2 and "needs --executor dask" in r.stderr


def test_local_executor_runs_every_cell_once_and_raises_a_cell_error():
    """Local executor with jobs > 1 (this process plus workers): each cell's row arrives
    once; a failing cell's error reaches the caller."""
    rows: list = []
    LocalExecutor(fn=_square).run_cells([{"x": i} for i in range(7)], 3, rows.append)
    assert sorted(r["y"] for r in rows) == [i * i for i in range(7)]
    with pytest.raises(ValueError, match="bad cell 3"):
        LocalExecutor(fn=_square_but_3).run_cells([{"x": i} for i in range(6)], 2, rows.append)


def _square(cell):
    return {"y": cell["x"] ** 2}


def _square_but_3(cell):
    if cell["x"] == 3:
        raise ValueError("bad cell 3")
    return _square(cell)


def test_fleet_cells_on_dask_match_local(cluster, tmp_path):
    """Sweeps over replica counts and routers run on Dask as any other axis: the same rows
    (replica counts, routers and their figures) as run here."""
    grid = cells(RunOptions.from_mapping(BASE), {"replicas": [1, 2],
                                                "router": ["round-robin", "cache-aware"]})
    ex = DaskExecutor(cluster.scheduler_address, fn=run_cell, timeout=SWEEP_TIMEOUT_S)
    df = run_sweep(grid, tmp_path / "sw", jobs=2, progress=False, executor=ex)
    assert sorted(df.router.dropna()) == ["cache-aware", "round-robin"]
    assert df.config_hash.is_unique and df.replicas.isna().sum() == 1  # one replica: once
    expected = pd.DataFrame([run_cell(c.to_dict()) for c in grid]).drop_duplicates(
        "config_hash")
    expected.to_csv(tmp_path / "local.csv", index=False)
    local = pd.read_csv(tmp_path / "local.csv")

    def same(d: pd.DataFrame) -> pd.DataFrame:  # the router's wall time varies too
        return _rows(d).drop(columns=["router_us_per_request"]).sort_index(axis=1)

    pd.testing.assert_frame_equal(same(df), same(local))
