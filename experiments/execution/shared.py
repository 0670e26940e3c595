"""One parsed workload for every cell of a sweep, instead of one per cell.

A page-size sweep over a day's trace runs the same workload nine times; parsing or generating
it per cell (a million requests: about 30 s) would cost as much as some of the cells. The
sweep builds each distinct workload once in its own process (`SharedWorkloads.prepare`); when
cells run in local worker processes it also writes the built workload to one pickle file in a
temporary directory, and each worker loads it once (`workload_for`, memoised per process by
file) rather than re-parsing it for every cell it runs. Workers are started by a fork server
(experiments/execution/executors.py), not forked from this process, so the file is how the parsed
workload reaches them; the pickle is read with the same code version that wrote it, in the same
sweep, and removed when the sweep ends.

A workload is never changed by a simulation (the engine keeps its runtime state in its own
`SimRequest`s), so one object can serve every cell in a process.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from experiments.options.run_options import RunOptions
    from workloads.request import Workload
    from workloads.spec import WorkloadSpec

SHARED_KEY = "_shared_workload"  # a cell's key naming the file of its built workload

# this process's built workloads: by spec (the sweep's own process) and by file (workers)
_BY_SPEC: dict[Any, Workload] = {}
_BY_FILE: dict[str, tuple[Any, Workload]] = {}


def workload_for(spec: WorkloadSpec, shared_file: str | None = None) -> Workload:
    """The workload `spec` describes: the sweep's own (`SharedWorkloads.prepare`), else the
    one in the sweep's shared file (loaded once per process), else built afresh (a workload
    only one cell uses is not kept)."""
    from workloads import build_workload

    if spec in _BY_SPEC:
        return _BY_SPEC[spec]
    if shared_file is not None:
        if shared_file not in _BY_FILE:
            with open(shared_file, "rb") as fh:
                _BY_FILE[shared_file] = pickle.load(fh)
        file_spec, workload = _BY_FILE[shared_file]
        if file_spec == spec:
            return workload
    return build_workload(spec)


class SharedWorkloads:
    """A sweep's shared workloads: `prepare` builds them, `write_files` hands them to local
    workers, `tag` adds the shared file to the cells that use it, `close` forgets them and
    removes the files."""

    def __init__(self) -> None:
        self.files: dict[Any, str] = {}
        self.built: list[Any] = []
        self._dir: str | None = None

    def prepare(self, cells: Sequence[RunOptions]) -> list[int | None]:
        """Build once each workload that two or more of `cells` use; returns each cell's
        request count (None where its workload is its own and not built)."""
        from workloads import build_workload

        specs = [c.workload_spec() for c in cells]
        for spec, n in Counter(specs).items():
            if n >= 2 and spec not in _BY_SPEC:
                _BY_SPEC[spec] = build_workload(spec)
                self.built.append(spec)
        return [_BY_SPEC[s].num_requests if s in _BY_SPEC else None for s in specs]

    def write_files(self) -> None:
        """Each prepared workload to a pickle file the workers load (`tag` names it)."""
        for spec in self.built:
            if spec in self.files:
                continue
            if self._dir is None:
                self._dir = tempfile.mkdtemp(prefix="kvsim-workloads.")
            path = str(Path(self._dir) / f"w{len(self.files)}.pkl")
            with open(path, "wb") as fh:
                pickle.dump((spec, _BY_SPEC[spec]), fh, protocol=pickle.HIGHEST_PROTOCOL)
            self.files[spec] = path

    def tag(self, cell: RunOptions) -> dict[str, Any]:
        """The cell as the dict the executor ships, naming its workload's shared file."""
        d = cell.to_dict()
        path = self.files.get(cell.workload_spec())
        if path is not None:
            d[SHARED_KEY] = path
        return d

    def close(self) -> None:
        for spec in self.built:
            _BY_SPEC.pop(spec, None)
        self.built.clear()
        for path in self.files.values():
            _BY_FILE.pop(path, None)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.files.clear()


__all__ = ["SHARED_KEY", "SharedWorkloads", "workload_for"]
