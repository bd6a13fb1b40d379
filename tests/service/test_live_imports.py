"""service/live has no import circle (issue 43, "the house of service/live"): the runtime (runtime.py) composes
the parts, and each part names what it needs of the runtime as a small interface of its own (a ``Protocol``), so no
module of service/live imports runtime.py, and no module imports one that imports it back, not even under
``TYPE_CHECKING`` or inside a function. Pure: parses the sources with :mod:`ast`, imports nothing."""
from __future__ import annotations

import ast
from pathlib import Path

LIVE = Path(__file__).resolve().parents[2] / "service" / "live"
PACKAGE = "service.live"


def _imports(path: Path) -> set[str]:
    """The modules of service/live that ``path`` imports anywhere (module level, ``TYPE_CHECKING``, functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.ImportFrom):  # relative: from . import x, from .x import y
            base = PACKAGE if node.level == 1 else ""
            mod = f"{base}.{node.module}" if node.module else base
            names = [mod, *(f"{mod}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out.update(n for n in names if n.startswith(PACKAGE + "."))
    return out


def import_graph() -> dict[str, set[str]]:
    """Module of service/live -> the modules of service/live it imports."""
    modules = {f"{PACKAGE}.{p.stem}": p for p in LIVE.glob("*.py") if p.stem != "__init__"}
    return {name: (_imports(path) & modules.keys()) - {name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)) is not None:
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_graph_sees_type_checking_imports() -> None:
    graph = import_graph()
    assert len(graph) > 10
    assert f"{PACKAGE}.recovery" in graph[f"{PACKAGE}.runtime"]


def test_service_live_has_no_import_circle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle in service/live: " + " -> ".join(cycle or [])


def test_no_part_imports_the_runtime() -> None:
    importers = sorted(m for m, deps in import_graph().items() if f"{PACKAGE}.runtime" in deps)
    assert importers == [], f"{importers} import service.live.runtime: name what they need as a Protocol instead"
