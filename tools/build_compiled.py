"""Compile the hot modules (`engine.compiled.COMPILED`) with mypyc, in place; run by `make setup`.

``.venv/bin/python -m tools.build_compiled`` writes the generated Avro module first (it is one of
the compiled modules), then builds one C extension per module next to its source plus a shared
library (``engine/compiled_build__mypyc*.so``), and last the manifest of source hashes that
`engine.compiled` checks at import. All of it is git-ignored. ``--clean`` removes it, and the
sources run uncompiled again. setup.py builds the same extensions into the wheel (`pip install .`),
with the manifest written into the wheel rather than the work tree.

A missing compiler or Python headers fails the build with a message saying what to install or
how to choose the uncompiled path on purpose (``make setup PURE=1``): falling back silently
would double the CPU per event without anyone noticing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from engine.compiled import COMPILED, MANIFEST, ROOT, source_hash, source_path
from engine.wire.avro_gen import BUILT_MODULE, module_source
from engine.wire.limits import DEFAULT_LIMITS

if TYPE_CHECKING:
    from setuptools import Extension

BUILD_DIR = ROOT / "build" / "mypyc"
GROUP = "engine.compiled_build"


AVRO_BUILT = source_path(BUILT_MODULE)


def artefacts() -> list[Path]:
    engine = ROOT / "engine"
    return [*engine.rglob("*.so"), MANIFEST, BUILD_DIR, AVRO_BUILT]


def write_avro_module() -> None:
    """The generated readers and writers of the current schemas, as a module to compile."""
    from engine.wire.codec import MODEL_OF
    from engine.wire.schema_store import SHIPPED_SCHEMAS

    schemas = [(SHIPPED_SCHEMAS.current(rt).parsed, model) for rt, model in MODEL_OF.items()]
    AVRO_BUILT.write_text(module_source(schemas, DEFAULT_LIMITS))


def clean() -> None:
    for path in artefacts():
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def check_toolchain() -> str | None:
    """What is missing to compile C extensions here, or None."""
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.exists():
        return f"the Python headers ({include} is missing; Debian: apt-get install python3-dev)"
    # setuptools compiles with $CC when it is set, else with the compiler Python was built with.
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"a C compiler ({compiler!r} is not on PATH; Debian: apt-get install gcc)"
    return None


def extensions(target_dir: Path) -> list[Extension]:
    """The generated Avro module written, then one extension per compiled module plus their
    shared library, their C in ``target_dir``; run from ROOT (setup.py does too)."""
    from mypyc.build import mypycify  # the build needs mypy; the engine at run time does not

    write_avro_module()
    paths = [str(source_path(m).relative_to(ROOT)) for m in COMPILED]
    modules: list[Extension] = mypycify(
        paths, opt_level="3", group_name=GROUP, target_dir=str(target_dir)
    )
    return modules


def manifest_text() -> str:
    """What `engine.compiled` compares the sources with at import."""
    return json.dumps({"sources": {m: source_hash(m) for m in COMPILED}}, indent=1) + "\n"


def build() -> None:
    from setuptools import setup

    clean()
    # Hashed before mypyc reads the sources: an edit saved during the build then leaves the
    # manifest naming the older source, and the import policy calls the extension stale.
    write_avro_module()
    manifest = manifest_text()
    modules = extensions(BUILD_DIR)
    # setup() reads pyproject.toml from the current folder and warns about the project's own
    # metadata; this call builds extensions only.
    warnings.simplefilter("ignore")
    setup(
        name="reconciler-compiled",
        ext_modules=modules,
        script_args=[
            *("--quiet", "build_ext", "--inplace"),
            *("--build-temp", str(BUILD_DIR / "temp"), "--build-lib", str(BUILD_DIR / "lib")),
        ],
    )
    MANIFEST.write_text(manifest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove the compiled artefacts")
    args = parser.parse_args()
    if args.clean:
        clean()
        return
    missing = check_toolchain()
    if missing is not None:
        sys.exit(
            f"build_compiled: cannot compile the hot path: missing {missing}.\n"
            "Install it and run `make setup` again, or run the engine uncompiled on purpose "
            "(about twice the CPU per event): `make setup PURE=1`."
        )
    start = time.monotonic()
    build()
    print(f"build_compiled: {len(COMPILED)} modules compiled in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
