"""Sweeps on several processes (experiments.execution.executors, experiments.answers.runner) and the
workload they share (experiments/execution/shared.py): results identical to a serial sweep, one
build per sweep.

Cost: about 4 s (two 3-cell sweeps of 40 requests; the parallel one starts a fork server;
the shared-file test builds and pickles 20,000 generated requests: 0.1 s).
"""

from __future__ import annotations

import pandas as pd
import pytest

import workloads
from experiments.answers.runner import run_sweep, sweep_jobs
from experiments.execution.executors import AUTO_MIN_REQUESTS, auto_jobs, check_jobs
from experiments.execution.shared import SHARED_KEY, SharedWorkloads
from experiments.options.grid import cells
from experiments.options.run_options import RunOptions

BASE = {"workload": "sharegpt", "num_requests": 40, "kv_tokens": 6000, "rate": 20.0,
        "max_context_len": 2048, "latency": "constant"}


def _grid():
    return cells(RunOptions.from_mapping(BASE), {"page_size": [1, 16, 64]})


def test_parallel_sweep_equals_serial_and_builds_the_workload_once(tmp_path, monkeypatch):
    builds = []
    real = workloads.build_workload

    def counting(spec=None):
        builds.append(spec)
        return real(spec)

    monkeypatch.setattr(workloads, "build_workload", counting)
    written = []
    real_write = SharedWorkloads.write_files

    def spy_write(self):
        real_write(self)
        written.extend(self.files.values())

    monkeypatch.setattr(SharedWorkloads, "write_files", spy_write)
    serial = run_sweep(_grid(), tmp_path / "one", jobs=1, progress=False)
    assert len(builds) == 1  # three cells, one workload built in this process
    assert written == []  # no workers: no file
    parallel = run_sweep(_grid(), tmp_path / "two", jobs=2, progress=False)
    assert len(written) == 1  # the workers got the built workload as one file
    assert not any(tmp_path.rglob("*.pkl")) and not any(
        __import__("pathlib").Path(p).exists() for p in written)  # removed after the sweep

    def rows(df):
        return df.drop(columns=["sim_wall_s"]).sort_values("page_size").reset_index(drop=True)

    assert len(serial) == 3
    pd.testing.assert_frame_equal(rows(serial), rows(parallel), check_exact=True)


def test_auto_jobs_rule():
    assert auto_jobs(9, AUTO_MIN_REQUESTS - 1, available=8) == 1  # small: this process
    assert auto_jobs(9, AUTO_MIN_REQUESTS, available=8) == 8  # one per core
    assert auto_jobs(3, 10**6, available=8) == 3  # at most one per cell
    assert auto_jobs(1, 10**6, available=8) == 1
    assert auto_jobs(4, None, available=2) == 2  # unknown size: taken as large
    assert check_jobs(None) == 0 and check_jobs(3) == 3  # no --jobs: auto
    with pytest.raises(ValueError, match="--jobs must be in"):
        check_jobs(0)


def test_sweep_jobs_counts_the_shared_workload():
    grid = _grid()  # 3 x 40 requests: small
    shared = SharedWorkloads()
    try:
        assert sweep_jobs(0, grid, shared) == 1 and shared.files == {}
        assert sweep_jobs(2, grid, shared) == 2 and len(shared.files) == 1
        tagged = shared.tag(grid[0])
        assert tagged[SHARED_KEY] == next(iter(shared.files.values()))
    finally:
        shared.close()
    # a cell whose workload is its own is not built ahead, nor tagged
    own = cells(RunOptions.from_mapping(BASE), {"seed": [0, 1]})
    shared = SharedWorkloads()
    try:
        assert shared.prepare(own) == [None, None] and SHARED_KEY not in shared.tag(own[0])
    finally:
        shared.close()


def test_a_worker_reads_a_day_of_generated_traffic_once_and_small(monkeypatch):
    """A sweep over a day of generated traffic (diurnal, 20,000 requests here) hands its
    workers one file of columns (under 40 bytes a request, not the ~460 of the objects), and
    a worker process loads it once for all its cells, building nothing itself."""
    import os

    from experiments.execution import shared as shared_mod

    day = {**BASE, "arrival": "diurnal", "rate": 10.0, "num_requests": 20000}
    grid = cells(RunOptions.from_mapping(day), {"page_size": [1, 16]})
    shared = SharedWorkloads()
    try:
        shared.prepare(grid)
        shared.write_files()
        (path,) = shared.files.values()
        assert os.path.getsize(path) < 40 * 20000
        spec = grid[0].workload_spec()
        monkeypatch.setattr(shared_mod, "_BY_SPEC", {})  # as a worker: nothing built here
        monkeypatch.setattr(workloads, "build_workload", lambda *a: pytest.fail("built"))
        first = shared_mod.workload_for(spec, path)
        assert shared_mod.workload_for(grid[1].workload_spec(), path) is first
        assert first.num_requests == 20000
    finally:
        shared.close()
