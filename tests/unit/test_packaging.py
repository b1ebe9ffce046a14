"""The distribution: every package listed, schemas and spec shipped, and installs that work.

Installing the project (from a clone or its wheel, never by name: PyPI's `reconciler` is another
project) gives the engine and the plain client; the `agents` extra adds `consumers.agents`.
The install tests build a wheel and install it into a fresh venv (dependencies come from the pip
cache after the first run) and use it from outside the checkout: the pure wheel
(RECONCILER_PURE=1, quick) without and then with the extra, and, marked `slow`, the wheel a user
gets, built as pip builds it (a fresh venv's pip, isolated, from a copy of the tree): its
compiled modules load as extensions and agree with their sources.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from engine.compiled import COMPILED

REPO = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 900  # a safety net for a hung pip, not a measurement


def _listed_packages() -> set[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    return set(pyproject["tool"]["setuptools"]["packages"])


def test_every_python_package_is_listed_in_pyproject() -> None:
    on_disk = {
        ".".join(init.parent.relative_to(REPO).parts)
        for root in ("engine", "consumers")
        for init in (REPO / root).rglob("__init__.py")
    }
    assert on_disk - _listed_packages() == set(), "add these to [tool.setuptools] packages"


def _pip_wheel(
    source: Path, out: Path, *options: str, python: Path | None = None, **env: str
) -> tuple[Path, str]:
    """The wheel ``python``'s pip (this venv's by default) builds from ``source``, and what the
    build printed."""
    done = subprocess.run(
        [
            str(python or sys.executable),
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-v",
            *options,
            "-w",
            str(out),
            str(source),
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("reconciler-*.whl")
    return wheel, done.stdout + done.stderr


def _binaries(wheel: Path) -> list[str]:
    return [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]


@pytest.fixture(scope="module")
def pure_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Without isolation: this venv has the build's requirements, and compiles nothing here.
    out = tmp_path_factory.mktemp("pure")
    wheel, printed = _pip_wheel(REPO, out, "--no-build-isolation", RECONCILER_PURE="1")
    assert "WARNING" not in printed  # pure on purpose
    return wheel


def test_wheel_contains_schemas_spec_and_type_markers(pure_wheel: Path) -> None:
    names = set(zipfile.ZipFile(pure_wheel).namelist())
    shipped = {n.split("/")[-1] for n in names if n.startswith("reconciler_schemas/")}
    on_disk = {p.name for p in (REPO / "schemas").glob("*.avsc")}
    assert on_disk | {"SPEC.md", "digest_vectors.json"} <= shipped
    assert {"engine/py.typed", "consumers/py.typed"} <= names
    assert any(n.endswith("entry_points.txt") for n in names)


def test_the_pure_wheel_is_for_any_platform_and_carries_no_build(pure_wheel: Path) -> None:
    assert pure_wheel.name.endswith("-py3-none-any.whl")
    assert _binaries(pure_wheel) == []
    assert "engine/compiled_manifest.json" not in zipfile.ZipFile(pure_wheel).namelist()


def test_a_build_without_a_compiler_still_gives_a_wheel_and_says_so_once(tmp_path: Path) -> None:
    wheel, printed = _pip_wheel(REPO, tmp_path, "--no-build-isolation", CC="/nonexistent/cc")
    assert _binaries(wheel) == []
    assert wheel.name.endswith("-py3-none-any.whl")
    warnings = re.findall(r"WARNING: reconciler is built WITHOUT[^\n]*", printed)
    assert len(warnings) == 1, printed[-3000:]
    assert "a C compiler ('/nonexistent/cc' is not on PATH" in warnings[0]
    assert "twice the CPU per event" in warnings[0]


def test_make_rebuilds_when_any_compiled_module_changes() -> None:
    # One list: the Makefile derives the prerequisites of the compiled build from COMPILED.
    done = subprocess.run(
        ["make", "-pn", "setup"], cwd=REPO, capture_output=True, text=True, check=True
    )
    (rule,) = [line for line in done.stdout.splitlines() if line.startswith(".venv/.compiled:")]
    prerequisites = set(rule.split()[1:])
    sources = {f"{m.replace('.', '/')}.py" for m in COMPILED if m != "engine.wire.avro_built"}
    assert sources <= prerequisites
    assert {"tools/build_compiled.py", "engine/wire/avro_gen.py"} <= prerequisites
    # The build writes it: as a prerequisite, every `make setup` would build again.
    assert "engine/wire/avro_built.py" not in prerequisites


PLAIN = """
import importlib, pathlib, sys
import consumers, engine.cli, engine.admin.explain, engine.runtime.engine
from consumers import ReconcilerClient, ReconcilerClientError
from engine.wire import SHIPPED_SCHEMAS
assert "agents" not in sys.modules, "the plain client imported the SDK"
schema_files = list(pathlib.Path(sys.argv[1], "schemas").glob("*.avsc"))
assert len(SHIPPED_SCHEMAS.by_fingerprint) == len(schema_files), "a schema did not ship"
assert not consumers.__file__.startswith(sys.argv[1]), "imported from the checkout"
try:
    importlib.import_module("consumers.agents")
except ModuleNotFoundError as exc:
    print("agents:", exc)
else:
    print("agents: importable")
"""

WITH_AGENTS = """
from consumers.agents import FencedSQLiteSession, ReconciledSession, restore_run_state
print("agents: importable")
"""


def _run(python: Path, code: str, cwd: Path) -> str:
    done = subprocess.run(
        [str(python), "-c", code, str(REPO)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_fresh_venv_installs_the_plain_client_then_the_agents_extra(
    tmp_path: Path, pure_wheel: Path
) -> None:
    wheel = pure_wheel
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True, timeout=INSTALL_TIMEOUT_S)
    plain = _run(python, PLAIN, tmp_path)
    described = _run(python, "from engine import compiled; print(compiled.describe())", tmp_path)
    assert described.startswith("pure: no compiled build here")
    assert plain == (
        "agents: consumers.agents needs the openai-agents SDK. "
        "Fix: reinstall the reconciler with its extra from your clone or wheel, "
        "e.g. pip install './reconciler[agents]'"
    )
    version = subprocess.run(
        [str(env / "bin" / "reconciler"), "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    release = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert version.stdout.strip() == f"reconciler {release}"
    subprocess.run([*pip, f"{wheel}[agents]"], check=True, timeout=INSTALL_TIMEOUT_S)
    assert _run(python, WITH_AGENTS, tmp_path) == "agents: importable"


# What a checkout holds besides its sources: left out of the copy the slow test builds from, as
# an sdist or a fresh clone would be.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
    ".kafka", ".registry", "state", "target", "*.so", "compiled_manifest.json", "avro_built.py",
)  # fmt: skip

COMPILED_CHECK = """
import importlib, importlib.machinery, pathlib, sys
import engine
from engine import compiled
assert not engine.__file__.startswith(sys.argv[1]), "imported from the checkout"
assert compiled.stale_modules() == [], compiled.stale_modules()
assert compiled.mode() == "compiled"
loaders = {m: type(importlib.import_module(m).__loader__) for m in compiled.COMPILED}
extension = importlib.machinery.ExtensionFileLoader
sources = [m for m, loader in loaders.items() if loader is not extension]
assert sources == [], f"loaded from their sources: {sources}"
print(compiled.describe())
"""

# The pure-vs-compiled comparison of tests/unit/test_compiled_path.py, on the installed engine:
# imported first from the venv, so the checkout (appended for `tests`) cannot shadow it.
COMPARE = """
import sys
import engine, pytest
code = pytest.main([
    "-q", "-p", "no:cacheprovider", "--import-mode=append", "--rootdir", sys.argv[1],
    "-c", f"{sys.argv[1]}/pyproject.toml", f"{sys.argv[1]}/tests/unit/test_compiled_path.py",
])
assert not engine.__file__.startswith(sys.argv[1]), "imported from the checkout"
sys.exit(code)
"""


# The mypyc build alone is ~2 min of CPU (4-5 min wall measured on the shared 2-core machine):
# longer than the suite's 300 s guard against a hung test by nature, not by flakiness.
@pytest.mark.timeout(1200)
@pytest.mark.slow
def test_the_wheel_pip_builds_runs_the_compiled_hot_path(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=NOT_SOURCES)
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    # Built by a fresh venv's pip, isolated, as a user's `pip install` builds: mypyc's type check
    # finds the packages of the venv pip runs from, so from this dev venv it would see what the
    # build environment lacks (the build once needed attrs without asking for it).
    wheel, printed = _pip_wheel(source, tmp_path / "dist", python=python)
    assert "WARNING: reconciler is built WITHOUT" not in printed
    assert re.search(r"-cp3\d+-cp3\d+-[a-z]+_", wheel.name), wheel.name  # for this platform only
    names = set(zipfile.ZipFile(wheel).namelist())
    built = {n.split(".")[0].replace("/", ".") for n in names if n.endswith(".so")}
    assert set(COMPILED) <= built
    assert {"engine/compiled_manifest.json", "engine/wire/avro_built.py"} <= names
    assert {f"{m.replace('.', '/')}.py" for m in COMPILED} <= names  # the reference ships too

    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, str(wheel), "pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100"],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    described = _run(python, COMPILED_CHECK, tmp_path)
    assert described == f"compiled: {len(COMPILED)} modules run as mypyc extensions"
    compared = subprocess.run(
        [str(python), "-c", COMPARE, str(REPO)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert compared.returncode == 0, compared.stdout[-5000:] + compared.stderr[-2000:]
    assert re.search(r"\d+ passed", compared.stdout)
    assert "skipped" not in compared.stdout
