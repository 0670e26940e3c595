"""Shared pytest setup: one torch thread, so CPU tests behave the same on small CI machines;
the quick validation run, computed once per session for the validation and CLI tests."""

import os

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def quick_validation(tmp_path_factory):
    """`run_validation(quick=True)`, run from an empty working directory that must stay empty:
    the run itself writes nothing (the CLI test covers the command around it)."""
    from simulator.validation import run_validation

    cwd = tmp_path_factory.mktemp("validation-cwd")
    before = os.getcwd()
    os.chdir(cwd)
    try:
        df = run_validation(quick=True)
    finally:
        os.chdir(before)
    assert not list(cwd.iterdir()), f"run_validation wrote into the cwd: {list(cwd.iterdir())}"
    return df
