"""One test per lifecycle behaviour of issue 10 that was wrong; each failed on the code before."""

from __future__ import annotations

import pytest

from engine.core.events import (
    AckOutcome,
    AckSource,
    Decision,
    Event,
    Reason,
    Verdict,
)
from engine.core.fold import fold, replay
from engine.core.state import Health
from tests.unit.core.builders import ack, intent, msg, record, resume

U, A, B = msg("hello"), msg("answer"), msg("more")
BEFORE = [U]
BATCH = [A]


def _by_id(decisions: list[Decision]) -> dict[str, Decision]:
    return {d.decision_id: d for d in decisions}


@pytest.mark.parametrize("source", list(AckSource))
def test_definite_failure_then_granted_retry_does_not_lock_the_session(source: AckSource) -> None:
    events: list[Event] = [
        intent("e1", BATCH, BEFORE),
        ack("a1", AckOutcome.NOT_WRITTEN, source=source),
        resume("q1", record(BATCH, BEFORE), BEFORE, runner="r2"),
        intent("e2", BATCH, BEFORE, runner="r2", fence=2, t=100_100),
        ack("a2", AckOutcome.COMMITTED, runner="r2", fence=2, t=100_200),
        intent(
            "e3", [B], [*BEFORE, *BATCH], intent_id="i2", runner="r2", fence=2, seq=2, t=100_300
        ),
    ]
    answers = _by_id(replay(events))
    assert answers["q1"].verdict is Verdict.APPEND_ONCE
    assert answers["q1"].fence_token == 2
    assert answers["e2"].verdict is Verdict.RECORDED
    assert (answers["a2"].verdict, answers["a2"].reason) == (Verdict.RECORDED, Reason.ACCEPTED)
    assert not answers["a2"].alert
    assert (answers["e3"].verdict, answers["e3"].reason) == (Verdict.RECORDED, Reason.ACCEPTED)


def test_definite_failure_then_own_retry_opens_a_new_attempt() -> None:
    events: list[Event] = [
        intent("e1", BATCH, BEFORE),
        ack("a1", AckOutcome.NOT_WRITTEN),
        intent("e2", BATCH, BEFORE, t=1_200),
        ack("a2", AckOutcome.COMMITTED, t=1_300),
        intent("e3", [B], [*BEFORE, *BATCH], intent_id="i2", seq=2, t=1_400),
    ]
    answers = _by_id(replay(events))
    assert answers["a2"].reason is Reason.ACCEPTED
    assert not answers["a2"].alert
    assert answers["e3"].reason is Reason.ACCEPTED


def test_old_attempt_store_commit_after_new_grant_is_a_violation() -> None:
    late = ack("a9", AckOutcome.COMMITTED, source=AckSource.STORE, fence=None, t=100_050)
    late = late.model_copy(update={"fence_token": 0})
    events: list[Event] = [
        intent("e1", BATCH, BEFORE),
        ack("a1", AckOutcome.UNKNOWN),
        resume("q1", record(BATCH, BEFORE), BEFORE, runner="r2"),
        late,
    ]
    answers = _by_id(replay(events))
    assert answers["q1"].verdict is Verdict.APPEND_ONCE
    assert answers["a9"].reason is Reason.LATE_APPEND
    assert answers["a9"].alert


@pytest.mark.parametrize(
    "record_before",
    [None, [], [msg("edited")]],
    ids=["before-null", "before-truncated", "before-edited"],
)
def test_resume_record_is_checked_against_the_intent_after_it_resolved(
    record_before: list[dict[str, str]] | None,
) -> None:
    events: list[Event] = [
        intent("e1", BATCH, BEFORE),
        ack("a1", AckOutcome.COMMITTED, source=AckSource.STORE),
        resume("q1", record(BATCH, record_before), [*BEFORE, *BATCH], runner="r2"),
    ]
    answer = replay(events)[-1]
    assert (answer.verdict, answer.reason) == (Verdict.WITHHELD, Reason.RECORD_MISMATCH)
    assert answer.alert


def test_append_acknowledged_claim_without_engine_evidence_is_not_trusted() -> None:
    # (T,T): the tail is before + batch and also ends with before; only the claim says committed.
    events: list[Event] = [
        intent("e1", [U], [U]),
        resume("q1", record([U], [U], acknowledged=True), [U, U], runner="r2"),
    ]
    answer = replay(events)[-1]
    assert answer.verdict is Verdict.WITHHELD
    assert answer.alert


def test_append_acknowledged_claim_contradicted_by_tail_withholds() -> None:
    events: list[Event] = [
        intent("e1", BATCH, BEFORE),
        resume("q1", record(BATCH, BEFORE, acknowledged=True), BEFORE, runner="r2"),
    ]
    answer = replay(events)[-1]
    assert answer.verdict is Verdict.WITHHELD
    assert answer.alert


def test_append_acknowledged_claim_proven_by_tail_continues() -> None:
    events: list[Event] = [
        intent("e1", BATCH, BEFORE),
        resume("q1", record(BATCH, BEFORE, acknowledged=True), [*BEFORE, *BATCH], runner="r2"),
    ]
    assert replay(events)[-1].verdict is Verdict.CONTINUE


def test_parked_partial_ack_alerts_when_its_intent_arrives() -> None:
    two = [A, B]
    events: list[Event] = [
        ack("a1", AckOutcome.COMMITTED, source=AckSource.STORE, count=1),
        intent("e1", two, BEFORE),
    ]
    decisions = replay(events)
    answers = _by_id(decisions)
    assert answers["a1"].reason is Reason.PARKED
    final = answers["a1/final"]
    assert (final.reason, final.alert) == (Reason.PARTIAL_COMMIT, True)
    assert sum(d.alert for d in decisions) == 1


def test_every_transition_out_of_clear_alerts_exactly_once() -> None:
    events: list[Event] = [
        intent("e1", BATCH, BEFORE),
        ack("a1", AckOutcome.COMMITTED, source=AckSource.STORE),
        ack("a2", AckOutcome.NOT_WRITTEN, source=AckSource.STORE, t=1_200),
        ack("a3", AckOutcome.NOT_WRITTEN, source=AckSource.STORE, t=1_300),
    ]
    decisions = replay(events)
    assert [d.alert for d in decisions] == [False, False, True, False]
    assert _health_after(events) is Health.AMBIGUOUS


def _health_after(events: list[Event]) -> Health:
    state = None
    for position, event in enumerate(events):
        state = fold(state, event, position).state
    assert state is not None
    return state.health
