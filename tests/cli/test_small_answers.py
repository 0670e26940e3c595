"""Issue 38 item 12, the smaller answers: what --skip-bad-rows skipped, a one-line error for
an output directory on a read-only file system, `a..b` page-size ranges, the default pool
in the docs computed, and the diff figure's legend clear of the bars.

Cost: a few seconds (tiny simulations, one figure)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

from tests.cli.conftest import TINY

matplotlib.use("Agg")

AZURE = Path(__file__).resolve().parents[2] / "workloads" / "data" / \
    "AzureLLMInferenceTrace_conv.csv"


def test_skip_bad_rows_says_how_many_rows_it_skipped(invoke, tmp_path):
    lines = AZURE.read_text().splitlines()[:41]
    bad = [*lines[:20], "2023-11-16 18:20:00.0000000,abc,12", *lines[20:], "garbage"]
    trace = tmp_path / "bad.csv"
    trace.write_text("\n".join(bad) + "\n")
    r = invoke("run", "--trace", trace, "--skip-bad-rows", "--no-progress",
               "--latency", "constant")
    assert r.exit_code == 0, r.output
    assert f"note: --skip-bad-rows skipped 2 malformed rows of {trace}" in r.output
    r = invoke("sweep", "--trace", trace, "--skip-bad-rows", "--page-sizes", "16,32",
               "--latency", "constant", "--no-progress", "--no-plot", "--out", tmp_path / "s")
    assert r.exit_code == 0, r.output
    assert r.output.count("skipped 2 malformed rows") == 1  # once per trace, not per cell
    assert (pd.read_csv(tmp_path / "s" / "summary.csv")["trace_bad_rows"] == 2).all()
    r = invoke("run", "--trace", AZURE, "--num-requests", "20", "--no-progress",
               "--latency", "constant")
    assert r.exit_code == 0 and "skipped" not in r.output


@pytest.fixture
def read_only(monkeypatch):
    """Make every directory under a root behave as on a read-only file system (EROFS on
    creating a file or a directory there), as a results directory on a read-only mount does
    for every user, root included."""
    roots: list[Path] = []

    def under(path) -> bool:
        p = Path(os.fspath(path)).resolve()
        return any(p == r or r in p.parents for r in roots)

    real_mkstemp, real_mkdir = tempfile.mkstemp, os.mkdir

    def mkstemp(*args, **kw):
        d = kw.get("dir")
        if d is not None and under(d):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(d))
        return real_mkstemp(*args, **kw)

    def mkdir(path, *args, **kw):
        if under(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *args, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(os, "mkdir", mkdir)
    return roots


def test_commands_on_a_read_only_directory_fail_in_one_line(invoke, tmp_path, read_only):
    """`report`, `plot` and `diff` printed a raw "[Errno 30] Read-only file system" from
    wherever the first write failed; now each checks where it writes first and names it."""
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        r = invoke("run", *TINY, "--no-progress", "--out", runs / name)
        assert r.exit_code == 0, r.output
    read_only.append(runs.resolve())
    cases = {"report": ["report", runs / "a"], "plot": ["plot", runs / "a"],
             "diff": ["diff", runs / "a", runs / "b", "--out", runs / "d"]}
    for name, args in cases.items():
        r = invoke(*args)
        assert r.exit_code == 2, (name, r.output)
        out = r.output.strip()
        assert "\n" not in out and "[Errno" not in out, (name, out)
        assert "is not writable (Read-only file system)" in out, (name, out)
    r = invoke("plot", runs / "a", "--out", tmp_path / "figs")  # writable --out: fine
    assert r.exit_code == 0, r.output


def test_a_page_size_range_is_the_powers_of_two_inside_it():
    """`--page-sizes 3..17` ran 3, 6, 12 (doubling from 3) while the docs said powers of two;
    it is 4, 8, 16 now, and a range holding none is an error."""
    from experiments.options.grid import parse_list

    assert parse_list("3..17", int, "--page-sizes") == [4, 8, 16]
    assert parse_list("1..256", int, "--page-sizes") == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert parse_list("16..16,1", int, "--page-sizes") == [16, 1]
    with pytest.raises(ValueError, match=r"5\.\.7 holds no power of two"):
        parse_list("5..7", int, "--page-sizes")


def test_the_docs_state_the_default_pool_as_computed():
    """docs/cli.md said "about 410k slots" for the pool `kvsim run` simulates without options
    (443,664 at the time of writing): the number is now put in by the generator, from the
    planner."""
    from experiments.answers.planning import static_plan
    from experiments.options.run_options import RunOptions

    tokens = static_plan(RunOptions.from_mapping({})).kv_tokens
    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    assert f"mem_fraction_static 0.88: {tokens:,} slots at page 16" in doc
    assert "410k" not in doc
    from experiments.console.cli_reference import default_pool

    assert default_pool() == f"{tokens:,} slots at page 16"


def test_the_diff_figure_legend_covers_no_bar():
    """The bar figure of `kvsim diff` put its legend inside the first panel, where it covered
    the last pair of bars; it is one legend above the panels now."""
    import matplotlib.pyplot as plt

    from reports.diff import Side, _bars

    pols = ["paged", "vllm", "contiguous-pow2"]
    vals = {"normalized_latency_s": [0.020, 0.021, 0.019], "ttft_p99_s": [0.3, 0.31, 0.29],
            "throughput_tok_s": [900, 910, 905], "prefix_hit_rate": [0.4, 0.41, 0.39],
            "token_states_pct": [50, 51, 49], "internal_frag_pct": [1, 1.1, 0.9]}
    pairs = pd.DataFrame({"policy": pols, **{f"{m}_a": v for m, v in vals.items()},
                          **{f"{m}_b": [x * 1.02 for x in v] for m, v in vals.items()}})
    side = Side("base", Path("."), pd.DataFrame(), {}, None)
    fig = _bars(pairs, ["policy"], side, Side("new", Path("."), pd.DataFrame(), {}, None))
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legends = [*(ax.get_legend() for ax in fig.axes if ax.get_legend()), *fig.legends]
    assert len(legends) == 1
    box = legends[0].get_window_extent(r)
    bars = [p.get_window_extent(r) for ax in fig.axes for p in ax.patches]
    assert len(bars) == 36 and not any(b.overlaps(box) for b in bars)
    plt.close(fig)
