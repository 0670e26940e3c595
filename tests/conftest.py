"""Shared pytest setup: one torch thread, so CPU tests behave the same on small CI machines;
tests marked `slow` (minutes each) run only with `--run-slow`; the full validation run,
computed once per session for the validation and CLI tests; the model preset table restored
after every test."""

import os

import pytest
import torch

torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run tests marked slow (minutes each)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def validation_run(tmp_path_factory):
    """`run_validation()`, the full run behind docs/validation.md (about 70 s of CPU), once
    per session: the rows' verdicts and the committed report are checked against it. Run from
    an empty working directory that must stay empty: the run itself writes nothing (the CLI
    test covers the command around it)."""
    from experiments.validation import run_validation

    cwd = tmp_path_factory.mktemp("validation-cwd")
    before = os.getcwd()
    os.chdir(cwd)
    try:
        df = run_validation()
    finally:
        os.chdir(before)
    assert not list(cwd.iterdir()), f"run_validation wrote into the cwd: {list(cwd.iterdir())}"
    return df


@pytest.fixture(autouse=True)
def _restore_model_presets():
    """`--model-config` registers the loaded model in the global preset table; keep that from
    leaking into other tests."""
    from kvcore.presets import MODELS

    saved = dict(MODELS)
    yield
    MODELS.clear()
    MODELS.update(saved)
