"""Every public module, class, function, method and property of the runner library
(`consumers`) and the wire contract (`engine.wire`) has a docstring: they are what other teams
read first."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCUMENTED = ("consumers", "engine/wire")


def _public(name: str) -> bool:
    return not name.startswith("_")


def _is_overload(node: ast.stmt) -> bool:
    """Typing overloads are documented once, on the implementation."""
    decorators = getattr(node, "decorator_list", [])
    return any(
        (isinstance(d, ast.Name) and d.id == "overload")
        or (isinstance(d, ast.Attribute) and d.attr == "overload")
        for d in decorators
    )


def _missing(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = str(path.relative_to(REPO))
    missing = [] if ast.get_docstring(tree) else [f"{where}: module"]

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if not _public(node.name) or _is_overload(node):
                    continue
                if ast.get_docstring(node) is None:
                    missing.append(f"{where}: {prefix}{node.name}")
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return missing


def test_every_public_name_has_a_docstring() -> None:
    missing = [
        entry
        for folder in DOCUMENTED
        for path in sorted((REPO / folder).rglob("*.py"))
        if _public(path.stem) or path.stem == "__init__"
        for entry in _missing(path)
    ]
    assert missing == []
