"""Shared helpers for the CLI tests: tiny simulations (few requests, small pools, constant
latency) so the whole directory stays fast on two cores."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli import app

TINY = ["--num-requests", "12", "--kv-tokens", "4096", "--latency", "constant",
        "--max-context-len", "2048", "--input-len", "64", "--output-len", "16",
        "--lengths", "uniform"]


@pytest.fixture
def invoke():
    runner = CliRunner()

    def _invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    return _invoke
