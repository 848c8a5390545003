"""No import cycles between the project's modules, and dependencies pointing one way.

Every ``import`` and ``from ... import`` in the packages counts, including imports inside functions
(a lazy import hides a cycle from Python but not from a reader). A module importing its own parent
package is not an edge (Python always imports the parents first).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("topologies", "workloads", "costmodel", "reference", "cli")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _import_graph() -> nx.DiGraph:
    mods = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(mods)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                if target in mods and target != name and not name.startswith(target + "."):
                    graph.add_edge(name, target)
    return graph


def test_no_import_cycles() -> None:
    cycles = sorted(" -> ".join(c + [c[0]]) for c in nx.simple_cycles(_import_graph()))
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_dependencies_point_one_way() -> None:
    """cli -> costmodel -> (workloads, topologies); reference uses workloads only; nothing imports cli."""
    allowed = {
        "topologies": {"topologies"},
        "workloads": {"workloads", "topologies"},
        "costmodel": {"costmodel", "workloads", "topologies"},
        "reference": {"reference", "workloads", "topologies"},
        "cli": set(PACKAGES),
    }
    bad = [f"{a} -> {b}" for a, b in _import_graph().edges
           if b.split(".")[0] not in allowed[a.split(".")[0]]]
    assert bad == [], "imports against the layering:\n" + "\n".join(sorted(bad))


def test_the_detector_sees_lazy_imports() -> None:
    """The graph builder finds lazy imports (a sanity check of the test itself)."""
    graph = _import_graph()
    assert graph.has_edge("costmodel.engine", "costmodel.analytic")  # imported inside predict()
