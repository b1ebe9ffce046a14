"""Which engine modules run compiled, and the switch that runs the same sources uncompiled.

`make setup` compiles the modules in `COMPILED` with mypyc (`tools/build_compiled.py`): each
gets a C extension next to its source, which Python's import prefers to the `.py` file. The
sources stay the reference. Importing `engine` installs an import policy that decides, once,
which of the two every compiled module loads as:

- ``RECONCILER_PURE=1``: the sources, uncompiled (the reference path; the tests compare the
  two with `load_pure`).
- any compiled source changed since the build (its hash differs from the manifest the build
  wrote): the sources too, with one warning, because a stale extension would run old code. The
  modules of one build call each other natively, so it is all of them or none.
- otherwise: the extensions.

No build (no compiler, or never run) simply means no extensions: the sources run.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = Path(__file__).resolve().parent / "compiled_manifest.json"
PURE_ENV = "RECONCILER_PURE"

# Hot modules: the fold (engine/core minus the msgspec struct modules, whose metaclass mypyc
# cannot compile), the decode checks, the Avro primitives with the readers and writers
# generated at build time, and the engine's per-input intake (ingest, order buffer). Not the
# Codec class: compiled, it would check argument types at the call (a str where bytes belong
# raises TypeError instead of the codec's DecodeError); Ingest passes it what it was given.
COMPILED: tuple[str, ...] = (
    "engine.core.acks",
    "engine.core.answers",
    "engine.core.authority",
    "engine.core.causal",
    "engine.core.classify",
    "engine.core.decide",
    "engine.core.digest",
    "engine.core.fold",
    "engine.core.intents",
    "engine.core.members",
    "engine.core.open_write",
    "engine.core.parked",
    "engine.core.reconcile",
    "engine.core.repairs",
    "engine.core.resumes",
    "engine.core.watermark",
    "engine.wire.validation",  # the range and shape rules every decoded input passes
    "engine.wire.avro_prims",
    "engine.wire.avro_built",  # written by the build (engine.wire.avro_gen.module_source)
    "engine.wire.partitioner",  # murmur2 of each new session key: ~4.7 us interpreted
    "engine.runtime.intake.ingest",  # once per input: ~0.7 us less than interpreted (bench_ingest)
    "engine.runtime.intake.ordering",
    # Step 2's glue around the fold, per input: the step, the task and its caches, the claim.
    "engine.runtime.fold_step",
    "engine.runtime.tasks.task",
    "engine.runtime.tasks.generation",
    "engine.runtime.tasks.read_cache",
    "engine.runtime.tasks.assignment",
)

_log = logging.getLogger(__name__)


def source_path(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def source_hash(module: str) -> str:
    return hashlib.sha256(source_path(module).read_bytes()).hexdigest()


def stale_modules() -> list[str]:
    """Compiled modules whose source differs from what was compiled ([] when all match)."""
    try:
        built: dict[str, str] = json.loads(MANIFEST.read_text())["sources"]
    except (OSError, ValueError, KeyError):
        return []  # no manifest: nothing was built, the sources run anyway
    return [m for m in built if not source_path(m).exists() or built[m] != source_hash(m)]


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the `.py` file of a compiled module instead of its extension."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = frozenset(modules)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules or not source_path(fullname).exists():
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def _is_extension(module: ModuleType) -> bool:
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)


def install_import_policy() -> None:
    """Decide compiled or pure for this process (see the module docstring)."""
    if any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        return
    reason = None
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        reason = f"{PURE_ENV} is set"
    else:
        stale = stale_modules()
        if stale:
            reason = "stale"
            _log.warning(
                "%s changed since the compiled build; running every compiled module from its "
                "source (slower). Run `make setup` to rebuild.",
                ", ".join(stale),
            )
    if reason is not None:
        sys.meta_path.insert(0, _SourceFinder(COMPILED))


def mode() -> str:
    """'compiled' when the compiled modules imported so far are extensions, else 'pure'."""
    loaded = [sys.modules[m] for m in COMPILED if m in sys.modules]
    if not loaded:
        import engine.core.fold  # noqa: F401  (the first compiled module anything needs)

        loaded = [sys.modules[m] for m in COMPILED if m in sys.modules]
    return "compiled" if all(_is_extension(m) for m in loaded) else "pure"


def describe() -> str:
    """What this process runs, in one line for an operator:
    ``python -c "from engine import compiled; print(compiled.describe())"``."""
    if mode() == "compiled":
        return f"compiled: {len(COMPILED)} modules run as mypyc extensions"
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        why = f"{PURE_ENV} is set"
    elif not MANIFEST.exists():
        why = (
            "no compiled build here (installed from a wheel built without a C compiler or with "
            f"{PURE_ENV}=1, or `make setup PURE=1`); reinstall where gcc and the Python "
            "headers are present, or run `make setup`"
        )
    elif stale_modules():
        why = "sources changed since the compiled build; run `make setup` or reinstall"
    else:
        why = "the compiled build does not load here; rebuild it (`make setup` or reinstall)"
    return f"pure: {why}. The sources run at about twice the CPU per event"


@contextmanager
def _swapped(modules: Sequence[str]) -> Iterator[dict[str, ModuleType]]:
    saved = {m: sys.modules.pop(m) for m in modules if m in sys.modules}
    finder = _SourceFinder(modules)
    sys.meta_path.insert(0, finder)
    fresh: dict[str, ModuleType] = {}
    try:
        yield fresh
    finally:
        sys.meta_path.remove(finder)
        for m in modules:
            module = sys.modules.pop(m, None)
            if module is not None:
                fresh[m] = module
        sys.modules.update(saved)


def load_pure(*names: str) -> dict[str, ModuleType]:
    """Fresh uncompiled copies of ``names`` (and of every compiled module they import), next
    to whatever this process already runs; shared values (events, state) stay the same
    classes. For the tests that hold the compiled path to the reference."""
    with _swapped(COMPILED) as fresh:
        for name in names:
            importlib.import_module(name)
    return {name: fresh[name] for name in names}
