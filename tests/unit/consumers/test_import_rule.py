"""`consumers` may import `engine.core` and `engine.wire`, nothing else of the engine (an
allow-list: a runner service must not pull in the runtime, the CLI or the operator commands),
and only `consumers.agents` may import the openai-agents SDK."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# engine.compiled: the stdlib-only import policy every `import engine` runs; the other is the
# shared library of the mypyc-compiled core (tools/build_compiled.py).
ALLOWED_ENGINE = ("engine.core", "engine.wire", "engine.compiled", "engine.compiled_build__mypyc")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _engine_but_not_allowed(name: str) -> bool:
    if name != "engine" and not name.startswith("engine."):
        return False
    return not any(name == a or name.startswith(a + ".") for a in ALLOWED_ENGINE)


def test_consumers_modules_import_only_allowed_engine_packages() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(n for n in _imports(path) if _engine_but_not_allowed(n))
        for path in (REPO / "consumers").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_agents_subpackage_imports_the_sdk() -> None:
    offenders = sorted(
        str(path.relative_to(REPO))
        for path in (REPO / "consumers").rglob("*.py")
        if "agents" not in path.relative_to(REPO / "consumers").parts[:-1]
        and any(n == "agents" or n.startswith("agents.") for n in _imports(path))
    )
    assert offenders == []


def _loaded_after_importing(modules: list[str]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_importing_every_consumers_module_loads_only_allowed_engine_modules() -> None:
    modules = sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in (REPO / "consumers").rglob("*.py")
    )
    loaded = _loaded_after_importing(modules)
    assert [m for m in loaded if m != "engine" and _engine_but_not_allowed(m)] == []
    assert "engine.core.digest" in loaded  # the shared digest helper is what it uses


def test_the_plain_client_does_not_load_the_agents_sdk() -> None:
    loaded = _loaded_after_importing(["consumers", "consumers.client", "consumers.sdk_checkpoint"])
    assert [m for m in loaded if m == "agents" or m.startswith("agents.")] == []
