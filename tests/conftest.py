"""Shared pytest setup: one torch thread, so CPU tests behave the same on small CI machines;
tests marked `slow` (minutes each) run only with `--run-slow`; the full validation run,
computed once per session for the validation and CLI tests; the model preset table restored
after every test; Hypothesis derandomized under CI, and its seed printed on failure elsewhere.
"""

import os
import random

import pytest
import torch
from hypothesis import settings

torch.set_num_threads(1)

# Hypothesis in CI: the same examples on every run (seeded from each test's own source), so a
# red build is a real regression and not a draw; no example database (CI starts empty anyway);
# a failure prints the `@reproduce_failure` blob that replays it. Elsewhere: random examples
# (more of the input space over many runs), one seed per session, printed in the header and
# beside every failing test, so a failure seen once can be rerun with `--hypothesis-seed=N`.
# (With a forced seed Hypothesis replays no failures saved in .hypothesis/: the printed seed
# and the `@reproduce_failure` blob are the record.)
# Loaded here, at import, before any test module builds its own `settings(...)`: those inherit
# the unset fields (derandomize, print_blob) from the profile loaded at their creation.
settings.register_profile("ci", derandomize=True, print_blob=True, database=None)
settings.register_profile("dev", print_blob=True)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
settings.load_profile("ci" if IN_CI else "dev")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run tests marked slow (minutes each)")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Outside CI, fix one random Hypothesis seed for the session unless one was given: run
    before Hypothesis' own plugin, which applies `--hypothesis-seed`."""
    if not IN_CI and config.getoption("hypothesis_seed", None) is None:
        config.option.hypothesis_seed = str(random.SystemRandom().randrange(2**32))


def _hypothesis_seed(config: pytest.Config) -> str | None:
    return None if IN_CI else config.getoption("hypothesis_seed", None)


def pytest_report_header(config: pytest.Config) -> str:
    seed = _hypothesis_seed(config)
    return ("hypothesis: profile 'ci' (derandomized)" if seed is None else
            f"hypothesis: seed {seed} (rerun with --hypothesis-seed={seed})")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    seed = _hypothesis_seed(item.config)
    if report.failed and seed is not None and item.get_closest_marker("hypothesis"):
        report.sections.append(("hypothesis seed",
                                f"rerun with: pytest '{item.nodeid}' --hypothesis-seed={seed}"))


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
    from kvcore.model.presets import MODELS

    saved = dict(MODELS)
    yield
    MODELS.clear()
    MODELS.update(saved)
