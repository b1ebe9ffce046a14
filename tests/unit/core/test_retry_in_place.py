"""A retry in place under the same fence after NOT_WRITTEN gets the same final answers whichever
input topic is read first (README "Attempts")."""

from __future__ import annotations

import pytest

from engine.core.events import AckOutcome, AckSource, Decision, Event, Reason, Verdict
from engine.core.fold import replay
from engine.core.state import PARK_MS, Health, SlotStatus
from engine.core.watermark import expire
from tests.unit.core.builders import ack, fold_all, intent, msg

U, A, B = msg("hello"), msg("answer"), msg("more")


def _final(decisions: list[Decision]) -> dict[str, tuple[Verdict, Reason, bool]]:
    """Per input, its last answer (the `/final` one of an input that waited)."""
    return {d.in_reply_to: (d.verdict, d.reason, d.alert) for d in decisions}


def _retry_in_place(store_acks: bool) -> tuple[list[Event], list[Event]]:
    """Intents and acks (each topic in its own order) of: register, NOT_WRITTEN, re-arm under
    the same fence, append again, COMMITTED, then the next write."""
    intents: list[Event] = [
        intent("e1", [A], [U], t=1_000),
        intent("e2", [A], [U], t=1_200),  # the re-arm: same intent, new event id
        intent("e3", [B], [U, A], intent_id="i2", seq=2, t=1_400),
    ]
    acks: list[Event] = [ack("a1", AckOutcome.NOT_WRITTEN, t=1_100)]
    if store_acks:
        acks.insert(0, ack("s1", AckOutcome.NOT_WRITTEN, source=AckSource.STORE, t=1_090))
    acks.append(ack("a2", AckOutcome.COMMITTED, t=1_300))
    return intents, acks


def _time_order(intents: list[Event], acks: list[Event]) -> list[Event]:
    return sorted([*intents, *acks], key=lambda e: e.event_time_ms)


def test_retry_in_place_after_not_written_commits_with_the_acks_read_ahead() -> None:
    intents, acks = _retry_in_place(store_acks=False)
    in_time = replay(_time_order(intents, acks))
    acks_ahead = replay([*acks, *intents])
    assert _final(acks_ahead) == _final(in_time)
    assert _final(in_time)["a2"] == (Verdict.RECORDED, Reason.ACCEPTED, False)
    assert _final(in_time)["e3"] == (Verdict.RECORDED, Reason.ACCEPTED, False)
    assert not any(d.alert for d in acks_ahead)


@pytest.mark.parametrize("store_acks", [False, True])
def test_retry_in_place_commit_read_before_its_re_arm_waits_for_it(store_acks: bool) -> None:
    intents, acks = _retry_in_place(store_acks)
    order = [intents[0], *acks, *intents[1:]]  # the re-arm is read after the retry's commit
    answers = replay(order)
    first = {d.decision_id: d for d in answers}
    assert (first["a2"].verdict, first["a2"].reason) == (Verdict.RECORDED, Reason.PARKED)
    assert _final(answers) == _final(replay(_time_order(intents, acks)))


def test_retry_in_place_re_arm_read_before_its_not_written_waits_for_it() -> None:
    intents, acks = _retry_in_place(store_acks=False)
    answers = replay([*intents, *acks])
    first = {d.decision_id: d for d in answers}
    assert (first["e2"].verdict, first["e2"].reason) == (Verdict.RECORDED, Reason.PARKED)
    assert _final(answers) == _final(replay(_time_order(intents, acks)))


def test_a_commit_older_than_the_re_arm_belongs_to_the_failed_attempt_and_is_ambiguous() -> None:
    """The failed attempt also reported a commit: the retry's commit must not hide it."""
    events: list[Event] = [
        intent("e1", [A], [U], t=1_000),
        ack("a1", AckOutcome.NOT_WRITTEN, t=1_100),
        ack("s1", AckOutcome.COMMITTED, source=AckSource.STORE, t=1_150),
        intent("e2", [A], [U], t=1_200),
    ]
    answers = _final(replay(events))
    assert answers["s1"] == (Verdict.RECORDED, Reason.AMBIGUOUS, True)
    assert answers["e2"][0] is Verdict.RECORDED
    assert sum(d.alert for d in replay(events)) == 1


def test_a_commit_after_not_written_with_no_retry_is_ambiguous_once_its_wait_ends() -> None:
    events: list[Event] = [
        intent("e1", [A], [U], t=1_000),
        ack("a1", AckOutcome.NOT_WRITTEN, t=1_100),
        ack("a2", AckOutcome.COMMITTED, t=1_300),
    ]
    state, decisions = fold_all(events)
    assert decisions[-1].reason is Reason.PARKED
    assert expire(state, 1_300 + PARK_MS - 1) == (state, [])
    after, answers = expire(state, 1_300 + PARK_MS)  # the partition's intents moved on
    assert [(d.decision_id, d.reason, d.alert) for d in answers] == [
        ("a2/final", Reason.AMBIGUOUS, True)
    ]
    assert after.health is Health.AMBIGUOUS
    assert after.slot is not None
    assert after.slot.status is SlotStatus.COMMITTED
