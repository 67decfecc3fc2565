"""The package's layers, checked by parsing its source (nothing is imported).

The layer order is written once, in docs/architecture.md (the line starting
``Layers, lowest first:``); this test reads it there. Every import counts: at module
level, inside functions and under ``TYPE_CHECKING``. A module imports only from its own
folder, from folders below it and from the root's leaf modules (which import nothing of
the package); nothing imports the package root (the public API); and no modules import
each other in a circle, within a folder either.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "torchrec_dreamshard"
ARCHITECTURE = REPO / "docs" / "architecture.md"
ORDER_LINE = re.compile(r"^Layers, lowest first: (.+)$", re.M)
# (importer, imported) against the order, each with why. None: the planner hands the job
# it planned to feedback as a value (planner.plan_record), and the package root's
# observe(planner, dmp) joins the two.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


def layer_order() -> list[str]:
    """The folders in the order docs/architecture.md gives, lowest first."""
    found = ORDER_LINE.findall(ARCHITECTURE.read_text())
    assert len(found) == 1, "docs/architecture.md must state the layer order exactly once"
    return [name.strip().strip("`") for name in found[0].split("->")]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(name: str, path: Path, node: ast.AST) -> list[str]:
    """The dotted names ``node`` (an import statement of module ``name``) may import."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        module = ".".join([*base, *([node.module] if node.module else [])])
    else:
        module = node.module or ""
    return [module, *(f"{module}.{alias.name}" for alias in node.names)]


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module of the package it imports: the first line that does}, counting
    every import statement (inside functions too). ``from pkg import sub`` imports both
    ``pkg`` (its ``__init__``) and ``pkg.sub``."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in _targets(name, path, node):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _layer(module: str, order: list[str]) -> int | None:
    """The module's layer: its folder's position in ``order``; -1 for a root leaf;
    ``None`` for the package root (the public API, above everything)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    if len(parts) == 2 and (PACKAGE / f"{parts[1]}.py").exists():
        return -1
    return order.index(parts[1])


def test_the_order_names_every_folder_once():
    order = layer_order()
    folders = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert len(order) == len(set(order)), order
    assert sorted(order) == folders, f"order {order} against folders {folders}"


def test_no_import_runs_up_the_layers():
    order = layer_order()
    offenders = []
    for module, targets in import_graph().items():
        here = _layer(module, order)
        if here is None:
            continue  # the public API re-exports from wherever things live
        for target, line in targets.items():
            there = _layer(target, order)
            ok = there is not None and there <= here and not (here == -1 and there == -1)
            if not ok and (module, target) not in KNOWN_EXCEPTIONS:
                offenders.append(f"{module}:{line} imports {target}")
    assert not offenders, offenders


def test_no_circle_of_imports():
    graph = import_graph()
    for module, target in KNOWN_EXCEPTIONS:
        graph[module].pop(target, None)
    assert not circles(graph), circles(graph)


def test_the_checks_see_what_they_must():
    """The walk finds a function-local import (the command line's are all inside
    functions, for a fast ``--help``) and a circle."""
    graph = import_graph()
    steptime = "torchrec_dreamshard.cli.steptime"
    assert "torchrec_dreamshard.evaluation.dmp_step" in graph[steptime]
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        ["a", "b", "c"]
    ]
    for module, target in KNOWN_EXCEPTIONS:
        assert target in graph[module], f"{module} no longer imports {target}: drop the entry"
