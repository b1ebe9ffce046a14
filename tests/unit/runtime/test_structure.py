"""The runtime's shape, checked: composition, not inheritance; small files; no import cycles;
the loop's iteration on one screen. Run: `pytest tests/unit/runtime/test_structure.py`."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import engine.runtime
from engine.runtime.loop import Loop

RUNTIME = Path(engine.runtime.__file__).parent
PACKAGE = "engine.runtime"
SCREEN = 40
MAX_LINES = 300


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(RUNTIME.rglob("*.py")):
        parts = path.relative_to(RUNTIME).with_suffix("").parts
        name = ".".join((PACKAGE, *parts)).removesuffix(".__init__")
        found[name] = path
    return found


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The runtime modules `module` imports (absolute or relative, at any depth)."""
    out: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base in known:
                out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
    out.discard(module)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_runtime_import_graph_has_no_cycle() -> None:
    modules = _modules()
    known = set(modules)
    graph = {m: _imports(m, p, known) - {PACKAGE} for m, p in modules.items()}
    assert sum(len(v) for v in graph.values()) > 20, "the graph was not read"
    assert _cycle(graph) is None


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_runtime_class_inherits_from_another() -> None:
    trees = {path: ast.parse(path.read_text()) for path in _modules().values()}
    ours = {
        node.name
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    assert {"Engine", "Loop", "Commit", "Transactions"} <= ours
    inheriting = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name in ours:
                    inheriting.append(f"{path.relative_to(RUNTIME)}: {node.name}({name})")
    assert inheriting == []


def test_every_runtime_file_is_under_300_lines() -> None:
    long = {
        str(path.relative_to(RUNTIME)): n
        for path in _modules().values()
        if (n := len(path.read_text().splitlines())) >= MAX_LINES
    }
    assert long == {}


def test_the_runtime_is_cut_into_its_folders() -> None:
    folders = {path.parent.name for path in _modules().values()} - {"runtime"}
    assert folders == {"commit", "intake", "process", "tasks"}


def test_the_loop_iteration_reads_in_one_screen() -> None:
    lines = inspect.getsource(Loop.iterate).splitlines()
    assert len(lines) <= SCREEN
