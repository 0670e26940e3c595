"""The import graph of kvsim's own modules: no circles, and the layers DEVELOPERS.md describes.

Built from the source with `ast` (nothing is imported): one node per module of kvcore/,
workloads/, simulator/, experiments/, reports/ and cli.py; one edge per import of another of
them. Every import statement counts, wherever it is: inside a function (a lazy import is still
a dependency) and under `if TYPE_CHECKING:` (a type is a dependency too).

The layers, bottom to top: kvcore < workloads < simulator < experiments < cli. A module may
import its own package and the packages below it. reports/ (reading, drawing and writing
results) sits beside them: only experiments/ and cli.py import it, and it imports neither
experiments/ nor, even indirectly, a simulator module that runs a simulation.

Inside kvcore the folders are layers too: the plumbing (contract/registry, fields, validation)
< model/ < the rest of contract/ < tiers/ < the families (contiguous/, sglang/, vllm/), which
import neither each other nor the catalog, < policies/ (the catalog, which registers them).
experiments/ likewise: options/ < execution/ < answers/ (the use cases) < validation/ and
console/ (typer and the terminal) < cli.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvcore", "workloads", "simulator", "experiments", "reports")

# importer's package -> the packages it may import (its own included)
ALLOWED: dict[str, set[str]] = {
    "kvcore": {"kvcore"},  # the bottom layer imports nothing else
    "workloads": {"kvcore", "workloads"},
    "simulator": {"kvcore", "workloads", "simulator"},
    "reports": {"kvcore", "workloads", "simulator", "reports"},  # no entry point: see below
    "experiments": {"kvcore", "workloads", "simulator", "reports", "experiments"},
    "cli": {"kvcore", "workloads", "simulator", "reports", "experiments"},
}
# simulator modules that run a simulation: reports must not reach them, even indirectly
SIMULATION_ENTRY_POINTS = {"simulator.run", "simulator.engine"}
# edges left out of the cycle check, each with the change that removes it
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()
# kvcore's folders, bottom to top; a folder imports its own and those below it
KVCORE_PLUMBING = {"kvcore.contract.registry", "kvcore.contract.fields",
                   "kvcore.contract.validation"}
KVCORE_FAMILIES = ("kvcore.contiguous", "kvcore.sglang", "kvcore.vllm")
# experiments' folders -> the folders of experiments each may import (its own included)
EXPERIMENTS_FOLDERS: dict[str, set[str]] = {
    "experiments": set(),
    "experiments.options": {"experiments.options"},
    "experiments.execution": {"experiments.options", "experiments.execution"},
    "experiments.answers": {"experiments.options", "experiments.execution",
                            "experiments.answers"},
    "experiments.validation": {"experiments.options", "experiments.execution",
                               "experiments.answers", "experiments.validation"},
    "experiments.console": {"experiments.options", "experiments.execution",
                            "experiments.answers", "experiments.console"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    files = [ROOT / "cli.py"]
    for pkg in PACKAGES:
        files += sorted((ROOT / pkg).rglob("*.py"))
    return {_module_name(p): p for p in files}


def _resolve(name: str, modules: set[str]) -> str | None:
    """The most specific project module that `name` (a.b.c, maybe a.b.attr) refers to."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph() -> dict[str, set[str]]:
    sources = _sources()
    modules = set(sources)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in sources.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, level - 1 packages up
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                target = _resolve(name, modules)
                if target is not None and target != mod:
                    graph[mod].add(target)
    return graph


def _package(module: str) -> str:
    return module.split(".")[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    g = import_graph()
    assert {"cli", "kvcore.model.planner", "experiments.options.run_options",
            "reports.plots"} <= set(g)
    assert "experiments.options.run_options" in g["cli"]
    assert "kvcore.model.memory" in g["kvcore.model.planner"]


def test_no_import_cycles():
    g = import_graph()
    for a, b in KNOWN_CYCLE_EDGES:
        assert b in g.get(a, set()), (f"{a} no longer imports {b}: delete it from "
                                      "KNOWN_CYCLE_EDGES")
    pruned = {m: {t for t in ts if (m, t) not in KNOWN_CYCLE_EDGES} for m, ts in g.items()}
    assert _cycles(pruned) == []


def test_layers():
    bad = [f"{m} imports {t}" for m, ts in import_graph().items() for t in sorted(ts)
           if _package(t) not in ALLOWED[_package(m)]]
    assert bad == []


def test_kvcore_imports_nothing_else():
    g = import_graph()
    assert all(_package(t) == "kvcore" for m, ts in g.items() if _package(m) == "kvcore"
               for t in ts)


def test_reports_only_reads_results():
    g = import_graph()
    importers = {m for m, ts in g.items() for t in ts if _package(t) == "reports"}
    assert {_package(m) for m in importers} <= {"reports", "experiments", "cli"}
    reached: set[str] = set()
    todo = [m for m in g if _package(m) == "reports"]
    while todo:  # everything reports reaches, directly or not
        for t in g[todo.pop()]:
            if t not in reached:
                reached.add(t)
                todo.append(t)
    assert reached & SIMULATION_ENTRY_POINTS == set()
    assert not any(_package(m) == "experiments" for m in reached)


def _kvcore_folder(module: str) -> str:
    if module in KVCORE_PLUMBING:
        return "plumbing"
    return ".".join(module.split(".")[:2])


def test_kvcore_folders():
    below = {"plumbing": {"plumbing"},
             "kvcore.model": {"plumbing", "kvcore.model"},
             "kvcore.contract": {"plumbing", "kvcore.model", "kvcore.contract"},
             "kvcore.tiers": {"plumbing", "kvcore.model", "kvcore.contract", "kvcore.tiers"}}
    for family in KVCORE_FAMILIES:  # a family: the layers below and itself, no other family
        below[family] = below["kvcore.tiers"] | {family}
    below["kvcore.policies"] = set(below) | {"kvcore.policies"}
    below["kvcore"] = {"kvcore"}
    bad = [f"{m} imports {t}" for m, ts in import_graph().items() if _package(m) == "kvcore"
           for t in sorted(ts) if _kvcore_folder(t) not in below[_kvcore_folder(m)]]
    assert bad == []


def _folder(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_experiments_folders():
    g = import_graph()
    assert {_folder(m) for m in g if _package(m) == "experiments"} == set(EXPERIMENTS_FOLDERS)
    bad = [f"{m} imports {t}" for m, ts in g.items() if _package(m) == "experiments"
           for t in sorted(ts) if _package(t) == "experiments"
           and _folder(t) not in EXPERIMENTS_FOLDERS[_folder(m)]]
    assert bad == []
