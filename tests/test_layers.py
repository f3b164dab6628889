"""The package layering: imports point downwards only, and no module imports itself through a cycle.

protocol <- swarm <- node.{observe, tasks} <- node.training <- node.core <- node.{dashboard, experiments} <- node.cli

Every ``import`` statement counts, including ones inside functions and under
``TYPE_CHECKING``: a lazy import is still an arrow in the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "swarm", "node")

# Each layer: (rank, owning prefix). Two modules may import each other's layer only downwards
# (strictly lower rank) or within one layer.
LAYERS: dict[str, int] = {
    "protocol": 0,
    "swarm": 1,
    "node.observe": 2,
    "node.tasks": 2,
    "node.training": 3,
    "node.core": 4,
    "node.dashboard": 5,
    "node.experiments": 5,
    "node.cli": 6,
    "node": 7,  # only the modules in TOP_MODULES: a new subpackage must be given its own layer
}
TOP_MODULES = {"node", "node.__main__"}


def layer_of(module: str) -> str:
    """The longest layer prefix that owns ``module``."""
    best = ""
    for prefix in LAYERS:
        if prefix == "node" and module not in TOP_MODULES:
            continue
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    assert best, module
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The first-party module an import names (``from a.b import c`` may name module a.b.c or object c)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """First-party modules imported anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            if n.split(".")[0] in PACKAGES:
                target = resolve(n, modules)
                if target is not None:
                    found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    graph = {m: imports_of(p, modules) for m, p in modules.items()}
    for m, targets in graph.items():
        # a package's __init__ is imported by its own modules implicitly; the edge to a parent package is fine
        targets.discard(m)
        graph[m] = {t for t in targets if not m.startswith(t + ".") or t in ("node", "swarm", "protocol")}
    return graph


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(graph.items()):
        ls = layer_of(src)
        for dst in sorted(targets):
            ld = layer_of(dst)
            if ls == ld or LAYERS[ls] > LAYERS[ld]:
                continue
            bad.append(f"{src} -> {dst} ({ls} may not import {ld})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_belongs_to_a_layer() -> None:
    for m in all_modules():
        assert layer_of(m) in LAYERS
    for stray in ("node.newpackage.module", "node.loose_module", "swarmx.thing"):  # what a new module must not be
        try:
            layer_of(stray)
        except AssertionError:
            continue
        raise AssertionError(f"{stray} was given a layer it was never assigned")


def test_imports_point_downwards_only() -> None:
    assert layering_violations(import_graph()) == []


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_the_checks_catch_what_they_claim() -> None:
    """The detectors themselves: a made-up upward arrow and a made-up cycle are both reported."""
    graph = {
        "node.core.node": {"node.dashboard.data"},
        "node.tasks.a": {"node.tasks.b"},
        "node.tasks.b": {"node.tasks.a"},
    }
    assert layering_violations(graph) == [
        "node.core.node -> node.dashboard.data (node.core may not import node.dashboard)"
    ]
    assert cycles(graph) == [["node.tasks.a", "node.tasks.b"]]
    assert layering_violations({"node.tasks.x": {"node.observe.y"}}) != []  # same rank, other layer: sideways
