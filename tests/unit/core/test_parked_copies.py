"""Copies of a waiting input: one final answer per event id, and no place in the limits.

A runner (or a producer retry) can re-send an input with the same event id after the
de-duplication window (`RECENT_EVENT_IDS`) has moved past it. While the first copy waits
(parked), the copy is answered like the first (DEFERRED or RECORDED PARKED, same decision id)
and is not parked beside it: otherwise the expiry paths answered each copy (two final answers
under one `decision_id`, possibly different ones), and copies took the places of genuine
inputs in `PARKED_LIMIT` / `PARKED_WRITES_LIMIT`. SPEC.md §6 "Parked inputs".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from msgspec.structs import replace

from engine.core.events import AckOutcome, Decision, Event, Reason, ResumeEvent, Verdict
from engine.core.fold import fold
from engine.core.state import PARKED_LIMIT, RECENT_EVENT_IDS, ParkedResume, SessionState
from engine.core.watermark import expire
from tests.unit.core.builders import ack, fold_all, intent, msg, record, resume

A = msg("a")
LATE = 1_000_000
"""A watermark far past every input's deadline."""


def _fold_then_expire(events: Sequence[Event]) -> tuple[SessionState, list[Decision]]:
    state, decisions = fold_all(events)
    state, expired = expire(state, LATE)
    return state, [*decisions, *expired]


def _fillers(tag: str, t: int) -> list[Event]:
    """Enough other inputs of the session to push an event id out of the de-duplication window
    (acks of an intent never registered: they wait too, and never touch a resume)."""
    return [
        ack(f"{tag}-{n}", AckOutcome.COMMITTED, intent_id="ghost", t=t + n)
        for n in range(RECENT_EVENT_IDS)
    ]


def _waiting_resume(eid: str, checkpoint: str, t: int) -> ResumeEvent:
    """A resume naming intent `i1`, which is never registered: it waits until the bound."""
    return resume(eid, record([A], [], intent_id="i1"), [], checkpoint=checkpoint, t=t)


def _finals(decisions: list[Decision], event_id: str) -> list[tuple[Verdict, Reason]]:
    return [(d.verdict, d.reason) for d in decisions if d.decision_id == event_id + "/final"]


def test_a_resume_copy_after_the_window_gets_one_final_answer_not_overflow_and_expiry() -> None:
    """Before the fix: the copy was parked beside the first, three more resumes evicted the
    first (PARKED_OVERFLOW) and the watermark answered the copy (INTENT_NEVER_ARRIVED): two
    different final answers under `r-0/final`."""
    r0 = _waiting_resume("r-0", "c0", t=10_000)
    others = [_waiting_resume(f"r-{n}", f"c{n}", t=10_100 + n) for n in range(1, PARKED_LIMIT)]
    state, decisions = _fold_then_expire([r0, *_fillers("g", 10_001), r0, *others])
    copies = [d for d in decisions if d.decision_id == "r-0"]
    assert [(d.verdict, d.reason, d.final) for d in copies] == [
        (Verdict.DEFERRED, Reason.AWAITING_INTENT, False)
    ] * 2
    assert copies[0].trail == copies[1].trail
    assert _finals(decisions, "r-0") == [(Verdict.WITHHELD, Reason.INTENT_NEVER_ARRIVED)]
    assert state.parked_resumes == []


def test_copies_of_a_waiting_resume_take_no_place_in_the_parked_limit() -> None:
    """Before the fix: three copies of `r-0` re-sent after the window filled the four places,
    and the genuine resume `r-g` was pushed out with PARKED_OVERFLOW."""
    genuine = _waiting_resume("r-g", "cg", t=9_000)
    r0 = _waiting_resume("r-0", "c0", t=10_000)
    events: list[Event] = [genuine, r0]
    for round_ in range(PARKED_LIMIT - 1):
        events += [*_fillers(f"g{round_}", 10_001 + 10 * round_), r0]
    state, decisions = fold_all(events)
    assert [p.resume.event_id for p in state.parked_resumes] == ["r-g", "r-0"]
    assert not [d for d in decisions if d.reason is Reason.PARKED_OVERFLOW]
    state, expired = expire(state, LATE)
    assert _finals(expired, "r-g") == [(Verdict.WITHHELD, Reason.INTENT_NEVER_ARRIVED)]
    assert _finals(expired, "r-0") == [(Verdict.WITHHELD, Reason.INTENT_NEVER_ARRIVED)]


def test_a_copy_of_a_waiting_resume_changes_nothing() -> None:
    r0 = _waiting_resume("r-0", "c0", t=10_000)
    before, _ = fold_all([r0, *_fillers("g", 10_001)])
    result = fold(before, r0, 99)
    assert result.state == before
    assert [(d.decision_id, d.verdict, d.final) for d in result.decisions] == [
        ("r-0", Verdict.DEFERRED, False)
    ]


def test_an_ack_copy_after_the_window_is_parked_once_and_answered_once() -> None:
    waiting = ack("a-x", AckOutcome.COMMITTED, intent_id="ghost", t=1_000)
    state, decisions = _fold_then_expire([waiting, *_fillers("g", 1_001), waiting])
    assert [(d.verdict, d.reason) for d in decisions if d.decision_id == "a-x"] == [
        (Verdict.RECORDED, Reason.PARKED)
    ] * 2
    assert _finals(decisions, "a-x") == [(Verdict.RECORDED, Reason.UNKNOWN_INTENT)]
    assert state.parked_acks == []


def test_an_intent_copy_under_a_fence_never_granted_is_answered_once() -> None:
    fenced = intent("f-1", [A], [], fence=7, t=1_000)
    state, decisions = fold_all([fenced, *_fillers("g", 1_001), fenced])
    assert [i.event_id for i in state.parked_intents] == ["f-1"]
    assert [(d.verdict, d.reason) for d in decisions if d.decision_id == "f-1"] == [
        (Verdict.RECORDED, Reason.PARKED)
    ] * 2
    state, expired = expire(state, LATE)
    assert _finals(expired, "f-1") == [(Verdict.REJECTED, Reason.UNKNOWN_FENCE)]


def test_a_copy_inside_the_window_is_answered_like_the_waiting_first() -> None:
    waiting = ack("a-x", AckOutcome.COMMITTED, intent_id="ghost", t=1_000)
    _, decisions = fold_all([waiting, waiting])
    assert [(d.decision_id, d.reason) for d in decisions] == [("a-x", Reason.PARKED)] * 2


def test_copies_in_a_state_written_by_an_older_engine_get_one_final_answer() -> None:
    """A changelog written before the fix can hold two copies of one waiting input; the expiry
    and eviction paths answer its event id once."""
    r0 = _waiting_resume("r-0", "c0", t=10_000)
    waiting = ack("a-x", AckOutcome.COMMITTED, intent_id="ghost", t=1_000)
    fenced = intent("f-1", [A], [], fence=7, t=1_000)
    state, _ = fold_all([r0, waiting, fenced])
    doubled = replace(
        state,
        parked_resumes=[*state.parked_resumes, ParkedResume(resume=r0, position=9)],
        parked_acks=[*state.parked_acks, waiting],
        parked_intents=[*state.parked_intents, fenced],
    )
    state, expired = expire(doubled, LATE)
    finals = Counter(d.in_reply_to for d in expired)
    assert finals == Counter({"r-0": 1, "a-x": 1, "f-1": 1})
    assert (state.parked_resumes, state.parked_acks, state.parked_intents) == ([], [], [])


def test_an_evicted_copy_is_not_answered_while_another_copy_still_waits() -> None:
    r0 = _waiting_resume("r-0", "c0", t=10_000)
    state, _ = fold_all([r0])
    doubled = replace(
        state, parked_resumes=[*state.parked_resumes, ParkedResume(resume=r0, position=9)]
    )
    others = [_waiting_resume(f"r-{n}", f"c{n}", t=10_100 + n) for n in range(1, PARKED_LIMIT)]
    decisions: list[Decision] = []
    current: SessionState = doubled
    for position, event in enumerate(others, start=10):
        result = fold(current, event, position)
        current, decisions = result.state, [*decisions, *result.decisions]
    assert _finals(decisions, "r-0") == []
    assert [p.resume.event_id for p in current.parked_resumes].count("r-0") == 1
    current, expired = expire(current, LATE)
    assert _finals(expired, "r-0") == [(Verdict.WITHHELD, Reason.INTENT_NEVER_ARRIVED)]


def test_a_copy_of_the_granting_resume_out_of_the_window_gets_the_same_grant() -> None:
    """`grant_request_id` outlives the window: before, the copy was judged afresh and got
    CHECKPOINT_ALREADY_RESUMED under the grant's own decision id."""
    granted = resume("r-1", record([A], [], intent_id="i1"), [A], runner="r1", t=2_000)
    events: list[Event] = [intent("i-1", [A], [], t=1_000), granted]
    events += [intent(f"i-{n}", [A], [A], intent_id=f"i{n}", seq=n, t=2_000 + n) for n in (2, 3)]
    events += _fillers("g", 3_000)
    state, decisions = fold_all([*events, granted])
    answers = [(d.verdict, d.reason) for d in decisions if d.decision_id == "r-1"]
    assert answers == [
        (Verdict.CONTINUE, Reason.COMMITTED),
        (Verdict.CONTINUE, Reason.REGRANT_DUPLICATE_REQUEST),
    ]
    assert state.grant_request_id == "r-1"
