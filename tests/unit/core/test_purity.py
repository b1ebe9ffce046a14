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


# Built-ins that read input, open files or run code the AST check cannot see.
FORBIDDEN_CALLS = {"open", "exec", "eval", "compile", "input", "breakpoint", "__import__"}


def resolved(node: ast.ImportFrom, package: str) -> list[str]:
    """The absolute modules a `from` import names. A relative one is resolved against the
    importing module's package (`from ..wire import x` in engine.core is engine.wire); with no
    module (`from .. import wire`) each imported name may be a submodule, so each is checked."""
    if node.level == 0:
        return [node.module or ""]
    parts = package.split(".")
    if node.level > len(parts):
        return ["." * node.level + (node.module or "")]  # beyond the top package: refused
    base = ".".join(parts[: len(parts) - node.level + 1])
    if node.module:
        return [f"{base}.{node.module}"]
    return [f"{base}.{alias.name}" for alias in node.names]


def offenders(source: str, name: str, package: str = OWN_PACKAGE) -> list[str]:
    """`name:module` for every import of a module not allowed (relative ones resolved against
    ``package``, the importing module's), and `name:call()` for every forbidden built-in call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = resolved(node, package)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_CALLS
        ):
            found.append(f"{name}:{node.func.id}()")
        found += [f"{name}:{module}" for module in modules if not allowed(module)]
    return found


def package_of(path: Path, core: Path) -> str:
    """The package a file of engine/core belongs to (engine.core, or a subpackage of it)."""
    return ".".join([OWN_PACKAGE, *path.parent.relative_to(core).parts])


def test_core_imports_only_allowed_modules() -> None:
    core = Path(engine.core.__file__).parent
    files = sorted(core.rglob("*.py"))
    assert len(files) >= 6
    found = [
        hit
        for path in files
        for hit in offenders(path.read_text(), path.name, package_of(path, core))
    ]
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
            "from .state import SessionState",
            "from ..wire import Codec",
            "from .. import runtime",
            "from ... import anything",
            "f = open('x')",
            "exec('1')",
            "eval('1')",
            "c = compile('1', 'f', 'eval')",
            "s = input()",
            "breakpoint()",
            "import re",
            "p = re.compile('x')",
        ]
    )
    assert sorted(offenders(source, "m.py")) == sorted(
        [
            "m.py:sqlite3",
            "m.py:os.path",
            "m.py:time",
            "m.py:engine.wire",
            "m.py:engine.corex",
            "m.py:importlib",
            "m.py:__import__()",
            "m.py:socket",
            "m.py:engine.wire",
            "m.py:engine.runtime",
            "m.py:...",
            "m.py:open()",
            "m.py:exec()",
            "m.py:eval()",
            "m.py:compile()",
            "m.py:input()",
            "m.py:breakpoint()",
        ]
    )


def test_relative_imports_resolve_against_the_importing_package() -> None:
    assert offenders("from ..state import SessionState", "x.py", "engine.core.sub") == []
    assert offenders("from ...wire import Codec", "x.py", "engine.core.sub") == ["x.py:engine.wire"]
