"""The local state store of one partition task: an SQLite file per (topic prefix, partition).

Why SQLite: it is in the standard library (no server, no extra dependency), a write batch and
the changelog offset it reflects commit in one atomic transaction, it survives kill -9 (WAL),
and lookups by session id are a primary-key read. The store is a cache of the compacted
changelog topic, never the source of truth.

Invariant: the store never leads Kafka. It is written only after the Kafka transaction that
produced the same changelog records committed (commit protocol step 6), together with the
highest changelog offset those records reached. On start, restore reads the changelog from
that offset + 1 (the delta) instead of from the beginning. Step 6 writes through
`apply_lazily`: the writes of several commits reach the disk in one SQLite transaction (at most
`SYNC_AFTER_S` later, or at close), so a crash can leave the store further behind, never ahead.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from engine.runtime.tasks.store_sql import (
    SCHEMA,
    SET_OFFSET,
    SET_OFFSET_AND_WATERMARK,
    UPSERT,
)

NO_OFFSET = -1
SYNC_AFTER_S = 1.0
"""How long the writes of `apply_lazily` may wait for their disk commit: at most this much
more changelog to read on a restart after a crash."""
log = logging.getLogger("reconciler.store")
DEFAULT_CACHE_KIB = 2_048  # SQLite's own default page cache
GET_MANY_CHUNK = 500  # well under SQLite's bound on a statement's parameters (32,766)


class StoreWrite(NamedTuple):
    """One session's new state (None deletes it) and its unresolved pending write, if any.
    A NamedTuple: immutable like a frozen dataclass, built several times faster (one per
    changed session per commit, and per record on restore)."""

    session_id: str
    state: bytes | None
    pending_status: str | None = None
    pending_since_ms: int | None = None
    health: str | None = None  # AMBIGUOUS or VIOLATED; None when CLEAR
    park_deadline_ms: int | None = None  # `engine.core.watermark.park_deadline`
    watermark_ms: int | None = None  # the partition's intents watermark when it was written


class LocalStore:
    """Session states (encoded changelog values) plus the changelog offset they reflect."""

    def __init__(
        self, path: Path, cache_kib: int = DEFAULT_CACHE_KIB, sync_after_s: float = SYNC_AFTER_S
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.sync_after_s = sync_after_s
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"PRAGMA cache_size=-{max(64, int(cache_kib))}")  # negative: KiB
        self._db.executescript(SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(sessions)")}
        if "health" not in columns:  # a store made before the column existed
            self._db.execute("ALTER TABLE sessions ADD COLUMN health TEXT")
        if "park_deadline_ms" not in columns:
            self._db.execute("ALTER TABLE sessions ADD COLUMN park_deadline_ms INTEGER")
        # After the ALTER: an index on a column that does not exist yet would fail.
        self._db.execute(
            "CREATE INDEX IF NOT EXISTS sessions_parked ON sessions(park_deadline_ms)"
            " WHERE park_deadline_ms IS NOT NULL"
        )
        self._offset: int | None = None  # changelog_offset(), read once, then kept up to date
        # watermark() and next_park_deadline() as last read, until a write: step 6 asks both
        # after each commit, of every partition (a query each cost more than its write).
        self._marks: dict[str, int | None] = {}
        self._lazy_since: float | None = None  # when the open batch of `apply_lazily` began
        self._poisoned = False  # a lazy write failed half-way: never commit that batch

    def changelog_offset(self) -> int:
        """The highest changelog offset whose record is applied here (NO_OFFSET: none)."""
        if self._offset is None:
            row = self._db.execute("SELECT value FROM meta WHERE key='changelog_offset'").fetchone()
            self._offset = int(row[0]) if row is not None else NO_OFFSET
        return self._offset

    def watermark(self) -> int | None:
        """The partition's intents watermark as of the applied changelog (None: never set)."""
        if "watermark" not in self._marks:
            row = self._db.execute("SELECT value FROM meta WHERE key='watermark'").fetchone()
            self._marks["watermark"] = int(row[0]) if row is not None else None
        return self._marks["watermark"]

    def parked_due(self, watermark: int, after: int | None = None) -> list[str]:
        """Sessions whose earliest parked resume is due at `watermark`, past `after` if given
        (an index range)."""
        rows = self._db.execute(
            "SELECT session_id FROM sessions WHERE park_deadline_ms <= ? AND park_deadline_ms > ?"
            " ORDER BY session_id",
            (watermark, after if after is not None else -(2**62)),
        )
        return [str(row[0]) for row in rows]

    def next_park_deadline(self, after: int | None = None) -> int | None:
        """The earliest park deadline stored (past `after`, if given): None when none."""
        if after is None and "deadline" in self._marks:
            return self._marks["deadline"]
        row = self._db.execute(
            "SELECT MIN(park_deadline_ms) FROM sessions WHERE park_deadline_ms > ?",
            (after if after is not None else -(2**62),),
        ).fetchone()
        earliest = int(row[0]) if row is not None and row[0] is not None else None
        if after is None:
            self._marks["deadline"] = earliest
        return earliest

    def get(self, session_id: str) -> bytes | None:
        row = self._db.execute(
            "SELECT state FROM sessions WHERE session_id=?", (session_id,)
        ).fetchone()
        return bytes(row[0]) if row is not None else None

    def get_many(self, session_ids: Collection[str]) -> dict[str, bytes | None]:
        """`get` of many sessions in a few queries (None: not stored): a query per session cost
        ~6 us of Python each, an IN list ~1.5 us per session."""
        found: dict[str, bytes | None] = dict.fromkeys(session_ids)
        wanted = list(found)
        for start in range(0, len(wanted), GET_MANY_CHUNK):
            chunk = wanted[start : start + GET_MANY_CHUNK]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT session_id, state FROM sessions WHERE session_id IN ({marks})"
            for session_id, state in self._db.execute(query, chunk):
                found[str(session_id)] = bytes(state)
        return found

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
        """Write states (None deletes) and the changelog offset in one atomic transaction,
        durable on return (an open batch of `apply_lazily` is committed first); the watermark
        kept is the highest any write carries (it never falls)."""
        with self._transaction():
            self._write(writes, changelog_offset)

    def apply_lazily(self, writes: Iterable[StoreWrite], changelog_offset: int) -> None:
        """`apply`, but committed to disk with the next writes up to `sync_after_s` later, or
        at `sync`/`close`: commit protocol step 6, whose writes are all of committed Kafka
        transactions. This connection reads them at once; a crash loses the open batch as a
        whole, so the store stays a consistent, older copy (restore reads the difference).
        Why: a commit rewrites every page a changed session sits on; committing ten Kafka
        transactions' writes at once costs about half the CPU per row (pages shared, one WAL
        write of each)."""
        if self._poisoned:
            raise sqlite3.OperationalError("an earlier write failed: close this store")
        if self._lazy_since is None:
            self._db.execute("BEGIN IMMEDIATE")
            self._lazy_since = time.monotonic()
        try:
            self._write(writes, changelog_offset)
        except BaseException:
            self._poisoned = True  # part of this batch may be written: only a rollback is safe
            raise
        if time.monotonic() - self._lazy_since >= self.sync_after_s:
            self.sync()

    def sync(self) -> None:
        """Commit what `apply_lazily` has written (nothing to do if nothing is open)."""
        if self._lazy_since is not None and not self._poisoned:
            try:
                self._db.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back on its own: later writes would run outside any
                # transaction and the kept offset may be ahead of the disk.
                self._poisoned = True
                self._offset = None
                self._marks.clear()
                raise
            self._lazy_since = None

    def sync_if_due(self, now: float) -> None:
        """`sync` when the open batch is `sync_after_s` old: a partition that gets no more
        writes while the loop stays busy with others would otherwise keep its batch open."""
        if self._lazy_since is not None and now - self._lazy_since >= self.sync_after_s:
            self.sync()

    def _write(self, writes: Iterable[StoreWrite], changelog_offset: int) -> None:
        # One executemany per kind: a statement per row cost a few us of Python each. The last
        # write of a session wins (a restore batch can name one twice), so upserts and deletes
        # touch distinct sessions and their order does not matter.
        last: dict[str, StoreWrite] = {}
        watermark: int | None = None
        for write in writes:
            last[write.session_id] = write
            if write.watermark_ms is not None:
                mark = write.watermark_ms
                watermark = mark if watermark is None else max(watermark, mark)
        upserts = [w[:6] for w in last.values() if w.state is not None]  # the row's columns
        deletes = [(w.session_id,) for w in last.values() if w.state is None]
        known, stored = "watermark" in self._marks, self._marks.get("watermark")
        self._offset = None  # read again if this raises half-way
        self._marks.clear()
        if deletes:
            self._db.executemany("DELETE FROM sessions WHERE session_id=?", deletes)
        if upserts:
            self._db.executemany(UPSERT, upserts)
        if watermark is None:
            self._db.execute(SET_OFFSET, (changelog_offset,))
        else:  # one statement for both: the watermark never falls
            self._db.execute(SET_OFFSET_AND_WATERMARK, (changelog_offset, watermark))
            stored = watermark if stored is None else max(stored, watermark)
        self._offset = changelog_offset
        if known:  # what the meta row now holds, without reading it back
            self._marks["watermark"] = stored

    def wipe(self) -> None:
        """Forget everything (the changelog was recreated or is behind us): rebuild from it."""
        with self._transaction():
            self._db.execute("DELETE FROM sessions")
            self._db.execute("DELETE FROM meta")
            self._offset = NO_OFFSET
            self._marks.clear()

    def abandon(self) -> None:
        """Close without committing the open lazy batch: what a crash does to it. For
        embeddings that drop an engine without stopping it (tests): its open batch would
        otherwise hold SQLite's write lock until the connection is garbage-collected."""
        self._db.close()

    def close(self) -> None:
        """Commits the open lazy batch first (its writes are all of committed Kafka
        transactions), unless a write of it failed; a failing disk only costs a longer restore."""
        try:
            self.sync()
        except sqlite3.Error as exc:
            log.warning("local store %s: the last writes are not kept (%s)", self.path, exc)
        self._db.close()

    def _transaction(self) -> _Transaction:
        return _Transaction(self)


class _Transaction:
    """Atomic and durable: an open lazy batch is committed first, so a rollback here only ever
    drops this transaction's own writes."""

    def __init__(self, store: LocalStore) -> None:
        self._store = store

    def __enter__(self) -> None:
        if self._store._poisoned:
            raise sqlite3.OperationalError("an earlier write failed: close this store")
        self._store.sync()
        self._store._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self._store._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        except BaseException:
            self._store._offset = None  # the kept offset may be ahead of the disk
            self._store._marks.clear()
            raise
        if exc_type is not None:
            self._store._offset = None
            self._store._marks.clear()
