"""Reconcile a resume against the slot: the record check, the classification, the grant."""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.answers import grant, withhold
from engine.core.classify import is_committed, is_unchanged
from engine.core.decide import (
    ACTION_NEWER,
    batch_of,
    evidence,
)
from engine.core.errors import CoreError
from engine.core.events import (
    AnswerSuffix,
    Decision,
    ResumeEvent,
)
from engine.core.members import (
    CLS_NONE,
    HEALTH_AMBIGUOUS,
    HEALTH_VIOLATED,
    REASON_ABANDONED,
    REASON_ACCEPTED_ABSENT,
    REASON_COMMITTED_BY_STORE,
    REASON_GATE_VIOLATION,
    REASON_HELD_NOT_SETTLED,
    REASON_HELD_RIDES,
    REASON_HISTORY_CHANGED,
    REASON_KNOWN_COMMITTED,
    REASON_NO_PENDING_WRITE,
    REASON_RECORD_MISMATCH,
    REASON_STALE_CHECKPOINT,
    SLOT_ABANDONED,
    SLOT_ABSENT,
    SLOT_COMMITTED,
    SLOT_DISCARDED,
    SLOT_HELD,
    VERDICT_APPEND_ONCE,
    VERDICT_CONTINUE,
)
from engine.core.open_write import classify_open, new_attempt
from engine.core.state import (
    UNRESOLVED,
    IntentSlot,
    SessionState,
)


def record_matches(slot: IntentSlot, event: ResumeEvent) -> bool:
    pending = event.pending
    if pending is None:
        raise CoreError("record check needs a pending record")
    if pending.items != slot.items or pending.held != (slot.status is SLOT_HELD):
        return False
    if slot.persisted_count is not None and pending.persisted_count != slot.persisted_count:
        return False
    # Compared every time, not only while the write is open: a record edited after the engine
    # resolved its intent would send the client down the SDK's first-attempt path again.
    return slot.held or pending.before == slot.before


def _tail_ends_with_batch(state: SessionState, slot: IntentSlot, event: ResumeEvent) -> bool:
    """Whether the tail the resume observed still ends with exactly ``before`` + batch.

    On a binding whose stored items do not digest like the appended ones, only ``before`` and
    the batch's length can be compared: the batch's own digests are the backend's rewrite.
    """
    before, batch, tail = slot.before or [], batch_of(slot), event.observed_tail
    size = len(before) + len(batch)
    if len(tail) < size:
        return False
    window = tail[len(tail) - size :]
    if state.binding is not None and not state.binding.items_digest_stable:
        return window[: len(before)] == before
    return window == [*before, *batch]


def _history_changed(
    state: SessionState, event: ResumeEvent, suffix: AnswerSuffix, slot: IntentSlot
) -> tuple[SessionState, Decision]:
    """Acks say our batch was written; the tail says the Session holds something else now.

    Evidence about our batch says nothing about who else wrote (popped, rewrote, re-appended or
    appended after it): "do not replay" could lose output or hide a second writer.
    """
    ambiguous = replace(state, health=HEALTH_AMBIGUOUS, health_reason=REASON_HISTORY_CHANGED)
    why = "the append was acknowledged committed, but the tail is no longer before + batch"
    observed = f"tail of {len(event.observed_tail)} digests; {evidence(slot)}"
    return withhold(
        ambiguous, event, REASON_HISTORY_CHANGED, why, suffix, alert=True, observed=observed
    )


def _uncovered_append(
    state: SessionState, event: ResumeEvent, suffix: AnswerSuffix, slot: IntentSlot
) -> tuple[SessionState, Decision]:
    """A v3 resume with no pending record while a write is open: the SDK wrote no record for
    that append, and the checkpoint's runner had no ack of it when it saved the checkpoint
    (the resume names everything that runner had published). Nothing can say whether the
    append ran, so the engine does not wait for an intent that already arrived: it withholds
    at once, turns the session AMBIGUOUS with an alert, and says what the tail showed."""
    before, batch, tail = slot.before or [], batch_of(slot), event.observed_tail
    if slot.before is None:
        seen = "the intent was registered before its append started"
    elif len(tail) < len(before) + len(batch):
        seen = f"the resume carried {len(tail)} tail digests, too few to compare with the write"
    elif is_committed(tail[len(tail) - len(before) - len(batch) :], before, batch):
        seen = "the tail ends with before + batch: the append looks committed"
    elif is_unchanged(tail, before):
        seen = "the tail still ends with before: the append looks absent"
    else:
        seen = "the tail ends with neither before nor before + batch"
    why = (
        f"intent {slot.intent_id} (write {slot.sequence}) is open with no ack, and the "
        "checkpoint holds no pending record for it: the SDK wrote none for this append "
        f"(an uncovered append); {seen}"
    )
    ambiguous = replace(state, health=HEALTH_AMBIGUOUS, health_reason=REASON_RECORD_MISMATCH)
    action = (
        f"The append of intent {slot.intent_id} was made without a pending record in the "
        "checkpoint, so the checkpoint cannot tell whether it ran. Compare the Session tail "
        "with the intent's digests (the trail says what the resumed runner saw), publish a "
        "repair command (ACCEPT_COMMITTED if the batch is there, ACCEPT_ABSENT if not), then "
        "resume again."
    )
    observed = f"no pending record; tail of {len(tail)} digests; {evidence(slot)}"
    return withhold(
        ambiguous,
        event,
        REASON_RECORD_MISMATCH,
        why,
        suffix,
        action=action,
        alert=True,
        observed=observed,
    )


def reconcile(
    state: SessionState, event: ResumeEvent, position: int, suffix: AnswerSuffix
) -> tuple[SessionState, Decision]:
    slot, pending = state.slot, event.pending
    if pending is None:
        if slot is not None and slot.status in UNRESOLVED:
            if event.causal is not None and not slot.held:
                return _uncovered_append(state, event, suffix, slot)
            why = f"the checkpoint carries no pending write but intent {slot.intent_id} is open"
            reason = REASON_HELD_NOT_SETTLED if slot.held else REASON_RECORD_MISMATCH
            return withhold(state, event, reason, why, suffix, alert=slot.held)
        return grant(
            state,
            event,
            position,
            VERDICT_CONTINUE,
            REASON_NO_PENDING_WRITE,
            CLS_NONE,
            suffix,
        )
    if slot is None:  # fold_resume parks every resume naming an unknown intent
        raise CoreError("reconcile reached without an intent slot", session_id=state.session_id)
    if pending.intent_id != slot.intent_id:
        why = f"the checkpoint names superseded intent {pending.intent_id}"
        return withhold(state, event, REASON_STALE_CHECKPOINT, why, suffix, action=ACTION_NEWER)
    if not record_matches(slot, event):
        why = "the checkpoint's pending-write record disagrees with the registered intent"
        return withhold(state, event, REASON_RECORD_MISMATCH, why, suffix, alert=True)
    if slot.status is SLOT_HELD:
        tail = event.observed_tail
        if len(tail) >= len(slot.items) and tail[-len(slot.items) :] == batch_of(slot):
            violated = replace(state, health=HEALTH_VIOLATED, health_reason=REASON_GATE_VIOLATION)
            why = "the held batch is already in the Session before its release"
            return withhold(violated, event, REASON_GATE_VIOLATION, why, suffix, alert=True)
        return grant(state, event, position, VERDICT_CONTINUE, REASON_HELD_RIDES, CLS_NONE, suffix)
    if slot.status in (SLOT_DISCARDED, SLOT_ABANDONED):
        why = f"intent {slot.intent_id} was {slot.status.lower()}"
        return withhold(state, event, REASON_ABANDONED, why, suffix, action=ACTION_NEWER)
    if slot.status is SLOT_COMMITTED:
        if (slot.committed_by_store or slot.committed_by_runner) and not _tail_ends_with_batch(
            state, slot, event
        ):
            return _history_changed(state, event, suffix, slot)
        reason = REASON_COMMITTED_BY_STORE if slot.committed_by_store else REASON_KNOWN_COMMITTED
        return grant(state, event, position, VERDICT_CONTINUE, reason, CLS_NONE, suffix)
    if slot.status is SLOT_ABSENT:
        return grant(
            state,
            event,
            position,
            VERDICT_APPEND_ONCE,
            REASON_ACCEPTED_ABSENT,
            CLS_NONE,
            suffix,
            new_attempt(slot),
        )
    return classify_open(state, event, position, suffix, slot, pending)
