"""The wheel with the compiled hot path: `pip install .`, `pip wheel .`, `python -m build`.

setuptools reads the project from pyproject.toml; this file adds what a wheel needs to run at
the speed `make setup` gives: the mypyc extensions of `engine.compiled.COMPILED` (built by
tools/build_compiled.py, the same code `make setup` uses in place), the generated Avro module
they include, and the manifest of the source hashes they were built from, which the installed
`engine.compiled` checks at import. The sources ship beside them: the reference, and what runs
under RECONCILER_PURE=1.

Without a C compiler or the Python headers, the wheel carries the sources alone and the build
says so in one warning (the engine then runs at about twice the CPU per event, and logs
"hot path: pure" at start). ``RECONCILER_PURE=1 pip wheel .`` builds that wheel on purpose,
without the warning. An editable install compiles nothing: `make setup` builds in place.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# The C that mypyc writes for the wheel, apart from `make setup`'s (build/mypyc).
WHEEL_C_DIR = Path("build") / "mypyc-wheel"
# The setuptools commands that build what goes into a wheel (editable_wheel is not one).
BUILDING = {"bdist_wheel", "build", "build_ext"}
PURE_ENV = "RECONCILER_PURE"


def _import_from_the_tree() -> None:
    """`engine` and `tools` from this folder, and the schemas under their installed name."""
    sys.path.insert(0, str(HERE))
    init = HERE / "schemas" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "reconciler_schemas", init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reconciler_schemas"] = module
    spec.loader.exec_module(module)


def _warn_pure(missing: str) -> None:
    print(
        f"WARNING: reconciler is built WITHOUT its compiled hot path: missing {missing}. "
        "The engine will run its pure-Python sources at about twice the CPU per event. "
        "Install what is missing and reinstall (pip install --no-cache-dir --force-reinstall "
        "reconciler), or set RECONCILER_PURE=1 to build the pure wheel on purpose.",
        file=sys.stderr,
        flush=True,
    )


def _extensions() -> list[Any]:
    if not BUILDING & set(sys.argv[1:]) or os.environ.get(PURE_ENV, "") not in ("", "0"):
        return []
    os.environ[PURE_ENV] = "1"  # the build reads the sources, whatever a `make setup` left
    _import_from_the_tree()
    try:
        from tools.build_compiled import check_toolchain, extensions
    except ImportError as error:  # mypy (mypyc) missing: a build without isolation
        _warn_pure(f"mypy, which provides mypyc, in the build environment ({error})")
        return []
    missing = check_toolchain()
    if missing is not None:
        _warn_pure(missing)
        return []
    return extensions(WHEEL_C_DIR)


EXTENSIONS = _extensions()


class BuildPy(build_py):
    """The sources, plus the manifest of the compiled build when there is one."""

    def run(self) -> None:
        # build/lib outlives a build: an earlier compiled one must not leak into this wheel.
        lib = Path(self.build_lib)
        for stale in [*lib.glob("engine/**/*.so"), lib / "engine" / "compiled_manifest.json"]:
            stale.unlink(missing_ok=True)
        super().run()
        if EXTENSIONS:
            from tools.build_compiled import manifest_text

            (lib / "engine" / "compiled_manifest.json").write_text(manifest_text())


setup(ext_modules=EXTENSIONS, cmdclass={"build_py": BuildPy})
