"""The benchmark's counting-only stand-in (benchmarks/counting_policy.py) measures the same run
as `paged-nocache`: without page ids, a page table or tensors it must still report identical
metrics, or the allocator-share benchmark would compare two different computations."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvcore import policies
from simulator.config import SimConfig
from simulator.run import simulate
from workloads.registry import build_workload
from workloads.spec import WorkloadSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from counting_policy import CountingPolicy

# the page table's size is the one figure a policy without a page table cannot share
STATIC = {"page_table_bytes", "policy"}


@pytest.mark.parametrize("page_size", [1, 16])
def test_counting_standin_reports_what_paged_nocache_reports(page_size: int,
                                                             monkeypatch) -> None:
    # registered for this test only: users never see it
    monkeypatch.setitem(policies.POLICIES._items, "counting",
                        policies.PolicyKind(CountingPolicy, "benchmark only"))
    wl = build_workload(WorkloadSpec(name="azure-conv", num_requests=400))
    runs = {p: simulate(wl, SimConfig.of(policy=p, page_size=page_size, kv_tokens=30000)).summary
            for p in ("paged-nocache", "counting")}
    a, b = runs["paged-nocache"], runs["counting"]
    differ = {k: (a[k], b[k]) for k in a.keys() & b.keys()
              if k not in STATIC and not k.endswith("wall_s") and a[k] != b[k]}
    assert differ == {}
    assert a["iterations"] == b["iterations"] > 0
