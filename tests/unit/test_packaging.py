"""The distribution: every package listed, schemas and spec shipped, and two installs that work.

`pip install reconciler` gives the engine and the plain client; `pip install 'reconciler[agents]'`
adds `consumers.agents`. The install test builds the wheel and installs it into a fresh venv
(dependencies come from the pip cache after the first run), first without and then with the
extra, and imports what each promises from outside the checkout.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

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


def _wheel(out: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    (wheel,) = out.glob("reconciler-*.whl")
    return wheel


def test_wheel_contains_schemas_spec_and_type_markers(tmp_path: Path) -> None:
    names = set(zipfile.ZipFile(_wheel(tmp_path)).namelist())
    shipped = {n.split("/")[-1] for n in names if n.startswith("reconciler_schemas/")}
    on_disk = {p.name for p in (REPO / "schemas").glob("*.avsc")}
    assert on_disk | {"SPEC.md", "digest_vectors.json"} <= shipped
    assert {"engine/py.typed", "consumers/py.typed"} <= names
    assert any(n.endswith("entry_points.txt") for n in names)


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


def test_fresh_venv_installs_the_plain_client_then_the_agents_extra(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "dist")
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True, timeout=INSTALL_TIMEOUT_S)
    plain = _run(python, PLAIN, tmp_path)
    assert plain == (
        "agents: consumers.agents needs the openai-agents SDK. "
        "Fix: pip install 'reconciler[agents]'"
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
