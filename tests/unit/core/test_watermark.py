"""The partition watermark answers a parked resume whose session never sees another event."""

from __future__ import annotations

from engine.core.events import AckOutcome, Reason, RunnerAction, Verdict
from engine.core.fold import fold
from engine.core.state import PARK_MS, SessionState
from engine.core.watermark import NO_WATERMARK, advance, expire, park_deadline
from tests.unit.core.builders import ack, call, intent, msg, out, record, resume

U, C, OUT = msg("u"), call("c1"), out("c1")


def _orphan() -> SessionState:
    """A session whose only input is a resume naming an intent that never comes."""
    result = fold(None, resume("r1", record([OUT], [U, C]), [U, C], t=10_000), position=3)
    assert [d.verdict for d in result.decisions] == [Verdict.DEFERRED]
    return result.state


def test_an_orphan_resume_gets_its_final_answer_once_the_watermark_passes_its_deadline() -> None:
    state = _orphan()
    assert park_deadline(state) == 10_000 + PARK_MS
    assert expire(state, 10_000 + PARK_MS - 1) == (state, [])
    after, answers = expire(state, 10_000 + PARK_MS)
    assert [(a.decision_id, a.verdict, a.reason) for a in answers] == [
        ("r1/final", Verdict.WITHHELD, Reason.INTENT_NEVER_ARRIVED)
    ]
    assert answers[0].alert
    assert answers[0].runner_action is RunnerAction.STOP
    assert after.parked_resumes == []
    assert park_deadline(after) is None
    assert expire(after, 10_000 + 10 * PARK_MS) == (after, [])  # answered once only


def test_only_intents_move_the_watermark_and_it_never_falls() -> None:
    watermark = advance(NO_WATERMARK, intent("e1", [OUT], [U, C], t=5_000))
    assert watermark == 5_000
    assert advance(watermark, intent("e2", [OUT], [U, C], t=4_000)) == 5_000
    # A resumes or acks topic read ahead says nothing about how far the intents were read.
    assert advance(watermark, resume("e3", None, [], t=900_000)) == 5_000
    assert advance(watermark, ack("e4", AckOutcome.COMMITTED, t=900_000)) == 5_000


def test_an_intent_folded_before_the_deadline_answers_the_resume_and_nothing_expires() -> None:
    state = _orphan()
    arrived = fold(state, intent("e1", [OUT], [U, C], t=9_000), position=4)
    assert [d.decision_id for d in arrived.decisions][-1] == "r1/final"
    assert park_deadline(arrived.state) is None
    assert expire(arrived.state, 10_000 + PARK_MS) == (arrived.state, [])


def test_the_deadline_is_the_earliest_parked_resume_and_a_later_one_keeps_waiting() -> None:
    state = _orphan()
    later = resume("r2", record([OUT], [U, C]), [U, C], runner="r3", checkpoint="c2", t=40_000)
    state = fold(state, later, position=5).state
    assert park_deadline(state) == 10_000 + PARK_MS
    state, answers = expire(state, 10_000 + PARK_MS)
    assert [a.decision_id for a in answers] == ["r1/final"]
    assert park_deadline(state) == 40_000 + PARK_MS


def test_expiry_from_a_restored_snapshot_gives_the_same_answer() -> None:
    state = _orphan()
    restored = SessionState.from_record(state.to_record())
    assert expire(restored, 10_000 + PARK_MS) == expire(state, 10_000 + PARK_MS)
