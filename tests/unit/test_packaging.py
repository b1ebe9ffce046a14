"""The distribution ships every package and the Avro schemas (a non-editable install finds them)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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


def test_wheel_contains_schemas_and_type_markers(tmp_path: Path) -> None:
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
            str(tmp_path),
            str(REPO),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("reconciler-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped_schemas = {n.split("/")[-1] for n in names if n.startswith("reconciler_schemas/")}
    on_disk = {p.name for p in (REPO / "schemas").glob("*.avsc")}
    assert on_disk <= shipped_schemas
    assert {"engine/py.typed", "consumers/py.typed"} <= names
    assert any(n.endswith("entry_points.txt") for n in names)
