"""The local state store of one partition task: an SQLite file per (topic prefix, partition).

Why SQLite: it is in the standard library (no server, no extra dependency), a write batch and
the changelog offset it reflects commit in one atomic transaction, it survives kill -9 (WAL),
and lookups by session id are a primary-key read. The store is a cache of the compacted
changelog topic, never the source of truth.

Invariant: the store never leads Kafka. It is written only after the Kafka transaction that
produced the same changelog records committed (commit protocol step 6), together with the
highest changelog offset those records reached. On start, restore reads the changelog from
that offset + 1 (the delta) instead of from the beginning.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    state BLOB NOT NULL,
    pending_status TEXT,        -- status of an unresolved pending write, else NULL
    pending_since_ms INTEGER,   -- event time it became unresolved
    health TEXT                 -- AMBIGUOUS or VIOLATED, else NULL (CLEAR)
);
CREATE INDEX IF NOT EXISTS sessions_pending ON sessions(pending_status)
    WHERE pending_status IS NOT NULL;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
NO_OFFSET = -1
DEFAULT_CACHE_KIB = 2_048  # SQLite's own default page cache


@dataclass(frozen=True, slots=True)
class StoreWrite:
    """One session's new state (None deletes it) and its unresolved pending write, if any."""

    session_id: str
    state: bytes | None
    pending_status: str | None = None
    pending_since_ms: int | None = None
    health: str | None = None  # AMBIGUOUS or VIOLATED; None when CLEAR


class LocalStore:
    """Session states (encoded changelog values) plus the changelog offset they reflect."""

    def __init__(self, path: Path, cache_kib: int = DEFAULT_CACHE_KIB) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"PRAGMA cache_size=-{max(64, int(cache_kib))}")  # negative: KiB
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(sessions)")}
        if "health" not in columns:  # a store made before the column existed
            self._db.execute("ALTER TABLE sessions ADD COLUMN health TEXT")

    def changelog_offset(self) -> int:
        """The highest changelog offset whose record is applied here (NO_OFFSET: none)."""
        row = self._db.execute("SELECT value FROM meta WHERE key='changelog_offset'").fetchone()
        return int(row[0]) if row is not None else NO_OFFSET

    def get(self, session_id: str) -> bytes | None:
        row = self._db.execute(
            "SELECT state FROM sessions WHERE session_id=?", (session_id,)
        ).fetchone()
        return bytes(row[0]) if row is not None else None

    def items(self) -> Iterator[tuple[str, bytes]]:
        for session_id, state in self._db.execute("SELECT session_id, state FROM sessions"):
            yield str(session_id), bytes(state)

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])

    def pending_since(self, session_id: str) -> int | None:
        row = self._db.execute(
            "SELECT pending_since_ms FROM sessions WHERE session_id=?", (session_id,)
        ).fetchone()
        return int(row[0]) if row is not None and row[0] is not None else None

    def pending_summary(self) -> dict[str, tuple[int, int]]:
        """Unresolved pending writes: status -> (count, oldest since_ms)."""
        rows = self._db.execute(
            "SELECT pending_status, COUNT(*), MIN(pending_since_ms) FROM sessions "
            "WHERE pending_status IS NOT NULL GROUP BY pending_status"
        )
        return {str(status): (int(count), int(oldest or 0)) for status, count, oldest in rows}

    def health_summary(self) -> dict[str, int]:
        """Sessions whose health is not CLEAR: health -> count."""
        rows = self._db.execute(
            "SELECT health, COUNT(*) FROM sessions WHERE health IS NOT NULL GROUP BY health"
        )
        return {str(health): int(count) for health, count in rows}

    def apply(self, writes: Iterable[StoreWrite], changelog_offset: int) -> None:
        """Write states (None deletes) and the changelog offset in one atomic transaction."""
        with self._transaction():
            for write in writes:
                if write.state is None:
                    self._db.execute("DELETE FROM sessions WHERE session_id=?", (write.session_id,))
                else:
                    self._db.execute(
                        "INSERT OR REPLACE INTO sessions"
                        "(session_id, state, pending_status, pending_since_ms, health)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (
                            write.session_id,
                            write.state,
                            write.pending_status,
                            write.pending_since_ms,
                            write.health,
                        ),
                    )
            self._db.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('changelog_offset', ?)",
                (changelog_offset,),
            )

    def wipe(self) -> None:
        """Forget everything (the changelog was recreated or is behind us): rebuild from it."""
        with self._transaction():
            self._db.execute("DELETE FROM sessions")
            self._db.execute("DELETE FROM meta")

    def close(self) -> None:
        self._db.close()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
