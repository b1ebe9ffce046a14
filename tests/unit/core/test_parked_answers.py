"""Every parked ack and intent gets one final answer: when evicted, and in bounded event time.

An ack parks while what it refers to (its intent, the grant of its fence, the release of a held
batch, a re-arm) is not folded yet; an intent parks while its fence is not granted yet. The
rules (SPEC.md "Answer protocol"): the oldest beyond `PARKED_WRITES_LIMIT` is answered at once,
and one that waited `PARK_MS` of event time on the topic it waits on is answered as it stands.
An ack that matches no attempt the engine folded never counts as evidence of one; one under a
fence never granted that says the Session may have changed (COMMITTED, UNKNOWN) turns the
session AMBIGUOUS with an alert.
"""

from __future__ import annotations

import pytest

from engine.core.events import (
    AckOutcome,
    AckSource,
    Decision,
    Event,
    IntentKind,
    Reason,
    RepairResolution,
    Verdict,
)
from engine.core.fold import fold, replay
from engine.core.state import PARK_MS, PARKED_WRITES_LIMIT, Health, SessionState
from engine.core.watermark import expire, park_deadline
from tests.unit.core.builders import ack, fold_all, intent, msg, record, repair, resume

A, B, C = msg("a"), msg("b"), msg("c")


def _by_id(decisions: list[Decision]) -> dict[str, Decision]:
    return {x.decision_id: x for x in decisions}


def test_the_oldest_of_33_parked_acks_gets_a_final_answer() -> None:
    acks = [
        ack(f"a{n}", AckOutcome.COMMITTED, intent_id=f"x{n}", t=1_000 + n)
        for n in range(PARKED_WRITES_LIMIT + 1)
    ]
    state, decisions = fold_all(acks)
    answers = _by_id(decisions)
    assert all(answers[f"a{n}"].reason is Reason.PARKED for n in range(len(acks)))
    evicted = answers["a0/final"]
    assert (evicted.verdict, evicted.reason) == (Verdict.RECORDED, Reason.UNKNOWN_INTENT)
    assert [x.decision_id for x in decisions if x.decision_id.endswith("/final")] == ["a0/final"]
    assert len(state.parked_acks) == PARKED_WRITES_LIMIT
    assert state.slot is None  # evidence of no attempt the engine knows


def test_an_evicted_commit_under_a_fence_never_granted_makes_the_session_ambiguous() -> None:
    acks = [
        ack(f"a{n}", AckOutcome.COMMITTED, intent_id=f"x{n}", fence=7, t=1_000 + n)
        for n in range(PARKED_WRITES_LIMIT + 1)
    ]
    state, decisions = fold_all(acks)
    evicted = _by_id(decisions)["a0/final"]
    assert (evicted.verdict, evicted.reason, evicted.alert) == (
        Verdict.REJECTED,
        Reason.UNKNOWN_FENCE,
        True,
    )
    assert (state.health, state.health_reason) == (Health.AMBIGUOUS, Reason.UNKNOWN_FENCE)


@pytest.mark.parametrize("outcome", list(AckOutcome))
def test_an_ack_whose_intent_never_comes_is_answered_once_intents_move_past_the_bound(
    outcome: AckOutcome,
) -> None:
    ghost = ack("g", outcome, intent_id="ghost", t=1_000)
    early = intent("i-early", [A], [], t=1_000 + PARK_MS - 1)
    late = intent("i-late", [B], [A], intent_id="i2", seq=2, t=1_000 + PARK_MS)
    state, decisions = fold_all([ghost, early])
    assert "g/final" not in _by_id(decisions)  # still within the bound
    state, decisions = fold_all([ghost, early, late])
    final = _by_id(decisions)["g/final"]
    assert (final.verdict, final.reason, final.alert) == (
        Verdict.RECORDED,
        Reason.UNKNOWN_INTENT,
        False,
    )
    assert state.parked_acks == []
    assert state.health is Health.CLEAR


def test_an_ack_of_a_write_superseded_twice_leaves_the_session_clear() -> None:
    # The intents topic read ahead: w1's commit arrives once w3 is registered; the state only
    # keeps the current and the previous intent id, so it cannot tell w1 from a write never
    # registered, and it must not lock the session on a backlog.
    events: list[Event] = [
        intent("i1", [A], [], intent_id="w1", seq=1, t=1_000),
        intent("i2", [B], [A], intent_id="w2", seq=2, t=1_030),
        intent("i3", [C], [A, B], intent_id="w3", seq=3, t=1_050),
        ack("a1", AckOutcome.COMMITTED, intent_id="w1", t=1_020),
    ]
    state, _ = fold_all(events)
    state, decisions = expire(state, 1_020 + PARK_MS)  # no intent of the session follows
    final = _by_id(decisions)["a1/final"]
    assert (final.verdict, final.reason) == (Verdict.RECORDED, Reason.UNKNOWN_INTENT)
    assert state.health is Health.CLEAR


def test_an_ack_under_a_fence_never_granted_waits_on_resumes_not_on_intents() -> None:
    first = intent("i", [A], [], t=500)
    fenced = ack("f", AckOutcome.COMMITTED, fence=7, t=1_000)
    later_intent = intent("i-2", [B], [A], intent_id="i2", seq=2, t=1_000 + PARK_MS)
    state, decisions = fold_all([first, fenced, later_intent])
    # The grant of fence 7 would come on the resumes topic: intents say nothing of it.
    assert "f/final" not in _by_id(decisions)
    later_resume = resume("r", None, [A], runner="r9", seq=9, t=1_000 + PARK_MS)
    state, decisions = fold_all([first, fenced, later_intent, later_resume])
    final = _by_id(decisions)["f/final"]
    assert (final.verdict, final.reason, final.alert) == (
        Verdict.REJECTED,
        Reason.UNKNOWN_FENCE,
        True,
    )
    assert state.health is Health.AMBIGUOUS


def test_an_intent_under_a_fence_never_granted_is_answered_after_the_bound() -> None:
    fenced = intent("i", [A], [], fence=7, t=1_000)
    state, decisions = fold_all([fenced])
    assert _by_id(decisions)["i"].reason is Reason.PARKED
    assert park_deadline(state) == 1_000 + PARK_MS
    state, decisions = fold_all([fenced, resume("r", None, [], seq=0, t=1_000 + PARK_MS)])
    final = _by_id(decisions)["i/final"]
    assert (final.verdict, final.reason) == (Verdict.REJECTED, Reason.UNKNOWN_FENCE)
    assert state.parked_intents == []


def test_the_watermark_answers_waiting_acks_and_fenced_intents_of_a_quiet_session() -> None:
    events: list[Event] = [
        ack("g", AckOutcome.UNKNOWN, intent_id="ghost", t=1_000),
        intent("i", [A], [], fence=7, t=2_000),
    ]
    state, _ = fold_all(events)
    assert park_deadline(state) == 1_000 + PARK_MS
    assert expire(state, 1_000 + PARK_MS - 1) == (state, [])
    state, answers = expire(state, 1_000 + PARK_MS)
    assert [(x.decision_id, x.reason) for x in answers] == [("g/final", Reason.UNKNOWN_INTENT)]
    assert park_deadline(state) == 2_000 + PARK_MS
    state, answers = expire(state, 2_000 + PARK_MS)
    assert [(x.decision_id, x.reason) for x in answers] == [("i/final", Reason.UNKNOWN_FENCE)]
    assert park_deadline(state) is None


def test_a_commit_of_a_held_batch_whose_release_never_comes_is_a_gate_violation() -> None:
    held = intent("h", [A], None, kind=IntentKind.HELD, t=1_000)
    commit = ack("c", AckOutcome.COMMITTED, source=AckSource.STORE, t=2_000)
    state, decisions = fold_all([held, commit])
    assert _by_id(decisions)["c"].reason is Reason.PARKED
    state, answers = expire(state, 2_000 + PARK_MS)
    assert [(x.decision_id, x.reason, x.alert) for x in answers] == [
        ("c/final", Reason.GATE_VIOLATION, True)
    ]
    assert state.health is Health.VIOLATED


def test_an_ack_that_was_given_up_is_not_evidence_when_its_intent_comes_late() -> None:
    ghost = ack("g", AckOutcome.COMMITTED, intent_id="i1", t=1_000)
    state, _ = fold_all([ghost])
    state, _ = expire(state, 1_000 + PARK_MS)
    assert state.parked_acks == []
    late = fold(state, intent("i", [A], [], t=500), position=9)
    assert [(x.verdict, x.reason) for x in late.decisions] == [(Verdict.RECORDED, Reason.ACCEPTED)]
    assert late.state.slot is not None
    assert not late.state.slot.committed_by_runner
    assert not late.state.slot.committed_by_store


def test_parked_answers_replay_identically_and_from_a_snapshot() -> None:
    events: list[Event] = [
        ack(f"a{n}", AckOutcome.COMMITTED, intent_id=f"x{n}", t=1_000 + n) for n in range(40)
    ]
    events += [
        intent("i", [A], [], fence=3, t=1_100),
        resume("r", record([A], []), [A], t=1_100 + PARK_MS),
    ]
    full = replay(events)
    assert full == replay(events)
    state, head = fold_all(events[:20])
    state = SessionState.from_record(state.to_record())
    tail: list[Decision] = []
    for position, event in enumerate(events[20:], start=20):
        result = fold(state, event, position)
        state, tail = result.state, [*tail, *result.decisions]
    assert full == [*head, *tail]


def test_a_re_arm_whose_failure_never_comes_is_answered_by_the_watermark() -> None:
    registered = intent("i1", [A], [], t=1_000)
    rearm = intent("i1-again", [A], [], t=2_000)  # same intent, holder and fence: a retry
    state, decisions = fold_all([registered, rearm])
    assert _by_id(decisions)["i1-again"].reason is Reason.PARKED
    assert park_deadline(state) == 2_000 + PARK_MS
    state, answers = expire(state, 2_000 + PARK_MS)
    assert [(x.decision_id, x.verdict, x.reason) for x in answers] == [
        ("i1-again/final", Verdict.RECORDED, Reason.DUPLICATE)
    ]
    assert state.parked_intents == []


def test_a_resume_does_not_time_an_ack_that_waits_for_its_intent() -> None:
    # The resumes topic read a minute ahead of the intents: the commit must still count for i1
    # when i1 arrives (an intent, or the watermark, times this ack; SPEC.md §6 "Parked inputs").
    early_ack = ack("a1", AckOutcome.COMMITTED, t=2_000)
    ahead = resume("r", record([A], []), [A], runner="r1", seq=1, t=2_000 + PARK_MS + 1)
    state, decisions = fold_all([early_ack, ahead])
    assert "a1/final" not in _by_id(decisions)
    state, decisions = fold_all([early_ack, ahead, intent("i", [A], [], t=1_500)])
    final = _by_id(decisions)["a1/final"]
    assert (final.verdict, final.reason) == (Verdict.RECORDED, Reason.ACCEPTED)
    assert state.slot is not None
    assert state.slot.committed_by_runner
    assert _by_id(decisions)["r/final"].reason is Reason.KNOWN_COMMITTED


def test_a_parked_resume_that_becomes_ready_does_not_time_an_ack_that_waits_for_its_intent() -> (
    None
):
    waiting = ack("a2", AckOutcome.COMMITTED, intent_id="i2", t=2_000)
    ahead = resume("r", record([A], []), [A], runner="r1", seq=1, t=2_000 + PARK_MS + 1)
    state, decisions = fold_all([waiting, ahead, intent("i", [A], [], t=1_500)])
    assert _by_id(decisions)["r/final"].verdict is Verdict.CONTINUE
    assert "a2/final" not in _by_id(decisions)
    assert [a.event_id for a in state.parked_acks] == ["a2"]
    state, answers = expire(state, 2_000 + PARK_MS)  # the intents clock still bounds it
    assert [(x.decision_id, x.reason) for x in answers] == [("a2/final", Reason.UNKNOWN_INTENT)]


def test_a_repair_does_not_time_a_re_arm_that_waits_for_its_failure() -> None:
    # A re-arm waits for a NOT_WRITTEN on the acks topic: an operator's repair on the intents
    # topic says nothing of how far the acks were read.
    registered = intent("i1", [A], [], t=1_000)
    rearm = intent("i1-again", [A], [], t=2_000)
    unrelated = repair("p", RepairResolution.ABANDON, intent_id="other", t=2_000 + PARK_MS)
    failed = ack("n", AckOutcome.NOT_WRITTEN, t=1_500)
    state, decisions = fold_all([registered, rearm, unrelated])
    assert "i1-again/final" not in _by_id(decisions)
    state, decisions = fold_all([registered, rearm, unrelated, failed])
    final = _by_id(decisions)["i1-again/final"]
    assert (final.verdict, final.reason) == (Verdict.RECORDED, Reason.ACCEPTED)
    assert state.parked_intents == []
    assert state.slot is not None
    assert not state.slot.not_written
