"""What an on-call engineer reads: zero-initialised counters, sessions by health from the local
stores (also after a restore), and the structured operator log lines."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from engine import oplog
from engine.core.decide import decide
from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Reason,
    RepairEvent,
    RepairResolution,
    Verdict,
)
from engine.core.state import SessionState
from engine.runtime.fold_step import _log_for_operator
from engine.runtime.process.metrics import EngineMetrics
from engine.runtime.tasks.headers import HEALTH_HEADER, pending_header
from engine.runtime.tasks.store import LocalStore, StoreWrite
from engine.wire.errors import DecodeReason


def _value(metrics: EngineMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_counters_have_a_zero_series_for_every_known_label_value() -> None:
    metrics = EngineMetrics()
    for reason in DecodeReason:
        assert _value(metrics, "reconciler_dead_letters_total", reason=reason) == 0.0
    for alert_reason in (Reason.AMBIGUOUS, Reason.GATE_VIOLATION, Reason.BINDING_MISMATCH):
        assert _value(metrics, "reconciler_alerts_total", reason=alert_reason) == 0.0
    assert _value(metrics, "reconciler_transaction_aborts_total", kind="abortable") == 0.0
    assert _value(metrics, "reconciler_sessions_by_health", health="AMBIGUOUS") == 0.0


class _Task:
    partition = 0

    def __init__(self, store: LocalStore) -> None:
        self.store = store


def test_sessions_by_health_counts_the_stores(tmp_path: Path) -> None:
    one, two = LocalStore(tmp_path / "p0.db"), LocalStore(tmp_path / "p1.db")
    one.apply([StoreWrite("a", b"x"), StoreWrite("b", b"x", health="AMBIGUOUS")], 1)
    two.apply([StoreWrite("c", b"x", health="VIOLATED"), StoreWrite("d", b"x")], 1)
    two.apply([StoreWrite("e", b"x", health="AMBIGUOUS")], 2)
    metrics = EngineMetrics()
    metrics.observe_sessions([_Task(one), _Task(two)])
    assert _value(metrics, "reconciler_sessions") == 5
    assert _value(metrics, "reconciler_sessions_by_health", health="AMBIGUOUS") == 2
    assert _value(metrics, "reconciler_sessions_by_health", health="VIOLATED") == 1
    assert _value(metrics, "reconciler_sessions_by_health", health="CLEAR") == 2
    # A repair clears the session: the next write carries no health.
    one.apply([StoreWrite("b", b"y")], 3)
    metrics.observe_sessions([_Task(one), _Task(two)])
    assert _value(metrics, "reconciler_sessions_by_health", health="AMBIGUOUS") == 1


def test_health_rides_the_changelog_header_for_restore() -> None:
    write = StoreWrite("s", b"x", "UNKNOWN", 7, "VIOLATED")
    assert (HEALTH_HEADER, b"VIOLATED") in pending_header(write)
    assert pending_header(StoreWrite("s", b"x")) == []


def test_a_store_made_before_the_health_column_gains_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, state BLOB NOT NULL,"
        " pending_status TEXT, pending_since_ms INTEGER);"
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
        "INSERT INTO sessions VALUES ('old', x'00', NULL, NULL);"
    )
    db.commit()
    db.close()
    store = LocalStore(path)
    store.apply([StoreWrite("new", b"x", health="AMBIGUOUS")], 1)
    assert store.count() == 2
    assert store.health_summary() == {"AMBIGUOUS": 1}


def test_ops_lines_are_one_line_text_or_json(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=oplog.LOGGER):
        oplog.emit("dead_letter", session="s 1", reason="BAD_MAGIC", source="t/0/17")
    (record,) = caplog.records
    assert record.getMessage() == 'dead_letter session="s 1" reason=BAD_MAGIC source=t/0/17'
    line = oplog.JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["event"] == "dead_letter"
    assert parsed["session"] == "s 1"
    assert parsed["source"] == "t/0/17"
    assert parsed["level"] == "WARNING"


@pytest.mark.parametrize(
    ("reason", "line"),
    [(Reason.REPAIRED, "repair_applied"), (Reason.NOTHING_TO_REPAIR, "repair_not_applied")],
)
def test_a_repair_is_logged_applied_only_when_it_changed_the_session(
    caplog: pytest.LogCaptureFixture, reason: Reason, line: str
) -> None:
    repair = RepairEvent(
        event_id="rp-1",
        session_id="s-1",
        event_time_ms=5,
        resolution=RepairResolution.ACCEPT_ABSENT,
        actor="ops",
        reason="checked the store",
    )
    answer = decide(SessionState(session_id="s-1"), repair, Verdict.RECORDED, reason)
    with caplog.at_level(logging.INFO, logger=oplog.LOGGER):
        _log_for_operator(repair, (answer,), "t/0/3")
    (record,) = caplog.records
    assert record.getMessage().split()[0] == line
    assert f"outcome={reason.value}" in record.getMessage()


def test_fold_counts_are_published_once_per_batch_by_flush() -> None:
    metrics = EngineMetrics()
    state = SessionState(session_id="s1")
    ack = AckEvent(
        event_id="s1/a",
        session_id="s1",
        event_time_ms=1,
        intent_id="w1",
        runner_id="r1",
        outcome=AckOutcome.UNKNOWN,
        source=AckSource.RUNNER,
    )
    alerting = decide(state, ack, Verdict.WITHHELD, Reason.AMBIGUOUS, alert=True)
    conflict = decide(state, ack, Verdict.WITHHELD, Reason.HELD_BY_OTHER)
    for _ in range(3):
        metrics.count_fold("intents", "ack", [alerting, conflict])
    assert _value(metrics, "reconciler_events_total", topic="intents", kind="ack") is None
    metrics.flush()
    metrics.flush()  # a flush publishes each tally once
    assert _value(metrics, "reconciler_events_total", topic="intents", kind="ack") == 3
    decisions = "reconciler_decisions_total"
    assert _value(metrics, decisions, verdict="WITHHELD", reason="AMBIGUOUS") == 3
    assert _value(metrics, "reconciler_alerts_total", reason=Reason.AMBIGUOUS) == 3
    assert _value(metrics, "reconciler_lease_conflicts_total") == 3
    assert _value(metrics, "reconciler_gate_violations_total") == 0


class _Consumer:
    """position() and watermarks of a consumer that has no cached fetch response yet."""

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 40) for tp in partitions]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        return (-1001, -1001) if cached else (0, 100)


def test_lag_is_asked_from_the_broker_when_nothing_is_cached(tmp_path: Path) -> None:
    metrics = EngineMetrics()
    tasks = {0: _Task(LocalStore(tmp_path / "p0.db")), 1: _Task(LocalStore(tmp_path / "p1.db"))}
    metrics.maybe_observe_lag(_Consumer(), tasks, ["t.intents", "t.acks"])  # type: ignore[arg-type]
    assert _value(metrics, "reconciler_consumer_lag", topic="t.intents") == 120  # 2 x (100 - 40)
    assert _value(metrics, "reconciler_consumer_lag", topic="t.acks") == 120
