"""One test per lifecycle behaviour the core got wrong until 3 December 2026 (fixed by commits
73da209, d57a06a and 9c6b62c); each failed on the code before its fix."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from engine.core.events import (
    AckOutcome,
    AckSource,
    Decision,
    Event,
    IntentKind,
    Reason,
    RunnerAction,
    Verdict,
)
from engine.core.fold import fold, replay
from engine.core.state import PARK_MS, PARKED_LIMIT, Health
from tests.unit.core.builders import BINDING, ack, intent, msg, record, resume

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
    late = replace(late, fence_token=0)
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


STRANGER = msg("someone else")


@pytest.mark.parametrize(
    "tail",
    [
        [*BEFORE, *BATCH, STRANGER],  # another writer appended after our commit
        [*BEFORE],  # our batch was popped
        [*BEFORE, STRANGER],  # rewritten
        [*BEFORE, *BATCH, *BATCH][-2:],  # re-appended: the window no longer starts with before
    ],
    ids=["appended-after", "popped", "rewritten", "re-appended"],
)
@pytest.mark.parametrize("source", list(AckSource))
def test_committed_ack_is_read_together_with_the_resume_tail(
    tail: list[dict[str, str]], source: AckSource
) -> None:
    events: list[Event] = [
        intent("e1", BATCH, BEFORE),
        ack("a1", AckOutcome.COMMITTED, source=source),
        resume("q1", record(BATCH, BEFORE), tail, runner="r2"),
        resume("q2", None, tail, runner="r3", checkpoint="c2", t=300_000),
    ]
    answers = _by_id(replay(events))
    assert (answers["q1"].verdict, answers["q1"].reason) == (
        Verdict.WITHHELD,
        Reason.HISTORY_CHANGED,
    )
    assert answers["q1"].alert
    assert answers["q2"].reason is Reason.SESSION_AMBIGUOUS


def test_committed_ack_with_the_tail_intact_is_do_not_replay() -> None:
    events: list[Event] = [
        intent("e1", BATCH, BEFORE),
        ack("a1", AckOutcome.COMMITTED, source=AckSource.STORE),
        resume("q1", record(BATCH, BEFORE), [*BEFORE, *BATCH], runner="r2"),
    ]
    answer = replay(events)[-1]
    assert (answer.verdict, answer.reason) == (Verdict.CONTINUE, Reason.COMMITTED_BY_STORE)
    assert answer.runner_action is RunnerAction.DO_NOT_REPLAY


UNSTABLE = replace(BINDING, items_digest_stable=False)


def test_digest_unstable_binding_never_grants_append_on_digests_alone() -> None:
    # With no store evidence, a tail that looks unchanged on a backend that rewrites what it
    # stores proves nothing about the batch: the engine asks an operator instead of appending.
    x, y = msg("x"), msg("y")
    events: list[Event] = [
        intent("e1", [x], [x, y], binding=UNSTABLE),
        resume("q1", record([x], [x, y]), [x, y], runner="r2", binding=UNSTABLE),
    ]
    answer = replay(events)[-1]
    assert (answer.verdict, answer.reason) == (Verdict.WITHHELD, Reason.DIGEST_UNSTABLE)
    assert answer.alert
    assert UNSTABLE.backend_id in " ".join(step.detail for step in answer.trail)


def test_digest_unstable_binding_grants_append_after_a_definite_failure() -> None:
    events: list[Event] = [
        intent("e1", BATCH, BEFORE, binding=UNSTABLE),
        ack("a1", AckOutcome.NOT_WRITTEN, source=AckSource.STORE),
        resume("q1", record(BATCH, BEFORE), BEFORE, runner="r2", binding=UNSTABLE),
    ]
    assert replay(events)[-1].verdict is Verdict.APPEND_ONCE


def test_resume_of_another_sessions_checkpoint_is_answered_at_once() -> None:
    foreign = resume("q1", record(BATCH, BEFORE, intent_id="elsewhere"), BEFORE)
    foreign = replace(foreign, checkpoint_session_id="s-other")
    decisions = replay([foreign])
    assert len(decisions) == 1
    assert (decisions[0].verdict, decisions[0].reason) == (
        Verdict.WITHHELD,
        Reason.BINDING_MISMATCH,
    )
    assert decisions[0].final


def test_deferred_resume_gets_a_final_answer_when_its_intent_is_overdue() -> None:
    events: list[Event] = [
        # The checkpoint knew write 5: the engine's intents never get there.
        resume("q1", record(BATCH, BEFORE, intent_id="never"), BEFORE, seq=5, t=10_000),
        intent("e1", BATCH, BEFORE, t=10_000 + PARK_MS - 1),
        intent("e2", [B], [*BEFORE, *BATCH], intent_id="i2", seq=2, t=10_000 + PARK_MS),
    ]
    decisions = replay(events)
    answers = _by_id(decisions)
    assert answers["q1"].verdict is Verdict.DEFERRED
    assert answers["q1"].runner_action is RunnerAction.WAIT
    final = answers["q1/final"]
    assert (final.verdict, final.reason, final.final) == (
        Verdict.WITHHELD,
        Reason.INTENT_NEVER_ARRIVED,
        True,
    )
    assert final.alert
    assert [d.decision_id for d in decisions].index("q1/final") == len(decisions) - 1


def test_parked_resume_evicted_by_overflow_gets_a_final_answer() -> None:
    events: list[Event] = [
        resume(f"q{n}", record(BATCH, BEFORE, intent_id=f"i-{n}"), BEFORE, t=10_000 + n)
        for n in range(PARKED_LIMIT + 1)
    ]
    answers = _by_id(replay(events))
    assert answers["q0/final"].reason is Reason.PARKED_OVERFLOW
    assert answers["q0/final"].verdict is Verdict.WITHHELD


@pytest.mark.parametrize(
    ("events", "action"),
    [
        ([intent("e1", BATCH, BEFORE), resume("q", record(BATCH, BEFORE), BEFORE)], "APPEND_ONCE"),
        (
            [intent("e1", BATCH, BEFORE), resume("q", record(BATCH, BEFORE), [*BEFORE, *BATCH])],
            "DO_NOT_REPLAY",
        ),
        (
            [
                intent("e1", BATCH, None, kind=IntentKind.HELD),
                resume("q", record(BATCH, None, held=True), BEFORE),
            ],
            "RELEASE_HELD",
        ),
        (
            [intent("e1", BATCH, BEFORE), resume("q", record(BATCH, BEFORE), [STRANGER])],
            "STOP",
        ),
    ],
    ids=["append-once", "do-not-replay", "release-held", "stop"],
)
def test_continue_is_told_apart_by_an_explicit_runner_action(
    events: list[Event], action: str
) -> None:
    decisions = replay(events)
    assert decisions[-1].runner_action is RunnerAction(action)


def test_duplicate_of_a_held_grant_repeats_its_runner_action() -> None:
    events: list[Event] = [
        intent("e1", BATCH, None, kind=IntentKind.HELD),
        resume("q", record(BATCH, None, held=True), BEFORE),
    ]
    decisions = replay([*events, events[-1]])
    assert decisions[-1].reason is Reason.REGRANT_DUPLICATE_REQUEST
    assert decisions[-1].runner_action is RunnerAction.RELEASE_HELD
