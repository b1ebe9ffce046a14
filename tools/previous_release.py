"""The previous release of the engine, built from git into its own virtualenv, for the upgrade test.

    python -m tools.previous_release [--ref REF]    # prints the venv's python; builds it once

Which release: `--ref`, else `RECONCILER_PREVIOUS_RELEASE` (a commit or a tag), else
`PREVIOUS_RELEASE` below, the commit of the last release. Cutting a release means moving that
constant to it, so the upgrade test always starts from what users run today.

How: `git archive` of that commit into a scratch folder, a new venv, and a plain (not editable)
install of the sources without the compiled hot path (`RECONCILER_PURE=1`: the same code, pure
Python, no two-minute mypyc build). The venv lives in the tool cache (tools/cache.py), one
folder per commit, so every clone on the machine builds a given release once. The scratch
sources are removed: the venv's site-packages holds the installed copy, and the process runs
outside the clone so the clone's own `engine/` can never shadow it.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from tools.cache import fresh_dir, is_complete, mark_complete, tool_dir
except ModuleNotFoundError:  # run as `python tools/previous_release.py`
    from cache import (  # type: ignore[import-not-found,no-redef]
        fresh_dir,
        is_complete,
        mark_complete,
        tool_dir,
    )

REPO = Path(__file__).resolve().parents[1]
PREVIOUS_RELEASE = "604cb3f5f46038d3ed596e77cb9a1ac57cd90d4d"
RELEASE_ENV = "RECONCILER_PREVIOUS_RELEASE"
BUILD_TIMEOUT_S = 600.0
"""One pip install from a warm cache takes ~30 s; a cold one downloads the dependencies."""


class ReleaseBuildError(Exception):
    """The previous release could not be built; the message says what to do."""


def wanted_ref(explicit: str | None = None) -> str:
    return explicit or os.environ.get(RELEASE_ENV) or PREVIOUS_RELEASE


def commit_of(ref: str) -> str | None:
    """The full commit hash of `ref` in this clone, or None when the clone has no such commit."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return found.stdout.strip() if found.returncode == 0 else None


def resolve(ref: str) -> str:
    """The full commit hash of `ref` in this clone."""
    commit = commit_of(ref)
    if commit is None:
        raise ReleaseBuildError(
            f"the previous release {ref!r} is not in this clone (a shallow clone?). Fix: "
            f"`git fetch --unshallow` (or fetch that commit/tag), or set {RELEASE_ENV} to a "
            "release commit or tag this clone has."
        )
    return commit


def release_dir(commit: str) -> Path:
    return tool_dir("reconciler-release", commit[:12])


def python_of(folder: Path) -> Path:
    return folder / "venv" / "bin" / "python"


def build(ref: str | None = None) -> Path:
    """The python of a venv holding the release at `ref` (built now unless cached)."""
    commit = resolve(wanted_ref(ref))
    folder = release_dir(commit)
    build_once(folder, lambda into: _build_into(into, commit))
    return python_of(folder)


def build_once(folder: Path, make: Callable[[Path], None]) -> None:
    """`make(folder)` into a fresh `folder` unless an earlier build completed it. One build of
    a folder at a time: a second process (another test run) waits for the first one's."""
    if is_complete(folder):
        return
    lock_path = folder.parent / f".{folder.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_complete(folder):
            make(fresh_dir(folder))
            mark_complete(folder)


def run_step(
    command: list[str], what: str, timeout_s: float = BUILD_TIMEOUT_S, **kwargs: Any
) -> None:
    """One build step; `ReleaseBuildError` with the end of its stderr when it fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise ReleaseBuildError(f"{what}: no result within {timeout_s:.0f}s") from exc
    if done.returncode != 0:
        raise ReleaseBuildError(f"{what} failed ({done.returncode}):\n{done.stderr[-2000:]}")


def extract(commit: str, dest: Path) -> None:
    """The files of `commit` (`git archive`, so nothing of this work tree), unpacked in `dest`."""
    with tempfile.TemporaryDirectory(prefix="reconciler-archive-") as scratch:
        archive = Path(scratch) / "source.tar"
        run_step(
            ["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), commit],
            f"git archive {commit}",
        )
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")


def _build_into(folder: Path, commit: str) -> None:
    with tempfile.TemporaryDirectory(prefix="reconciler-release-") as scratch:
        source = Path(scratch) / "source"
        extract(commit, source)
        run_step([sys.executable, "-m", "venv", str(folder / "venv")], "creating the venv")
        pip = [str(python_of(folder)), "-m", "pip", "install", "--quiet"]
        run_step([*pip, "setuptools>=68", "wheel"], "installing the build backend")
        # No build isolation: its env would install mypy for a build that compiles nothing.
        run_step(
            [*pip, "--no-build-isolation", str(source)],
            f"installing the release {commit[:12]}",
            env=os.environ | {"RECONCILER_PURE": "1"},
            cwd=scratch,
        )
    (folder / "release.json").write_text(json.dumps({"commit": commit}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", help=f"commit or tag (default: ${RELEASE_ENV}, else the last)")
    args = parser.parse_args(argv)
    try:
        print(build(args.ref))
    except ReleaseBuildError as exc:
        print(f"previous_release: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
