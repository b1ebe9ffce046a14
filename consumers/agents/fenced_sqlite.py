"""A store-side fence for openai-agents' own `SQLiteSession`.

An APPEND_ONCE grant is only safe if a late copy of the old append cannot land after it. This
adapter keeps the session's current fence token in the same SQLite database as the history and
checks it in the same write transaction as the append:

    BEGIN IMMEDIATE                       -- takes the database write lock (all processes)
    SELECT token FROM fences WHERE session_id = ?
    carried < token  -> ROLLBACK, raise StaleFenceError (nothing written)
    otherwise        -> token := carried; INSERT the items; COMMIT

A failure before COMMIT raises `StoreRolledBackError` (an `AppendNotWrittenError`): the
wrapper then tells the engine NOT_WRITTEN, definite evidence the batch is absent.

Invariants: the stored token never decreases; an append carrying a token older than the stored
one never writes anything. `claim_fence` stores a newly granted token before any append, so a
fenced-out copy is refused even if the new holder has not appended yet.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from agents import SQLiteSession
from agents.items import TResponseInputItem

from consumers.errors import StaleFenceError, StoreRolledBackError

FENCES_TABLE = "reconciler_fences"


class FencedSQLiteSession(SQLiteSession):
    """`SQLiteSession` whose appends carry ``fence_token`` and are refused when it is stale."""

    store_enforces_fence = True
    """Read by `ReconciledSession` to bind the session with ``store_enforces_fence=True``."""

    def __init__(
        self, session_id: str, db_path: str | Path = ":memory:", *, fence_token: int = 0, **kw: Any
    ) -> None:
        super().__init__(session_id, db_path, **kw)
        self.fence_token = fence_token
        with self._locked_connection() as conn:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {FENCES_TABLE} "
                "(session_id TEXT PRIMARY KEY, token INTEGER NOT NULL)"
            )
            conn.commit()

    def _check_and_store(self, conn: sqlite3.Connection, carried: int) -> None:
        """Inside an open write transaction: refuse a stale token, else store it (max)."""
        row = conn.execute(
            f"SELECT token FROM {FENCES_TABLE} WHERE session_id = ?", (self.session_id,)
        ).fetchone()
        current = int(row[0]) if row is not None else 0
        if carried < current:
            raise StaleFenceError(session_id=self.session_id, carried=carried, current=current)
        if carried > current:
            conn.execute(
                f"INSERT INTO {FENCES_TABLE} (session_id, token) VALUES (?, ?) "
                "ON CONFLICT(session_id) DO UPDATE SET token = excluded.token",
                (self.session_id, carried),
            )

    def stored_fence(self) -> int:
        """The token the store currently enforces (0: none granted yet)."""
        with self._locked_connection() as conn:
            row = conn.execute(
                f"SELECT token FROM {FENCES_TABLE} WHERE session_id = ?", (self.session_id,)
            ).fetchone()
            conn.commit()
        return int(row[0]) if row is not None else 0

    def claim_fence(self, token: int) -> None:
        """Store a newly granted token now and carry it from here on.

        Raises `StaleFenceError` if the store already enforces a newer one (this grant is old).
        """
        with self._write_connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            self._check_and_store(conn, token)
            conn.commit()
        self.fence_token = token

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in one SQLite transaction that first checks this session's fence token;
        `StaleFenceError` when the store holds a newer one, `StoreRolledBackError` when the
        transaction failed before COMMIT (nothing of the batch was written)."""
        self._check_not_closed()
        if not items:
            return
        carried = self.fence_token

        def append() -> None:
            with self._write_connection() as conn:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    self._check_and_store(conn, carried)
                    self._insert_items(conn, items)
                except StaleFenceError:
                    raise
                except Exception as exc:
                    # Before COMMIT: _write_connection rolls the transaction back, so nothing
                    # of the batch is in the Session. A failing COMMIT stays an unknown outcome.
                    raise StoreRolledBackError(
                        session_id=self.session_id, detail=repr(exc)[:200]
                    ) from exc
                conn.commit()

        await asyncio.to_thread(append)
