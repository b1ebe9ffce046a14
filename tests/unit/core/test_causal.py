"""Causal order (intent/ack/resume v3): an input is folded after the events it names.

Each test states the case the merge-order property (`test_lifecycle.py`) relies on, in the
arrival order that used to change the answer.
"""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.events import AckEvent, AckOutcome, CausalContext, Cause, Decision, Verdict
from engine.core.fold import fold
from engine.core.state import CAUSAL_WAIT_LIMIT, PARK_MS, PRODUCERS_LIMIT, Health, SessionState
from engine.core.watermark import expire, park_deadline
from tests.unit.core.builders import ack, fold_all, intent, msg, record, resume
from tests.unit.core.lifecycle_model import (
    Fault,
    Hold,
    Op,
    Restore,
    Settle,
    Topic,
    World,
    Write,
)
from tests.unit.core.test_lifecycle import settled

BATCH = [msg("a")]


def ctx(producer: str, seq: int, *after: tuple[str, int]) -> CausalContext:
    return CausalContext(
        producer=producer, seq=seq, after=[Cause(producer=p, seq=n) for p, n in after]
    )


def _answers(decisions: list[Decision]) -> dict[str, tuple[str, str]]:
    return {d.in_reply_to: (d.verdict.value, d.reason.value) for d in decisions}


REGISTER = replace(intent("e-i", BATCH, [], seq=0, t=1_000), causal=ctx("r1", 0))
ACKED = replace(ack("e-a", AckOutcome.COMMITTED, t=1_100), causal=ctx("r1", 1, ("r1", 0)))
# r2 restored the checkpoint r1 saved after its ack: no pending record, it names r1's ack.
AFTER_ACK = replace(
    resume("e-q", None, BATCH, runner="r2", seq=0, t=70_000),
    causal=ctx("r2", 0, ("r1", 1)),
)


def test_a_resume_read_ahead_of_the_ack_it_names_waits_and_gets_the_time_order_answer() -> None:
    _, in_time = fold_all([REGISTER, ACKED, AFTER_ACK])
    _, ahead = fold_all([REGISTER, AFTER_ACK, ACKED])
    assert ahead[1].verdict is Verdict.DEFERRED
    assert ahead[1].decision_id == "e-q"
    assert ahead[-1].decision_id == "e-q/final"
    assert _answers(ahead) == _answers(in_time)
    assert _answers(in_time)["e-q"] == ("CONTINUE", "NO_PENDING_WRITE")


def test_an_ack_read_ahead_of_its_own_intent_waits_for_it() -> None:
    _, in_time = fold_all([REGISTER, ACKED])
    state, ahead = fold_all([ACKED, REGISTER])
    assert (ahead[0].verdict, ahead[0].reason.value) == (Verdict.RECORDED, "PARKED")
    assert _answers(ahead) == _answers(in_time)
    assert state.slot is not None
    assert state.slot.committed_by_runner
    assert state.causal_waiting == []


def test_the_old_holders_ack_after_its_checkpoint_is_answered_alike_before_or_after_the_grant() -> (
    None
):
    """The issue's case: r1 crashes after an UNKNOWN ack it published after its checkpoint;
    r2's resume cannot name that ack. Folded after r2's grant it used to be STALE_FENCE."""
    pending = record(BATCH, [])
    unknown = replace(ack("e-u", AckOutcome.UNKNOWN, t=1_100), causal=ctx("r1", 1, ("r1", 0)))
    restored = replace(
        resume("e-q", pending, [], runner="r2", seq=0, t=70_000), causal=ctx("r2", 0, ("r1", 0))
    )
    _, in_time = fold_all([REGISTER, unknown, restored])
    _, grant_first = fold_all([REGISTER, restored, unknown])
    assert _answers(in_time) == _answers(grant_first)
    assert _answers(grant_first)["e-u"] == ("RECORDED", "ACCEPTED")
    v2 = replace(unknown, causal=None)
    _, v2_grant_first = fold_all([REGISTER, restored, v2])
    assert _answers(v2_grant_first)["e-u"] == ("RECORDED", "STALE_FENCE")


def test_a_copy_of_a_waiting_input_gets_the_waiting_answer_and_waits_once() -> None:
    state, first = fold_all([REGISTER, AFTER_ACK])
    again = fold(state, AFTER_ACK, 2)
    assert again.decisions == (first[-1],)
    assert again.state == state
    assert len(state.causal_waiting) == 1


def test_an_input_whose_cause_never_arrives_is_folded_as_it_stands_at_the_watermark() -> None:
    state, _ = fold_all([REGISTER, AFTER_ACK])
    deadline = park_deadline(state)
    assert deadline == AFTER_ACK.event_time_ms + PARK_MS
    unchanged, none = expire(state, deadline - 1)
    assert none == []
    assert unchanged == state
    after, decisions = expire(state, deadline)
    assert after.causal_waiting == []
    # Folded as a v2 resume would be, with its final answer under the `/final` id.
    assert [d.decision_id for d in decisions] == ["e-q/final"]
    assert decisions[0].verdict is Verdict.WITHHELD


def test_beyond_the_limit_the_oldest_waiting_input_is_folded_at_once() -> None:
    state: SessionState | None = fold(None, REGISTER, 0).state
    assert state is not None
    decisions: list[Decision] = []
    for n in range(CAUSAL_WAIT_LIMIT + 1):
        waiting = replace(
            AFTER_ACK, event_id=f"q{n}", causal=ctx(f"r{n + 10}", 0, ("r1", 1)), runner_id=f"x{n}"
        )
        result = fold(state, waiting, n + 1)
        state, decisions = result.state, [*decisions, *result.decisions]
    assert state is not None
    assert len(state.causal_waiting) == CAUSAL_WAIT_LIMIT
    assert [d.decision_id for d in decisions if d.in_reply_to == "q0"] == ["q0", "q0/final"]


def test_the_session_remembers_a_bounded_number_of_producers_the_quietest_forgotten() -> None:
    state = SessionState(session_id=REGISTER.session_id)
    for n in range(PRODUCERS_LIMIT + 1):
        event = replace(REGISTER, event_id=f"e{n}", event_time_ms=1_000 + n, causal=ctx(f"p{n}", 0))
        state = fold(state, event, n).state
    names = [m.producer for m in state.producers]
    assert len(names) == PRODUCERS_LIMIT
    assert "p0" not in names
    assert names == sorted(names)


def test_waiting_inputs_and_marks_survive_a_snapshot() -> None:
    state, _ = fold_all([REGISTER, AFTER_ACK])
    assert SessionState.from_record(state.to_record()) == state


def test_an_uncovered_append_is_answered_at_once_with_what_happened() -> None:
    """r1 registered an append the SDK wrote no pending record for and crashed before its ack;
    r2's checkpoint (no record) names r1's intent only. The answer comes at once, not DEFERRED
    and then INTENT_NEVER_ARRIVED 60 s of event time later, and says what happened."""
    restored = replace(
        resume("e-q", None, BATCH, runner="r2", seq=0, t=70_000), causal=ctx("r2", 0, ("r1", 0))
    )
    state, decisions = fold_all([REGISTER, restored])
    assert [d.decision_id for d in decisions] == ["e-i", "e-q"]
    answer = decisions[-1]
    assert (answer.verdict, answer.reason.value, answer.alert) == (
        Verdict.WITHHELD,
        "RECORD_MISMATCH",
        True,
    )
    why = " ".join(entry.detail for entry in answer.trail)
    assert "uncovered append" in why
    assert "looks committed" in why
    assert answer.operator_action is not None
    assert "without a pending record" in answer.operator_action
    assert "ACCEPT_COMMITTED" in answer.operator_action
    assert state.health is Health.AMBIGUOUS
    assert park_deadline(state) is None


def test_an_uncovered_append_from_a_v2_client_still_waits_for_the_watermark() -> None:
    """What stays order-dependent without causal context: the engine cannot tell the ack
    that is on its way from one that never comes (README "Causal order")."""
    restored = resume("e-q", None, BATCH, runner="r2", seq=0, t=70_000)
    state, decisions = fold_all([replace(REGISTER, causal=None), restored])
    assert decisions[-1].verdict is Verdict.DEFERRED
    _, final = expire(state, restored.event_time_ms + PARK_MS)
    assert final[0].reason.value == "INTENT_NEVER_ARRIVED"


def test_the_old_holders_ack_read_after_its_intent_was_superseded_twice_is_still_accepted() -> None:
    """Found by the soak: r1's UNKNOWN ack (after its last checkpoint) read after r2's resume,
    HELD, DISCARD and next REGISTER. Its intent is no longer the slot's nor the previous one;
    a v3 ack follows its intent in r1's chain, so it is a superseded write's, ACCEPTED as in
    log order (it used to wait for that intent and end UNKNOWN_INTENT)."""
    program: list[Op] = [
        Write(Fault.OK),
        Write(Fault.UNKNOWN_LANDED),
        Restore(1, Fault.OK),
        Hold(),
        Settle(True),
        Write(Fault.OK),
    ]
    world = World(store_acks=False, causal=True)
    world.run(program)
    by_id = {i.event.event_id: i for i in world.log}
    intents_then_acks = [i for i in world.log if i.topic is not Topic.ACKS] + [
        i for i in world.log if i.topic is Topic.ACKS
    ]
    assert [i.event.event_id for i in intents_then_acks][-3:] == ["a4", "a8", "a17"]
    answers, state = settled(intents_then_acks)
    assert (answers, state) == settled(world.log)
    assert answers["a8"] == ("RECORDED", "ACCEPTED", "NONE")
    ack_of_r1 = by_id["a8"].event
    assert isinstance(ack_of_r1, AckEvent)
    assert ack_of_r1.causal is not None
