"""Output safety: `kill -9` during `kvsim sweep` and `kvsim run`, run the same command again,
and compare with an uninterrupted run: nothing lost, nothing duplicated, no corrupt file.

Real subprocesses and a real SIGKILL (no cleanup handler can run). A kill that lands inside
an atomic write leaves a hidden temporary behind; that case is made deterministic by planting
such a half-written temporary (backdated, as a dead writer's is) before the rerun.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
SIM = ["--num-requests", "1500", "--kv-tokens", "16384", "--latency", "constant",
       "--max-context-len", "2048", "--input-len", "256", "--output-len", "64",
       "--lengths", "uniform", "--rate", "50"]
PAGE_SIZES = [1, 4, 16, 64, 256]
SWEEP = ["sweep", *SIM, "--page-sizes", ",".join(map(str, PAGE_SIZES)), "--policies", "paged",
         "--jobs", "1", "--no-plot", "--no-progress"]
RUN = ["run", *SIM, "--num-requests", "3000"]
RESULT_FILES = ("summary.csv", "requests.parquet", "timeline.parquet", "config.json")
# the only columns allowed to differ between two runs: wall-clock time, the output directory
NOT_COMPARED = ("sim_wall_s", "out")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")


# `python -m cli ARGS`, after the child touches its readiness file (argv[1]): the test kills
# only a child known to be running, never after a guessed sleep
READY_THEN_CLI = ("import pathlib, runpy, sys; pathlib.Path(sys.argv.pop(1)).touch(); "
                  "runpy.run_module('cli', run_name='__main__', alter_sys=True)")


def start(args: list[str], out: Path, ready: Path | None = None) -> subprocess.Popen:
    head = ["-m", "cli"] if ready is None else ["-c", READY_THEN_CLI, str(ready)]
    return subprocess.Popen([sys.executable, *head, *args, "--out", str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_file(p: subprocess.Popen, path: Path, timeout: float = 90) -> None:
    """Block until the child has written `path` (it is running, past that point)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert p.poll() is None, f"the child exited ({p.returncode}) before writing {path}"
        assert time.monotonic() < deadline, f"no {path} within {timeout} s"
        time.sleep(0.01)


def finish(p: subprocess.Popen, timeout: float = 120) -> str:
    stdout, stderr = p.communicate(timeout=timeout)
    assert p.returncode == 0, stderr
    assert "Traceback" not in stdout + stderr
    return stdout


def summary_rows(out: Path) -> int:
    try:
        return len(pd.read_csv(out / "summary.csv"))
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return 0


def kill9(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL


def plant_stale_temp(out: Path, name: str, content: bytes) -> Path:
    """What a writer killed inside `_atomic` leaves: a half-written hidden temporary."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.deadbeef.tmp"
    tmp.write_bytes(content)
    old = time.time() - 3600
    os.utime(tmp, (old, old))
    return tmp


def assert_clean_results(out: Path, files: tuple[str, ...]) -> None:
    """Every result file parses; no temporary is left where results live."""
    leftovers = sorted(p.name for p in out.rglob("*.tmp"))
    assert leftovers == [], leftovers
    for name in files:
        p = out / name
        if name.endswith(".csv"):
            pd.read_csv(p)
        elif name.endswith(".parquet"):
            pd.read_parquet(p)
        else:
            json.loads(p.read_text())


def same_metrics(a: pd.DataFrame, b: pd.DataFrame, key: list[str]) -> None:
    drop = [c for c in NOT_COMPARED if c in a.columns]
    a = a.drop(columns=drop).sort_values(key).reset_index(drop=True)
    b = b.drop(columns=[c for c in NOT_COMPARED if c in b.columns]).sort_values(key)
    b = b.reset_index(drop=True)[list(a.columns)]
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def same_config(a: Path, b: Path) -> None:
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (a, b))
    for c in (ca, cb):
        c["options"].pop("out"), c["resolved"].pop("out")
    assert ca == cb


def test_kill9_during_sweep_then_resume(tmp_path):
    ref_dir, out = tmp_path / "ref", tmp_path / "killed"
    ref = start(SWEEP, ref_dir)  # the uninterrupted reference, side by side
    victim = start(SWEEP, out)
    deadline = time.monotonic() + 90
    while summary_rows(out) < 1:
        assert victim.poll() is None, "the sweep finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    kill9(victim)
    done_before = summary_rows(out)
    assert 1 <= done_before < len(PAGE_SIZES)  # killed mid-sweep
    assert_clean_results(out, ("summary.csv", "config.json"))
    stale = plant_stale_temp(out, "summary.csv", b"config_hash,policy\nabc,pag")

    stdout = finish(start(SWEEP, out))
    print(f"sweep killed after {done_before}/{len(PAGE_SIZES)} cells; rerun: {stdout.strip()}")
    assert f"{len(PAGE_SIZES) - done_before} to run, {done_before} already" in stdout
    finish(ref)
    assert not stale.exists()
    assert_clean_results(out, ("summary.csv", "config.json"))
    got, want = pd.read_csv(out / "summary.csv"), pd.read_csv(ref_dir / "summary.csv")
    assert len(got) == len(PAGE_SIZES) and got.config_hash.is_unique  # nothing lost/duplicated
    assert set(got.page_size) == set(PAGE_SIZES)
    assert set(got.config_hash) == set(want.config_hash)
    same_metrics(got, want, ["config_hash"])
    same_config(out, ref_dir)
    # a third run finds nothing to do and changes nothing
    stdout = finish(start(SWEEP, out))
    assert f"0 to run, {len(PAGE_SIZES)} already" in stdout
    assert pd.read_csv(out / "summary.csv").equals(got)


def wait_for_progress(p: subprocess.Popen, timeout: float = 90) -> None:
    """Block until the run's progress bar (stderr) shows requests done: it is simulating."""
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = os.read(p.stderr.fileno(), 4096).decode(errors="replace")
        assert chunk, "the run finished before it could be killed"
        seen += chunk
        if re.search(r"\b[1-9]\d*/\d+ \[", seen):
            return
    raise AssertionError("no progress within the timeout")


@pytest.mark.parametrize("when", ["starting", "simulating"])
def test_kill9_during_run_then_rerun(tmp_path, when):
    """Killed while starting up / while simulating: no partial results; the rerun writes the
    same results as an uninterrupted run, even over a dead writer's temporaries."""
    ref_dir, out = tmp_path / "ref", tmp_path / "killed"
    ref = start(RUN, ref_dir)
    ready = tmp_path / "child-started"
    victim = start([*RUN, "--progress"], out, ready)
    if when == "starting":  # the interpreter is up and is importing the CLI / building the run
        wait_for_file(victim, ready)
    else:
        wait_for_progress(victim)
    assert victim.poll() is None, "the run finished before it could be killed"
    kill9(victim)
    present = [n for n in RESULT_FILES if (out / n).exists()]
    print(f"run killed while {when}; result files present: {present or 'none'}")
    assert present in ([], list(RESULT_FILES))  # nothing, or a complete earlier write
    if out.exists():
        assert_clean_results(out, tuple(present))
    stale = [plant_stale_temp(out, n, b"PAR1\x00\x01half") for n in RESULT_FILES]

    finish(start(RUN, out))
    finish(ref)
    assert not any(s.exists() for s in stale)
    assert_clean_results(out, RESULT_FILES)
    same_metrics(pd.read_csv(out / "summary.csv"), pd.read_csv(ref_dir / "summary.csv"),
                 ["config_hash"])
    for name, key in (("requests.parquet", ["request_id"]), ("timeline.parquet", None)):
        got, want = pd.read_parquet(out / name), pd.read_parquet(ref_dir / name)
        assert len(got) == len(want) > 0
        same_metrics(got, want, key or list(got.columns[:1]))
    same_config(out, ref_dir)
