"""The store-side fence: a stale token never writes, in the same transaction as the append."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from consumers.agents.fenced_sqlite import FencedSQLiteSession
from consumers.errors import (
    AppendNotWrittenError,
    ReconcilerClientError,
    StaleFenceError,
    StoreRolledBackError,
)

ITEM: Any = {"type": "function_call_output", "call_id": "charge-1", "output": "receipt-7"}


def items_of(session: FencedSQLiteSession) -> list[object]:
    return list(asyncio.run(session.get_items()))


def test_two_appenders_the_older_token_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    old = FencedSQLiteSession("s1", db)  # the fenced-out copy still carries token 0
    new = FencedSQLiteSession("s1", db)
    new.claim_fence(7)
    with pytest.raises(StaleFenceError) as caught:
        asyncio.run(old.add_items([ITEM]))
    assert (caught.value.carried, caught.value.current) == (0, 7)
    assert isinstance(caught.value, ReconcilerClientError)
    assert items_of(new) == []
    asyncio.run(new.add_items([ITEM]))
    assert items_of(old) == [ITEM]
    assert new.stored_fence() == 7


def test_a_late_append_after_the_new_holder_wrote_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    first, second = FencedSQLiteSession("s1", db, fence_token=3), FencedSQLiteSession("s1", db)
    asyncio.run(first.add_items([ITEM]))
    second.claim_fence(4)
    asyncio.run(second.add_items([ITEM]))
    with pytest.raises(StaleFenceError):
        asyncio.run(first.add_items([ITEM]))
    assert items_of(second) == [ITEM, ITEM]


def test_claiming_an_older_token_than_the_store_is_refused(tmp_path: Path) -> None:
    session = FencedSQLiteSession("s1", tmp_path / "s.db")
    session.claim_fence(9)
    with pytest.raises(StaleFenceError):
        session.claim_fence(8)
    assert session.stored_fence() == 9
    assert session.fence_token == 9


def test_a_newer_carried_token_advances_the_store_and_fences_are_per_session(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    a, b = FencedSQLiteSession("a", db, fence_token=5), FencedSQLiteSession("b", db)
    asyncio.run(a.add_items([ITEM]))
    asyncio.run(b.add_items([ITEM]))  # session b has no fence yet: token 0 is current
    assert (a.stored_fence(), b.stored_fence()) == (5, 0)


def test_fence_and_history_live_in_the_same_database(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    session = FencedSQLiteSession("s1", db)
    session.claim_fence(2)
    asyncio.run(session.add_items([ITEM]))
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"reconciler_fences", "agent_messages"} <= tables


def test_in_memory_database_is_fenced_too() -> None:
    session = FencedSQLiteSession("s1")
    session.claim_fence(1)
    session.fence_token = 0  # simulate a copy that kept an old token
    with pytest.raises(StaleFenceError):
        asyncio.run(session.add_items([ITEM]))
    assert items_of(session) == []


class _FailingInsert(FencedSQLiteSession):
    def _insert_items(self, conn: sqlite3.Connection, items: list[Any]) -> None:
        super()._insert_items(conn, items)
        raise sqlite3.OperationalError("disk I/O error")


def test_a_failure_inside_the_transaction_rolls_back_and_says_not_written(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    failing = _FailingInsert("s1", db, fence_token=4)
    with pytest.raises(AppendNotWrittenError) as caught:
        asyncio.run(failing.add_items([ITEM, ITEM]))
    assert isinstance(caught.value, StoreRolledBackError)
    plain = FencedSQLiteSession("s1", db)
    assert items_of(plain) == []
    assert plain.stored_fence() == 0  # the token update rolled back with the rows
