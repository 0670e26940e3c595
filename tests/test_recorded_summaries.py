"""Recorded summary rows: a fixed set of sweeps through the CLI (every policy, every admission
mode, the bundled traces, closed-loop and prefix-sharing workloads), compared column by column
with `tests/data/recorded_summaries.csv`.

Why: a refactor must leave results identical. This test pins what `kvsim sweep` writes to
summary.csv today; it is only re-recorded (`python -m tests.test_recorded_summaries`) when a
change is *meant* to move the numbers, and the commit says which and why. Wall time and the
config hash (a digest of the option names, which a refactor may rename) are left out;
`RENAMED` maps an option column renamed since the recording to its new name.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

RECORDED = Path(__file__).parent / "data" / "recorded_summaries.csv"
NOT_RESULTS = {"sim_wall_s", "config_hash", "out"}  # out: the temporary directory
RENAMED: dict[str, str] = {  # recorded column -> current column
    "duration": "duration_s", "think_time": "think_time_s", "level_interval": "level_interval_s",
    "warmup": "warmup_s", "timeline_interval": "timeline_interval_s",
}

ALL_POLICIES = "paged,paged-nocache,vllm,contiguous-max,contiguous-pow2,contiguous-oracle"
COMMON = ["--no-progress", "--no-plot", "--latency", "roofline",
          "--latency-profile", "vllm-paper-2023"]  # the calibration it was recorded with
# name -> sweep arguments (each sweep is one group of rows)
SWEEPS: dict[str, list[str]] = {
    **{f"azure-{adm}": ["--workload", "azure-conv", "--num-requests", "120",
                        "--kv-tokens", "24000", "--max-context-len", "4096",
                        "--page-sizes", "16", "--policies", ALL_POLICIES,
                        "--admission", adm] for adm in ("sglang", "vllm", "reserve")},
    **{f"mooncake-{adm}": ["--workload", "mooncake-conv", "--num-requests", "40",
                           "--kv-tokens", "140000", "--max-context-len", "32768",
                           "--page-sizes", "64", "--policies", ALL_POLICIES,
                           "--admission", adm] for adm in ("sglang", "vllm", "reserve")},
    "chat-lpm-swap": ["--workload", "chat", "--num-requests", "40", "--kv-tokens", "2500",
                      "--page-sizes", "1,16", "--policies", "paged,vllm", "--schedule", "lpm",
                      "--preempt", "swap", "--admission", "vllm", "--max-context-len", "8192"],
    "kshot-pages": ["--workload", "kshot", "--num-requests", "60", "--kv-tokens", "8192",
                    "--page-sizes", "4,64", "--policies", "paged,paged-nocache,vllm",
                    "--max-context-len", "4096"],
    "tot-tight": ["--workload", "tot", "--num-requests", "39", "--kv-tokens", "3000",
                  "--page-sizes", "8", "--policies", "paged,vllm,contiguous-oracle",
                  "--placements", "best-fit,buddy", "--max-context-len", "4096"],
}


def run_sweeps(out: Path) -> pd.DataFrame:
    """Every sweep of SWEEPS through the CLI; their summary rows, tagged by sweep name."""
    from cli import app

    runner = CliRunner()
    frames = []
    for name, args in SWEEPS.items():
        d = out / name
        r = runner.invoke(app, ["sweep", *args, *COMMON, "--out", str(d)])
        assert r.exit_code == 0, f"{name}: {r.output}"
        frames.append(pd.read_csv(d / "summary.csv").assign(sweep=name))
    return pd.concat(frames, ignore_index=True)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b or str(a) == str(b)


def test_summaries_equal_the_recorded_ones(tmp_path: Path) -> None:
    want = pd.read_csv(RECORDED)
    got = run_sweeps(tmp_path)
    assert len(got) == len(want)
    key = ["sweep", "policy", "page_size", "placement"]
    want = want.sort_values(key).reset_index(drop=True)
    got = got.sort_values(key).reset_index(drop=True)
    diffs = []
    for col in want.columns:
        if col in NOT_RESULTS:
            continue
        new = RENAMED.get(col, col)
        if new not in got.columns:
            diffs.append(f"column {col!r} is gone")
            continue
        for i, (a, b) in enumerate(zip(want[col].tolist(), got[new].tolist(), strict=True)):
            if not _same(a, b):
                diffs.append(f"{want.loc[i, 'sweep']} {want.loc[i, 'policy']} "
                             f"ps={want.loc[i, 'page_size']}: {col} {a!r} -> {b!r}")
    assert not diffs, "\n".join(diffs[:40])


if __name__ == "__main__":  # re-record (only for a change meant to move the numbers)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        df = run_sweeps(Path(tmp))
    RECORDED.parent.mkdir(exist_ok=True)
    df.to_csv(RECORDED, index=False)
    print(f"{len(df)} rows -> {RECORDED}")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
