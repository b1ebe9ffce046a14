"""A causal ack whose intent the state does not hold is a superseded write's only when its causal
order says that intent was folded: every event it names is folded, one of them a runner event
(a runner ack: its own previous one; a store ack: the one its append followed). An ack folded
without its causes (evicted beyond `CAUSAL_WAIT_LIMIT`, or released by the watermark) is folded
as it stands, as a producer without causal context would be (SPEC.md §7 "Causal context"):
it waits for its intent, and a store ack's tail is checked when that intent arrives.

The case is one where the store ack is the only evidence (SPEC.md §6 "Store acks carry the tail
the store saw"): a foreign rewrite of the batch in the append's transaction, then a resume of a
checkpoint saved after the runner's own COMMITTED ack, which has no pending record to classify.
"""

from __future__ import annotations

import itertools

from msgspec.structs import replace

from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Binding,
    Decision,
    Event,
    Reason,
    Verdict,
)
from engine.core.state import CAUSAL_WAIT_LIMIT, PARK_MS, Health, SessionState
from engine.core.watermark import expire
from tests.unit.core.builders import ack, d, fold_all, intent, msg, resume
from tests.unit.core.lifecycle_model import causal, fold_placed

BEFORE = [msg("hello")]
BATCH = [msg("a"), msg("b")]
REWRITTEN = [msg("a"), msg("b, rewritten by someone else")]
UNSTABLE = Binding(backend_id="conversations", namespace="tests", items_digest_stable=False)
STORE = "store:conversations"


# r1's REGISTER is its event #1. In the watermark case it names #0, an event that never comes
# (published, never acknowledged by Kafka); elsewhere it names none.
OPENED = intent("e1", BATCH, BEFORE, binding=UNSTABLE, t=1_000)
REGISTER = replace(OPENED, causal=causal("r1", 1))
REGISTER_AFTER_LOST = replace(OPENED, causal=causal("r1", 1, ("r1", 0)))
# The store's ack of the append, naming the runner event the append followed (r1#1), with the
# tail as of the append's transaction: the batch's last item was rewritten by another writer.
STORE_ACK = replace(
    ack("a1", AckOutcome.COMMITTED, source=AckSource.STORE, runner="", t=1_100),
    observed_tail=d([*BEFORE, *REWRITTEN]),
    causal=causal(STORE, 0, ("r1", 1)),
)
# r1's own ack, then a checkpoint with no pending record (the SDK dropped it on success), then
# r1 crashed. r2's resume of that checkpoint is granted on the session's health alone (SPEC.md
# §6: no pending write, no tail to classify), so the store's tail is the only evidence.
RUNNER_ACK = replace(ack("a2", AckOutcome.COMMITTED, t=1_150), causal=causal("r1", 2, ("r1", 1)))
RESUME = resume("q1", None, [*BEFORE, *REWRITTEN], binding=UNSTABLE, t=200_000)


def _by_id(decisions: list[Decision]) -> dict[str, tuple[Verdict, Reason, bool]]:
    return {x.decision_id: (x.verdict, x.reason, x.alert) for x in decisions}


def _fold(
    state: SessionState | None, events: list[Event], start: int
) -> tuple[SessionState, list[Decision]]:
    """The events folded at offsets from `start`: the last state and every decision."""
    states, decisions = fold_placed(state, zip(events, itertools.count(start)))
    return states[-1], decisions


def _fillers(count: int) -> list[Event]:
    """Acks of other producers naming events that never come: each waits for its causes."""
    return [
        replace(
            ack(
                f"w{n}", AckOutcome.NOT_WRITTEN, intent_id=f"other{n}", runner=f"w{n}", t=1_200 + n
            ),
            causal=causal(f"w{n}", 1, (f"w{n}", 0)),
        )
        for n in range(count)
    ]


def test_in_causal_order_the_rewrite_is_history_changed_and_nothing_is_granted() -> None:
    """The reference: what the spec says the store ack is answered."""
    state, decisions = fold_all([REGISTER, STORE_ACK, RUNNER_ACK, RESUME])
    answers = _by_id(decisions)
    assert answers["a1"] == (Verdict.RECORDED, Reason.HISTORY_CHANGED, True)
    assert answers["q1"][:2] == (Verdict.WITHHELD, Reason.SESSION_AMBIGUOUS)
    assert state.health is Health.AMBIGUOUS


def test_a_store_ack_evicted_ahead_of_its_intent_waits_for_it_and_its_tail_is_checked() -> None:
    """Evicted from the causal wait by 32 later waiting inputs before its intent came, the ack
    is folded as a store ack without causal context: it waits for its intent (its first answer
    stands), then its tail is checked. It used to be answered ACCEPTED at eviction, as the ack
    of a superseded write, the rewrite was lost and the resume was granted CONTINUE
    NO_PENDING_WRITE (DO_NOT_REPLAY) on a Session another writer had changed."""
    state, decisions = _fold(None, [STORE_ACK, *_fillers(CAUSAL_WAIT_LIMIT)], 0)
    assert [x.decision_id for x in decisions if x.in_reply_to == "a1"] == ["a1"]
    assert len(state.causal_waiting) == CAUSAL_WAIT_LIMIT
    state, later = _fold(state, [REGISTER, RUNNER_ACK, RESUME], 100)
    answers = _by_id([*decisions, *later])
    assert answers["a1"][:2] == (Verdict.RECORDED, Reason.PARKED)
    assert answers["a1/final"] == (Verdict.RECORDED, Reason.HISTORY_CHANGED, True)
    assert answers["q1"][:2] == (Verdict.WITHHELD, Reason.SESSION_AMBIGUOUS)
    assert (state.health, state.health_reason) == (Health.AMBIGUOUS, Reason.HISTORY_CHANGED)


def test_an_evicted_runner_ack_stays_unbound_from_its_causes_once_it_is_noted() -> None:
    """A runner ack names its own previous event, and folding it raises its producer's mark
    past that event: parked for its intent, it must still not pass for a superseded write's
    ack when it is looked at again. It lands on its intent when that arrives."""
    state, decisions = _fold(None, [RUNNER_ACK, *_fillers(CAUSAL_WAIT_LIMIT)], 0)
    assert [x.decision_id for x in decisions if x.in_reply_to == "a2"] == ["a2"]
    assert [a.event_id for a in state.parked_acks] == ["a2"]
    state, later = _fold(state, [REGISTER], 100)
    assert _by_id(later)["a2/final"] == (Verdict.RECORDED, Reason.ACCEPTED, False)
    assert state.slot is not None
    assert state.slot.committed_by_runner


def test_a_store_ack_released_by_the_watermark_before_its_intent_is_tail_checked() -> None:
    """Both the intent and its store ack wait for r1#0, which never comes; the watermark folds
    them as they stand, the ack first (it arrived first). The ack waits for the intent folded
    right after it and is then judged on its tail; it used to be ACCEPTED as superseded."""
    state, decisions = _fold(None, [STORE_ACK, REGISTER_AFTER_LOST], 0)
    assert len(state.causal_waiting) == 2
    state, released = expire(state, STORE_ACK.event_time_ms + PARK_MS)
    answers = _by_id([*decisions, *released])
    assert answers["e1/final"][:2] == (Verdict.RECORDED, Reason.ACCEPTED)
    assert answers["a1/final"] == (Verdict.RECORDED, Reason.HISTORY_CHANGED, True)
    assert state.parked_acks == []
    assert state.causal_waiting == []
    state, later = _fold(state, [RUNNER_ACK, RESUME], 100)
    assert _by_id(later)["q1"][:2] == (Verdict.WITHHELD, Reason.SESSION_AMBIGUOUS)


def test_an_ack_the_watermark_releases_with_no_intent_is_unknown_intent() -> None:
    """Its intent never came: as a parked ack whose intent the intents' clock says is not
    coming, it is evidence of no attempt (SPEC.md §6 "Parked inputs"), not a superseded
    write's evidence ACCEPTED."""
    state, _ = _fold(None, [STORE_ACK], 0)
    state, released = expire(state, STORE_ACK.event_time_ms + PARK_MS)
    assert _by_id(released) == {"a1/final": (Verdict.RECORDED, Reason.UNKNOWN_INTENT, False)}
    assert state.parked_acks == []
    assert state.causal_waiting == []
    assert state.health is Health.CLEAR


def test_a_store_ack_that_names_no_runner_event_waits_for_its_intent() -> None:
    """A store ack naming only the store's previous ack says nothing of where its intent is:
    the store's chain does not hold the runner's intents. It waits for its intent like an ack
    without causal context, instead of passing for a superseded write's ACCEPTED."""
    first = replace(
        intent("e0", [msg("z")], [], intent_id="i0", seq=0, binding=UNSTABLE, t=500),
        causal=causal("r1", 0),
    )
    first_ack = replace(
        STORE_ACK,
        event_id="a0",
        intent_id="i0",
        observed_tail=None,
        causal=causal(STORE, 0, ("r1", 0)),
    )
    lone = replace(STORE_ACK, causal=causal(STORE, 1, (STORE, 0)))
    second = replace(REGISTER, causal=causal("r1", 1, ("r1", 0)))
    state, decisions = fold_all([first, first_ack, lone, second, RUNNER_ACK, RESUME])
    answers = _by_id(decisions)
    assert answers["a0"][:2] == (Verdict.RECORDED, Reason.ACCEPTED)
    assert answers["a1"][:2] == (Verdict.RECORDED, Reason.PARKED)
    assert answers["a1/final"] == (Verdict.RECORDED, Reason.HISTORY_CHANGED, True)
    assert answers["q1"][:2] == (Verdict.WITHHELD, Reason.SESSION_AMBIGUOUS)
    assert state.health is Health.AMBIGUOUS


def test_a_runner_ack_of_a_superseded_write_is_still_accepted_once_its_causes_are_folded() -> None:
    """The shortcut itself stays: the runner's ack names its own previous event, its intent
    is before that in its chain, so an intent id the state no longer holds was superseded."""
    first = replace(REGISTER, event_id="e0", intent_id="i0", causal=causal("r1", 0))
    second = replace(REGISTER, intent_id="i1", causal=causal("r1", 1, ("r1", 0)))
    third = replace(REGISTER, event_id="e2", intent_id="i2", causal=causal("r1", 2, ("r1", 1)))
    late: AckEvent = replace(
        ack("a0", AckOutcome.UNKNOWN, intent_id="i0", t=1_050), causal=causal("r9", 1, ("r9", 0))
    )
    restored_chain = replace(late, causal=causal("r1", 3, ("r1", 2)))
    _, decisions = fold_all([first, second, third, restored_chain])
    assert _by_id(decisions)["a0"][:2] == (Verdict.RECORDED, Reason.ACCEPTED)
    # Named events that are not folded: it waits, as before.
    _, decisions = fold_all([first, second, third, late])
    assert _by_id(decisions)["a0"][:2] == (Verdict.RECORDED, Reason.PARKED)
