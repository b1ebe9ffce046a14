"""A Session store whose stored items digest differently from the appended ones, with an
outbox that reports its own appends to the engine as store acks.

Like a server-side conversation store, it adds a field to every item it keeps, so digests of
what a runner reads back never equal the appended ones (``items_digest_stable = False``). Its
outbox keeps, per stored row, the digest of the item as it was appended (in the same SQLite
transaction as the row), and, per append, the tail as of that transaction, which is what its
store ack reports (SPEC.md §6 "Store acks"): a later append of the runner's next batch does not
change it. A foreign rewrite made in the append's transaction (a trigger of another writer)
replaces the row and its digest, so the ack's tail no longer ends with the intent's batch.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from typing import Any

from agents.items import TResponseInputItem

from engine.core.digest import digests, item_digest
from engine.core.events import AckEvent, AckOutcome, AckSource
from tests.unit.consumers.sdk_world import FaultySession

OUTBOX_TABLE = "store_outbox"


def stored_form(item: TResponseInputItem) -> dict[str, Any]:
    """What the store keeps of an appended item: the item plus a status of its own."""
    return {**dict(item), "status": "completed"}


class RewritingStore(FaultySession):
    """The fenced, faulty SQLite store of the runner tests, storing items rewritten."""

    items_digest_stable = False
    """Read by `ReconciledSession`: the session is bound with ``items_digest_stable=False``."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.last_append = 0
        self.appends: list[tuple[int, list[str]]] = []
        """Per append, in order: its item count and the outbox's tail as of its transaction."""
        self.rewrite_in_append: dict[str, Any] | None = None
        """An item another writer puts in place of the last appended one, in that transaction."""
        with self._locked_connection() as conn:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {OUTBOX_TABLE} "
                "(row_id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, digest TEXT)"
            )
            conn.commit()

    def _insert_items(self, conn: sqlite3.Connection, items: list[TResponseInputItem]) -> None:
        super()._insert_items(conn, [stored_form(i) for i in items])  # type: ignore[misc]
        conn.executemany(
            f"INSERT INTO {OUTBOX_TABLE} (session_id, digest) VALUES (?, ?)",
            [(self.session_id, digest) for digest in digests(items, ignore_ids=False)],
        )
        self.last_append = len(items)
        if self.rewrite_in_append is not None:
            self._rewrite_last(conn, self.rewrite_in_append)
            self.rewrite_in_append = None
        rows = conn.execute(
            f"SELECT digest FROM {OUTBOX_TABLE} WHERE session_id = ? ORDER BY row_id DESC LIMIT ?",
            (self.session_id, self.last_append + 1),
        ).fetchall()
        self.appends.append((len(items), [str(row[0]) for row in reversed(rows)]))

    def rewrite_last(self, item: dict[str, Any]) -> None:
        """Someone else replaces the Session's last item (through the store, outbox included)."""
        with self._write_connection() as conn:
            self._rewrite_last(conn, item)
            conn.commit()

    def _rewrite_last(self, conn: sqlite3.Connection, item: dict[str, Any]) -> None:
        conn.execute(
            f"UPDATE {self.messages_table} SET message_data = ? WHERE id = (SELECT MAX(id) "
            f"FROM {self.messages_table} WHERE session_id = ?)",
            (json.dumps(stored_form(item)), self.session_id),  # type: ignore[arg-type]
        )
        conn.execute(
            f"UPDATE {OUTBOX_TABLE} SET digest = ? WHERE row_id = (SELECT MAX(row_id) "
            f"FROM {OUTBOX_TABLE} WHERE session_id = ?)",
            (item_digest(item, ignore_ids=False), self.session_id),
        )

    def commit_ack(self, intent_id: str, at_ms: int, append: int = -1) -> AckEvent:
        """The outbox's COMMITTED ack of an append (default the last), published now with the
        tail as of that append's transaction."""
        count, tail = self.appends[append]
        return AckEvent(
            event_id=uuid.uuid4().hex,
            session_id=self.session_id,
            event_time_ms=at_ms,
            intent_id=intent_id,
            runner_id="",
            outcome=AckOutcome.COMMITTED,
            source=AckSource.STORE,
            fence_token=self.fence_token or None,
            observed_tail=tail,
            committed_count=count,
        )
