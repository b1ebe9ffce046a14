"""A local store that cannot be read: which SQLite errors say so, the error that names the
partitions, and the wipe. The store is a copy of the changelog, so a corrupted one is deleted
and restored from the changelog's beginning (COMMIT_PROTOCOL.md, "A corrupted store")."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from engine.runtime.tasks.store import LocalStore

# SQLite's primary result codes for a file whose bytes are not a database it wrote: a page
# that fails its checks (SQLITE_CORRUPT) or a header that is not SQLite's (SQLITE_NOTADB).
# A full disk, a lock or an I/O error (OperationalError) is not corruption: a wipe would not
# help, and those still rejoin with a backoff.
CORRUPT_CODES = frozenset({11, 26})
STORE_FILE_SUFFIXES = ("", "-wal", "-shm", "-journal")


class StoreCorruptedError(sqlite3.DatabaseError):
    """The local stores of `causes` (partition -> what SQLite said) cannot be read. A subclass
    of sqlite3.DatabaseError: a path that does not handle it rejoins, as for any store error."""

    def __init__(self, causes: Mapping[int, str]) -> None:
        self.causes = dict(causes)
        named = ", ".join(f"partition {p}: {why}" for p, why in sorted(self.causes.items()))
        super().__init__(f"local store unreadable ({named})")


def is_corruption(exc: BaseException) -> bool:
    if isinstance(exc, StoreCorruptedError):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.DatabaseError)
        and code is not None
        and code & 0xFF in (CORRUPT_CODES)
    )


def cause_of(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def corrupted(partition: int, exc: sqlite3.DatabaseError) -> StoreCorruptedError | None:
    """`exc` as a StoreCorruptedError naming `partition` when it says the store is corrupted
    (the one it is, if it is one already); None for any other error."""
    if isinstance(exc, StoreCorruptedError):
        return exc
    return StoreCorruptedError({partition: cause_of(exc)}) if is_corruption(exc) else None


def reraise(partition: int, exc: sqlite3.DatabaseError) -> NoReturn:
    """Raise `exc`, as a StoreCorruptedError naming `partition` when it is corruption."""
    found = corrupted(partition, exc)
    if found is None or found is exc:
        raise exc
    raise found from exc


@contextmanager
def detecting(partition: int) -> Iterator[None]:
    """Inside: an SQLite error that says the store is corrupted becomes a StoreCorruptedError
    naming `partition`; every other error passes unchanged."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        reraise(partition, exc)


def wipe_files(path: Path) -> None:
    """Delete the store's file and SQLite's files beside it (a closed store's)."""
    for suffix in STORE_FILE_SUFFIXES:
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def open_store(path: Path, cache_kib: int) -> tuple[LocalStore, str | None]:
    """The store at `path`, and None; or, when its file is not a readable database, an empty
    store in its place and why the old one was wiped."""
    try:
        store = LocalStore(path, cache_kib=cache_kib)
    except sqlite3.DatabaseError as exc:
        if not is_corruption(exc):
            raise
        wipe_files(path)
        return LocalStore(path, cache_kib=cache_kib), cause_of(exc)
    return store, None
