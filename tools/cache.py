"""Where downloaded and built tools live: outside the clone, one folder per tool and version.

Like Maven's ~/.m2, the cache is shared by every clone on the machine, so a second fresh clone
reuses the broker jars, Helm, kubernetes-validate and the registry instead of fetching them
again. `RECONCILER_CACHE` overrides the root (default `$XDG_CACHE_HOME/reconciler`, else
`~/.cache/reconciler`). A folder is complete once its `.complete` marker exists: an install
cut half-way is redone, never used.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def cache_root() -> Path:
    explicit = os.environ.get("RECONCILER_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "reconciler"


def tool_dir(name: str, version: str) -> Path:
    """The cache folder of one tool at one version, e.g. ~/.cache/reconciler/tools/helm-4.3.2."""
    return cache_root() / "tools" / f"{name}-{version}"


def is_complete(folder: Path) -> bool:
    return (folder / ".complete").exists()


def mark_complete(folder: Path) -> None:
    (folder / ".complete").touch()


def fresh_dir(folder: Path) -> Path:
    """An empty folder in place of a half-made one (an interrupted earlier install)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder
