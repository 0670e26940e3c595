"""The schedule as a Chrome / Perfetto trace (open it in ui.perfetto.dev or chrome://tracing).

One track per request: a span per prefill chunk and per decode stretch (consecutive decode
iterations merged), and a "KV memory" counter track with the six-way breakdown in slots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from kvcore.contract.breakdown import PARTS
from reports.io import atomic_write_text

_US = 1e6
_PID_REQ = 1
_PID_MEM = 0


class EventCollector:
    """An `event_sink` for `simulate`: collects spans while the engine runs."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self._decode: dict[int, list[float]] = {}  # rid -> [start, end, steps]
        self._rids: set[int] = set()

    def __call__(self, t0: float, t1: float, chunks, decode_rids, steps: int) -> None:
        for rid, start, end in chunks or ():
            self._close(rid)
            self._rids.add(int(rid))
            self.spans.append(_span(f"prefill {start}-{end}", t0, t1, rid, "prefill",
                                    {"from_token": int(start), "to_token": int(end)}))
        for rid in decode_rids:
            cur = self._decode.get(rid)
            if cur is not None and abs(cur[1] - t0) <= 1e-9 * max(1.0, abs(t0)):
                cur[1] = t1
                cur[2] += steps
            else:
                self._close(rid)
                self._decode[rid] = [t0, t1, steps]
                self._rids.add(int(rid))

    def _close(self, rid: int) -> None:
        cur = self._decode.pop(rid, None)
        if cur is not None:
            self.spans.append(_span(f"decode x{int(cur[2])}", cur[0], cur[1], rid, "decode",
                                    {"steps": int(cur[2])}))

    def trace(self, timeline: pd.DataFrame | None = None,
              requests: pd.DataFrame | None = None) -> dict[str, Any]:
        for rid in list(self._decode):
            self._close(rid)
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": _PID_MEM, "args": {"name": "KV memory"}},
            {"ph": "M", "name": "process_name", "pid": _PID_REQ, "args": {"name": "requests"}},
        ]
        for rid in sorted(self._rids):
            events.append({"ph": "M", "name": "thread_name", "pid": _PID_REQ, "tid": rid,
                           "args": {"name": f"request {rid}"}})
        if requests is not None and len(requests):
            for r in requests.itertuples(index=False):
                if r.status == "completed":
                    events.append({"ph": "i", "s": "t", "name": "arrival", "pid": _PID_REQ,
                                   "tid": int(r.request_id), "ts": float(r.arrival_s) * _US})
        events.extend(self.spans)
        if timeline is not None and len(timeline):
            parts = [p for p in PARTS if p in timeline.columns]
            for row in timeline.itertuples(index=False):
                d = row._asdict()
                ts = float(d["time_s"]) * _US
                events.append({"ph": "C", "name": "KV memory (slots)", "pid": _PID_MEM,
                               "ts": ts, "args": {p: int(d[p]) for p in parts}})
                events.append({"ph": "C", "name": "requests", "pid": _PID_MEM, "ts": ts,
                               "args": {k: int(d[k]) for k in ("running", "waiting")
                                        if k in d}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, path: str | Path, timeline: pd.DataFrame | None = None,
              requests: pd.DataFrame | None = None) -> Path:
        return atomic_write_text(path, json.dumps(self.trace(timeline, requests)))


def _span(name: str, t0: float, t1: float, rid: int, cat: str, args: dict) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "pid": _PID_REQ, "tid": int(rid),
            "ts": t0 * _US, "dur": max(t1 - t0, 0.0) * _US, "args": args}
