"""Inter-token gaps spilled to disk (simulator/gap_spill.py): the percentiles stay exactly
numpy's over the gaps listed one by one, and a run that spills summarises as one that does
not.

Cost: the hypothesis test well under a second; the two simulations about 1 s together.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import metrics
from simulator.config import SimConfig
from simulator.gap_spill import GapSpill
from simulator.run import simulate
from workloads import build_workload
from workloads.spec import WorkloadSpec

_VALUES = st.one_of(st.sampled_from([0.0, -0.0, 0.001, 0.0070001, 0.5, 1e-9, -2.5, 3e6]),
                    st.floats(-1e6, 1e6, allow_nan=False, width=64))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(_VALUES, min_size=1, max_size=6), st.integers(1, 40)),
                min_size=1, max_size=10),
       st.integers(0, 10))
def test_spilled_percentiles_equal_numpys(groups, cut):
    """Any groups, the first `cut` of them on disk (merged or not), the rest in memory: every
    percentile is bit for bit np.percentile over the gaps one by one."""
    groups = [(np.array(v), c) for v, c in groups]
    spill = GapSpill()
    try:
        for v, c in groups[:cut]:
            spill.write(*metrics.merge_gap_groups([(v, c)]))
        qs = (0.0, 12.5, 50.0, 90.0, 99.0, 100.0)
        flat = np.concatenate([np.repeat(v, c) for v, c in groups])
        want = [float(np.percentile(flat, q)) for q in qs]
        rest = groups[cut:]
        memory = None
        if rest:
            values, counts = metrics.merge_gap_groups(rest)
            memory = (values, np.cumsum(counts))
        got = spill.percentiles(memory, qs)
        assert got == want or np.array_equal(got, want, equal_nan=False)
        assert spill.values == sum(len(np.unique(v)) for v, _ in groups[:cut])
    finally:
        spill.close()


def test_a_run_that_spills_its_gaps_summarises_the_same(monkeypatch):
    """A short run with the recorder's merge and spill thresholds set tiny (every few decode
    steps go to disk) gives the same summary as the default run, ITL percentiles included."""
    w = build_workload(WorkloadSpec(name="sharegpt", num_requests=40, rate=20.0, seed=5))
    cfg = SimConfig.of(policy="paged", page_size=16, latency="roofline")
    plain = simulate(w, cfg).summary
    monkeypatch.setattr(metrics, "GAP_GROUPS", 3)
    monkeypatch.setattr(metrics, "SPILL_VALUES", 2)
    spilled_runs: list[GapSpill] = []
    real_init = GapSpill.__init__

    def counting_init(self):
        real_init(self)
        spilled_runs.append(self)

    monkeypatch.setattr(GapSpill, "__init__", counting_init)
    spilled = simulate(w, cfg).summary
    assert spilled_runs and spilled_runs[0].values > 0  # it did spill
    for k in plain:
        if k != "sim_wall_s":
            assert plain[k] == spilled[k] or (plain[k] != plain[k] and spilled[k] != spilled[k]), k
    assert np.isfinite(plain["itl_p99_s"])
