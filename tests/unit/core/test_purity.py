"""engine/core is pure: no Kafka, clock, randomness or network imports (checked on the AST)."""

from __future__ import annotations

import ast
from pathlib import Path

import engine.core

FORBIDDEN = {"confluent_kafka", "time", "random", "socket", "datetime", "os", "uuid"}


def test_core_imports_nothing_impure() -> None:
    core = Path(engine.core.__file__).parent
    offenders = []
    files = sorted(core.glob("*.py"))
    assert len(files) >= 6
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}:{n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
