"""The console entry point ends its process without the collector's shutdown walk
(experiments.console.console_out.freeze_heap_at_exit), and still exits with the command's status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# An atexit hook registered before main() runs after main's own (atexit is last in, first out):
# by then the heap must be frozen.
PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0, flush=True))
sys.argv = ["kvsim", *sys.argv[1:]]
import cli
cli.main()
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=120)


def test_main_freezes_the_heap_before_exit_and_keeps_the_status():
    ok = _run("--version")  # one process covers both outcomes' hook: exit 0 here, 2 below
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().splitlines()[-1] == "frozen True"
    bad = _run("run", "--page-size", "0")
    assert bad.returncode == 2, bad.stderr
    assert "page" in bad.stderr and bad.stdout.strip().splitlines()[-1] == "frozen True"
