"""Writing a run's results: summary.csv, requests.parquet, timeline.parquet, config.json.

Every file is written atomically (reports.io). The rows and the config document are built by
experiments.answers.runner; this module only writes them, so it needs nothing that simulates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from reports.io import atomic_write_text, write_csv_atomic, write_parquet_atomic
from reports.schema import CONFIG_FILE, REQUESTS_FILE, SUMMARY_FILE, TIMELINE_FILE


def write_config(out: str | Path, doc: Mapping[str, Any]) -> Path:
    return atomic_write_text(Path(out) / CONFIG_FILE,
                             json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")


def write_run(out: str | Path, rows: Sequence[Mapping[str, Any]], results: Sequence[Any],
              config_doc: Mapping[str, Any]) -> None:
    """summary.csv (one row per run), requests.parquet / timeline.parquet (each result's
    `requests` and `timeline` frames, tagged with the run's config_hash, policy and page size)
    and config.json, each written atomically. A single run that streamed its rows to
    out/requests.parquet as it went (`result.extra["requests_file"]`) is not written again."""
    out = Path(out)
    # a run that streamed its rows there (experiments.answers.runner.simulate_options) has written
    # requests.parquet already, atomically
    streamed = len(results) == 1 and \
        results[0].extra.get("requests_file") == str(out / REQUESTS_FILE)
    req_parts, tl_parts = [], []
    for row, res in zip(rows, results, strict=True):
        tag = {"config_hash": row["config_hash"], "policy": row["policy"],
               "page_size": row["page_size"]}
        if not streamed:
            req_parts.append(res.requests.assign(**tag))
        tl_parts.append(res.timeline.assign(**tag))
    if not streamed:
        write_parquet_atomic(out / REQUESTS_FILE, _safe_concat(req_parts))
    write_parquet_atomic(out / TIMELINE_FILE, _safe_concat(tl_parts))
    write_csv_atomic(out / SUMMARY_FILE, pd.DataFrame(list(rows)))
    write_config(out, config_doc)


def _safe_concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    for col in df.columns:  # object columns of mixed None / str / int break parquet
        if df[col].dtype == object:
            df[col] = df[col].map(lambda v: None if v is None else str(v))
    return df


def results_dir(d: Path) -> Path:
    """A results directory given to `kvsim plot` / `report` (ValueError when it is none)."""
    if not d.is_dir():
        raise ValueError(f"DIR {str(d)!r} is not a directory (give the --out directory of kvsim "
                         "run / sweep / compare)")
    return d
