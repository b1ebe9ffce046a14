"""engine/core is pure: it imports only the modules named here (checked on the AST), so no clock,
randomness, I/O, threads or Kafka can reach the fold. A module is allowed by name, not for
lacking a bad one: anything not listed (sqlite3, os, time, engine.wire ...) fails."""

from __future__ import annotations

import ast
from pathlib import Path

import engine.core

# Standard library modules without clock, randomness, I/O, processes or threads.
STDLIB = {
    "__future__",
    "abc",
    "bisect",
    "collections",
    "collections.abc",
    "dataclasses",
    "enum",
    "functools",
    "hashlib",
    "heapq",
    "itertools",
    "json",
    "math",
    "operator",
    "re",
    "types",
    "typing",
}
THIRD_PARTY = {"msgspec", "msgspec.structs"}  # the fold's immutable values
OWN_PACKAGE = "engine.core"


def allowed(module: str) -> bool:
    return module in STDLIB | THIRD_PARTY or module.split(".")[:2] == OWN_PACKAGE.split(".")


def offenders(source: str, name: str) -> list[str]:
    """`name:module` for every import of a module not allowed, and for every dynamic import."""
    found = []
    for node in ast.walk(ast.parse(source)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # A relative import stays inside the package; `from . import x` names no module.
            modules = [] if node.level > 0 else [node.module or ""]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
        ):
            modules = ["__import__()"]
        found += [f"{name}:{module}" for module in modules if not allowed(module)]
    return found


def test_core_imports_only_allowed_modules() -> None:
    core = Path(engine.core.__file__).parent
    files = sorted(core.rglob("*.py"))
    assert len(files) >= 6
    found = [hit for path in files for hit in offenders(path.read_text(), path.name)]
    assert found == []


def test_the_check_refuses_what_is_not_named() -> None:
    source = "\n".join(
        [
            "import sqlite3",
            "import os.path",
            "from time import monotonic",
            "from engine.wire import Codec",
            "import engine.corex",
            "from importlib import import_module",
            "x = __import__('random')",
            "def f() -> None:",
            "    import socket",
            "from typing import Any",
            "from collections.abc import Mapping",
            "from msgspec.structs import replace",
            "from engine.core.state import SessionState",
            "from . import events",
        ]
    )
    assert offenders(source, "m.py") == [
        "m.py:sqlite3",
        "m.py:os.path",
        "m.py:time",
        "m.py:engine.wire",
        "m.py:engine.corex",
        "m.py:importlib",
        "m.py:__import__()",
        "m.py:socket",
    ]
