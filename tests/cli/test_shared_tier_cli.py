"""The shared KV tier's mistakes on the command line: exit 2, one line naming the option."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli import app

BASE = ["run", "--num-requests", "3", "--kv-tokens", "2048", "--latency", "constant",
        "--max-context-len", "1024"]


@pytest.mark.parametrize("args,named", [
    (["--hicache-ratio", "1", "--shared-tier-size", "1"], "--replicas 2 or more"),
    (["--replicas", "2", "--shared-tier-size", "1"], "needs a host tier"),
    (["--replicas", "2", "--hicache-ratio", "1", "--storage-size", "1",
      "--shared-tier-size", "1"], "give one of --storage-size"),
    (["--replicas", "2", "--hicache-ratio", "1", "--shared-tier-size", "1",
      "--shared-tier-gbps", "0"], "--shared-tier-gbps"),
    (["--replicas", "2", "--hicache-ratio", "1", "--shared-tier-size", "-1"],
     "--shared-tier-size"),
])
def test_shared_tier_mistakes_exit_2(args: list[str], named: str) -> None:
    r = CliRunner().invoke(app, [*BASE, *args])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0], r.output
