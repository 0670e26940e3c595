"""Recorded results: a fixed set of sweeps through the CLI (every policy, every admission mode,
the bundled traces, closed-loop and prefix-sharing workloads, host and storage tiers under
`paged` and `vllm` with every write policy, LFU / FIFO eviction, LPM, swap, chunked prefill)
and one capacity search, compared with `tests/data/`.

Why: a refactor must leave results identical. This test pins what `kvsim sweep` writes to
summary.csv today, *every* column of it, and each run's per-request results (a digest of the
result columns of its requests, see `requests_digest`), plus the answer of `kvsim capacity`.
It is only re-recorded (`python -m tests.test_recorded_summaries`) when a change is *meant* to
move the numbers, and the commit says which and why.

The column sets must be equal: a column the code now writes that the recording lacks fails
(record it on purpose), and so does one that vanished. Left out, because they are not results:
the wall time, the config hash (a digest of the option names, which a refactor may rename) and
the output path. `RENAMED` maps an option column renamed since the recording to its new name.

Cost: about 40 s of CPU on one core (the sweeps about 36 s, the capacity search about 3 s);
wall time is longer on a shared machine.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

DATA = Path(__file__).parent / "data"
RECORDED = DATA / "recorded_summaries.csv"
RECORDED_CAPACITY = DATA / "recorded_capacity.json"
NOT_RESULTS = {"sim_wall_s", "config_hash", "out"}  # out: the temporary directory
RENAMED: dict[str, str] = {}  # recorded column -> current column (none since the re-record)
DIGEST = "requests_digest"  # the column this test adds: the run's per-request results
KEY = ["sweep", "policy", "page_size", "placement"]  # one row per key in every sweep

ALL_POLICIES = "paged,paged-nocache,vllm,contiguous-max,contiguous-pow2,contiguous-oracle"
# options every recorded command shares (a sweep or the capacity search): pin here whatever a
# change of default must not move (the latency model and its profile, ...)
COMMON = ["--latency", "roofline", "--latency-profile", "vllm-paper-2023"]
SWEEP_ONLY = ["--no-progress", "--no-plot"]
CHAT_TIGHT = ["--workload", "chat", "--num-requests", "48", "--kv-tokens", "3000",
              "--page-sizes", "16", "--max-context-len", "8192"]
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
    # a host tier twice the device pool under both tiered policies, each write policy
    **{f"chat-host-{wp}": [*CHAT_TIGHT, "--policies", "paged,vllm", "--hicache-ratio", "2",
                           "--hicache-write-policy", wp]
       for wp in ("write_through", "write_through_selective", "write_back")},
    # a host tier as large as the device pool, a storage tier behind it
    "chat-host-storage": [*CHAT_TIGHT, "--policies", "paged,vllm", "--hicache-ratio", "1",
                          "--storage-size", "1"],
    # a shared system prompt, so eviction order decides what stays cached
    **{f"chat-evict-{ev}": [*CHAT_TIGHT, "--system-len", "512", "--policies", "paged",
                            "--eviction", ev] for ev in ("lfu", "fifo")},
    "kshot-lpm": ["--workload", "kshot", "--num-prefixes", "4", "--num-requests", "60",
                  "--kv-tokens", "6000", "--page-sizes", "16", "--policies", "paged,vllm",
                  "--schedule", "lpm", "--max-context-len", "4096"],
    "sharegpt-swap": ["--workload", "sharegpt", "--num-requests", "60", "--rate", "8",
                      "--kv-tokens", "4000", "--page-sizes", "16",
                      "--policies", "paged-nocache,vllm", "--preempt", "swap",
                      "--admission", "vllm", "--max-context-len", "2048"],
    "sharegpt-chunked": ["--workload", "sharegpt", "--num-requests", "60", "--kv-tokens", "16000",
                         "--page-sizes", "16", "--policies", "paged,vllm",
                         "--chunked-prefill-size", "256", "--max-context-len", "2048"],
}
# the capacity search: a bisection of overload verdicts on a small workload
CAPACITY = ["--workload", "sharegpt", "--num-requests", "100", "--kv-tokens", "8000",
            "--max-context-len", "2048", "--policy", "paged", "--page-size", "16",
            "--steps", "3"]


# -- the per-request digest ----------------------------------------------------------------------
def _canonical(v: object) -> str:
    """One value as exact text: every number as the hex of its float64 (exact, and the same for
    an int column and a float column holding the same values, so a dtype change alone does
    not move the digest), a missing value as `nan`, text as its repr."""
    if v is None or v is pd.NA or (isinstance(v, (float, np.floating)) and math.isnan(v)):
        return "nan"
    if isinstance(v, (bool, np.bool_)):
        return "T" if v else "F"
    if isinstance(v, (int, float, np.integer, np.floating)):
        return float(v).hex()
    return repr(str(v))


def requests_digest(requests: pd.DataFrame, tags: tuple[str, ...] = (
        "config_hash", "policy", "page_size")) -> str:
    """A digest of a run's per-request results (requests.parquet, less the run's tag columns
    `tags`): the column names sorted, the rows sorted by request id, each value exact
    (`_canonical`), SHA-256 of the text (16 hex digits). Independent of row and column order;
    any value moved by one ulp, a column added or removed changes it."""
    df = requests.drop(columns=[c for c in tags if c in requests.columns])
    if not df["request_id"].is_unique:
        raise ValueError("requests_digest: request_id is not unique")
    cols = sorted(df.columns)
    df = df.sort_values("request_id", kind="stable")
    h = hashlib.sha256("\x1f".join(cols).encode())
    for rec in df[cols].itertuples(index=False, name=None):
        h.update(("\n" + "\x1f".join(map(_canonical, rec))).encode())
    return h.hexdigest()[:16]


@contextmanager
def _digests_of_cells() -> Iterator[dict[str, str]]:
    """While active, every sweep cell's requests digest by its config hash: the real
    `simulate_options` wrapped, so each cell is simulated once, through the sweep's own
    `run_cell` (sweep writes no requests.parquet; this is the frame `kvsim run` writes)."""
    from experiments.answers import runner

    real = runner.simulate_options
    seen: dict[str, str] = {}

    def spy(*args, **kwargs):
        row, result = real(*args, **kwargs)
        seen[str(row["config_hash"])] = requests_digest(result.requests)
        return row, result

    runner.simulate_options = spy
    try:
        yield seen
    finally:
        runner.simulate_options = real


def run_sweeps(out: Path) -> pd.DataFrame:
    """Every sweep of SWEEPS through the CLI; their summary rows, tagged by sweep name, with
    each row's requests digest."""
    from cli import app

    runner = CliRunner()
    frames = []
    with _digests_of_cells() as digests:
        for name, args in SWEEPS.items():
            d = out / name
            r = runner.invoke(app, ["sweep", *args, *COMMON, *SWEEP_ONLY, "--out", str(d)])
            assert r.exit_code == 0, f"{name}: {r.output}"
            df = _read(d / "summary.csv")
            tags = pd.DataFrame({"sweep": name, DIGEST: [digests[str(h)] for h in
                                                         df["config_hash"]]}, index=df.index)
            frames.append(pd.concat([df, tags], axis=1))
    return pd.concat(frames, ignore_index=True)


def run_capacity() -> dict:
    """`kvsim capacity --json` on CAPACITY: the answer and every probe."""
    from cli import app

    r = CliRunner().invoke(app, ["capacity", *CAPACITY, *COMMON, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b or str(a) == str(b)


def summary_diffs(want: pd.DataFrame, got: pd.DataFrame) -> list[str]:
    """Every difference between a recording and a fresh run: columns (both ways), rows, then
    values, exactly (NaN equals NaN)."""
    want_cols = {RENAMED.get(c, c) for c in want.columns} - NOT_RESULTS
    got_cols = set(got.columns) - NOT_RESULTS
    diffs = [f"column {c!r} is written but not recorded: re-record on purpose "
             "(python -m tests.test_recorded_summaries)" for c in sorted(got_cols - want_cols)]
    diffs += [f"column {c!r} is recorded but no longer written" for c in
              sorted(want_cols - got_cols)]
    if len(got) != len(want):
        return [*diffs, f"{len(got)} rows, {len(want)} recorded"]
    want = want.rename(columns=RENAMED).sort_values(KEY).reset_index(drop=True)
    got = got.sort_values(KEY).reset_index(drop=True)
    assert not want.duplicated(KEY).any(), f"the recording has two rows for one {KEY}"
    if not want[KEY].astype(str).equals(got[KEY].astype(str)):
        return [*diffs, "the rows' sweeps, policies, page sizes or placements differ"]
    for col in sorted(want_cols & got_cols):
        for i, (a, b) in enumerate(zip(want[col].tolist(), got[col].tolist(), strict=True)):
            if not _same(a, b):
                diffs.append(f"{want.loc[i, 'sweep']} {want.loc[i, 'policy']} "
                             f"ps={want.loc[i, 'page_size']}: {col} {a!r} -> {b!r}")
    return diffs


def test_summaries_equal_the_recorded_ones(tmp_path: Path) -> None:
    diffs = summary_diffs(_read(RECORDED), run_sweeps(tmp_path))
    assert not diffs, f"{len(diffs)} difference(s):\n" + "\n".join(diffs[:40])


def test_capacity_search_equals_the_recorded_answer() -> None:
    want = json.loads(RECORDED_CAPACITY.read_text())
    got = run_capacity()
    assert set(got) == set(want), f"keys: written {sorted(got)}, recorded {sorted(want)}"
    assert got == want


def test_summary_diffs_see_new_vanished_and_moved_columns() -> None:
    """The comparison itself (no simulation, milliseconds): a column the recording lacks, a
    vanished one and a value moved by one ulp each fail."""
    base = pd.DataFrame({"sweep": ["s", "s"], "policy": ["paged", "vllm"], "page_size": [16, 16],
                         "placement": ["first-fit"] * 2, "x": [0.1, float("nan")],
                         "config_hash": ["a", "b"]})
    assert summary_diffs(base, base.copy()) == []
    assert summary_diffs(base, base.iloc[::-1].assign(config_hash=["c", "d"])) == []
    assert "'y' is written but not recorded" in summary_diffs(base, base.assign(y=1))[0]
    assert "'x' is recorded but no longer written" in summary_diffs(base, base.drop(columns="x"))[0]
    moved = base.assign(x=[np.nextafter(0.1, 1.0), float("nan")])
    assert summary_diffs(base, moved) == ["s paged ps=16: x 0.1 -> 0.10000000000000002"]


def test_requests_digest_is_exact_and_order_free() -> None:
    """Row and column order do not matter; one ulp, one column or an int/float dtype change
    are told apart as the definition says (milliseconds)."""
    df = pd.DataFrame({"request_id": [2, 0, 1], "ttft_s": [0.5, 0.25, float("nan")],
                       "status": ["completed", "rejected", "completed"],
                       "cached_tokens": [3, 0, 16], "policy": ["paged"] * 3})
    d = requests_digest(df)
    assert requests_digest(df.sample(frac=1.0, random_state=1)[df.columns[::-1]]) == d
    assert requests_digest(df.drop(columns="policy")) == d  # a tag, not a result
    assert requests_digest(df.assign(cached_tokens=df["cached_tokens"].astype(float))) == d
    assert requests_digest(df.assign(ttft_s=[np.nextafter(0.5, 1.0), 0.25, float("nan")])) != d
    assert requests_digest(df.assign(load_stall_s=0.0)) != d
    with pytest.raises(ValueError, match="request_id is not unique"):
        requests_digest(pd.concat([df, df]))


def test_digest_of_the_written_requests_parquet_is_the_runs(tmp_path: Path) -> None:
    """The digest of requests.parquet as `kvsim run` writes it equals the digest the sweep
    spy takes of the same run's in-memory frame: the parquet round trip is exact (about 1 s)."""
    from cli import app

    args = ["--workload", "chat", "--num-requests", "12", "--kv-tokens", "3000",
            "--page-size", "16", "--policy", "paged", "--max-context-len", "8192", *COMMON]
    with _digests_of_cells() as digests:
        r = CliRunner().invoke(app, ["run", *args, "--no-progress", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    written = requests_digest(pd.read_parquet(tmp_path / "requests.parquet"))
    assert list(digests.values()) == [written]


if __name__ == "__main__":  # re-record (only for a change meant to move the numbers)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        df = run_sweeps(Path(tmp))
    from reports.io import atomic_write_text, write_csv_atomic

    write_csv_atomic(RECORDED, df)
    atomic_write_text(RECORDED_CAPACITY, json.dumps(run_capacity(), indent=2, sort_keys=True)
                      + "\n")
    print(f"{len(df)} rows, {len(set(df.columns) - NOT_RESULTS)} columns -> {RECORDED}; "
          f"capacity -> {RECORDED_CAPACITY}")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
