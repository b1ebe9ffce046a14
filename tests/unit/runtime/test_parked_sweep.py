"""The partition task's watermark sweep answers parked acks and fenced intents of a session
that sees no other input, after a restart too (the park deadline is kept in the store)."""

from __future__ import annotations

from pathlib import Path

from msgspec.structs import replace

from engine.core.events import AckOutcome, Reason, Verdict
from engine.core.fold import fold
from engine.core.state import PARK_MS
from engine.runtime.tasks.state_codec import encode_state
from engine.runtime.tasks.store import LocalStore, StoreWrite
from engine.runtime.tasks.task import PartitionTask
from tests.unit.core.builders import ack, intent, msg

A = msg("a")


def test_the_watermark_answers_a_parked_ack_and_a_fenced_intent_once(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "p0.sqlite")
    task = PartitionTask(partition=0, store=store)
    _, first, _ = task.fold(ack("g", AckOutcome.COMMITTED, intent_id="ghost", t=10_000), offset=0)
    _, second, _ = task.fold(intent("f", [A], [], fence=7, t=20_000), offset=0)
    assert [(d.verdict, d.reason) for d in (*first, *second)] == [
        (Verdict.RECORDED, Reason.PARKED),
        (Verdict.RECORDED, Reason.PARKED),
    ]
    # Other sessions' intents move the partition's watermark; s1 sees nothing more.
    other = replace(intent("o1", [A], [], t=10_000 + PARK_MS - 1), session_id="s2")
    task.fold(other, offset=1)
    assert task.expire_overdue() == []  # one millisecond short of the ack's deadline
    task.changelog_records()
    task.persist()
    assert store.parked_due(10_000 + PARK_MS) == ["s1"]
    store.close()  # a stop: step 6's last writes reach the disk

    restarted = PartitionTask(partition=0, store=LocalStore(tmp_path / "p0.sqlite"))
    restarted.fold(replace(other, event_id="o2", event_time_ms=10_000 + PARK_MS), offset=2)
    answers = restarted.expire_overdue()
    assert [(d.decision_id, d.verdict, d.reason) for d, _ in answers] == [
        ("g/final", Verdict.RECORDED, Reason.UNKNOWN_INTENT)
    ]
    restarted.fold(replace(other, event_id="o3", event_time_ms=20_000 + PARK_MS), offset=3)
    answers = restarted.expire_overdue()
    assert [(d.decision_id, d.verdict, d.reason) for d, _ in answers] == [
        ("f/final", Verdict.REJECTED, Reason.UNKNOWN_FENCE)
    ]
    assert restarted.expire_overdue() == []  # answered once
    writes = {w.session_id: w for w in restarted.changelog_records()}
    assert writes["s1"].park_deadline_ms is None


def test_an_ack_parked_before_the_deploy_is_swept_after_its_sessions_next_input(
    tmp_path: Path,
) -> None:
    # The engine of ef6033c (and older) stored no park deadline for a session whose only
    # waiting input is an ack (its rule covered parked resumes only). The new engine does not
    # recompute stored deadlines (SPEC.md §6, "Upgrade"): the watermark passes it by, and the
    # session's next input records the deadline, after which the sweep answers the ack.
    parked = fold(None, ack("g", AckOutcome.COMMITTED, intent_id="ghost", t=10_000), 0).state
    store = LocalStore(tmp_path / "p0.sqlite")
    store.apply([StoreWrite("s1", encode_state(parked))], changelog_offset=0)
    task = PartitionTask(partition=0, store=store)
    other = replace(intent("o1", [A], [], t=10_000 + PARK_MS), session_id="s2")
    task.fold(other, offset=1)
    assert task.expire_overdue() == []  # the old row lists no deadline
    task.fold(intent("i", [A], [], t=10_500), offset=2)  # s1's next input
    answers = task.expire_overdue()
    assert [(d.decision_id, d.verdict, d.reason) for d, _ in answers] == [
        ("g/final", Verdict.RECORDED, Reason.UNKNOWN_INTENT)
    ]
