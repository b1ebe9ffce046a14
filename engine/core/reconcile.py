"""Reconcile a resume against the slot: the record check, the classification, the grant."""

from __future__ import annotations

from typing import Any

from engine.core.classify import classify
from engine.core.decide import (
    ACTION_NEWER,
    ACTION_REPAIR,
    decide,
    evidence,
    make_trail,
    with_,
)
from engine.core.errors import CoreError
from engine.core.events import (
    AnswerSuffix,
    Classification,
    Decision,
    PendingRecord,
    Reason,
    ResumeEvent,
    TrailStep,
    Verdict,
)
from engine.core.state import (
    LEASE_MS,
    UNRESOLVED,
    Health,
    IntentSlot,
    SessionState,
    SlotStatus,
)


def withhold(
    state: SessionState,
    event: ResumeEvent,
    reason: Reason,
    why: str,
    suffix: AnswerSuffix,
    *,
    action: str | None = ACTION_REPAIR,
    classification: Classification = Classification.NONE,
    alert: bool = False,
    observed: str = "",
) -> tuple[SessionState, Decision]:
    trail = make_trail(
        (TrailStep.OBSERVED, observed or f"resume {event.checkpoint_id} by {event.runner_id}"),
        (TrailStep.CLASSIFICATION, classification.value),
        (TrailStep.AUTHORITY, f"withheld; holder={state.holder} fence={state.fence_token}"),
        (TrailStep.WHY, why),
    )
    return state, decide(
        state,
        event,
        Verdict.WITHHELD,
        reason,
        trail=trail,
        classification=classification,
        action=action,
        alert=alert,
        suffix=suffix,
    )


def record_matches(slot: IntentSlot, event: ResumeEvent) -> bool:
    pending = event.pending
    if pending is None:
        raise CoreError("record check needs a pending record")
    if pending.items != slot.items or pending.held != (slot.status is SlotStatus.HELD):
        return False
    if pending.persisted_count != slot.persisted_count:
        return False
    # Compared every time, not only while the write is open: a record edited after the engine
    # resolved its intent would send the client down the SDK's first-attempt path again.
    return slot.held or pending.before == slot.before


def _tail_ends_with_batch(state: SessionState, slot: IntentSlot, event: ResumeEvent) -> bool:
    """Whether the tail the resume observed still ends with exactly ``before`` + batch.

    On a binding whose stored items do not digest like the appended ones, only ``before`` and
    the batch's length can be compared: the batch's own digests are the backend's rewrite.
    """
    before, batch, tail = slot.before or [], slot.batch, event.observed_tail
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
    ambiguous = with_(state, health=Health.AMBIGUOUS, health_reason=Reason.HISTORY_CHANGED)
    why = "the append was acknowledged committed, but the tail is no longer before + batch"
    observed = f"tail of {len(event.observed_tail)} digests; {evidence(slot)}"
    return withhold(
        ambiguous, event, Reason.HISTORY_CHANGED, why, suffix, alert=True, observed=observed
    )


def new_attempt(slot: IntentSlot) -> IntentSlot:
    """An APPEND_ONCE grant opens a new attempt of the intent.

    Evidence belongs to one attempt: a definite failure or a lost ack of an earlier append says
    nothing about the append the new holder makes now, so it must not poison its COMMITTED ack.
    """
    return slot.model_copy(
        update={
            "status": SlotStatus.APPEND_GRANTED,
            "not_written": False,
            "committed_by_store": False,
            "committed_by_runner": False,
            "partial_seen": False,
        }
    )


def reconcile(
    state: SessionState, event: ResumeEvent, position: int, suffix: AnswerSuffix
) -> tuple[SessionState, Decision]:
    slot, pending = state.slot, event.pending
    if pending is None:
        if slot is not None and slot.status in UNRESOLVED:
            why = f"the checkpoint carries no pending write but intent {slot.intent_id} is open"
            reason = Reason.HELD_NOT_SETTLED if slot.held else Reason.RECORD_MISMATCH
            return withhold(state, event, reason, why, suffix, alert=slot.held)
        return grant(
            state,
            event,
            position,
            Verdict.CONTINUE,
            Reason.NO_PENDING_WRITE,
            Classification.NONE,
            suffix,
        )
    if slot is None:  # fold_resume parks every resume naming an unknown intent
        raise CoreError("reconcile reached without an intent slot", session_id=state.session_id)
    if pending.intent_id != slot.intent_id:
        why = f"the checkpoint names superseded intent {pending.intent_id}"
        return withhold(state, event, Reason.STALE_CHECKPOINT, why, suffix, action=ACTION_NEWER)
    if not record_matches(slot, event):
        why = "the checkpoint's pending-write record disagrees with the registered intent"
        return withhold(state, event, Reason.RECORD_MISMATCH, why, suffix, alert=True)
    if slot.status is SlotStatus.HELD:
        tail = event.observed_tail
        if len(tail) >= len(slot.items) and tail[-len(slot.items) :] == slot.batch:
            violated = with_(state, health=Health.VIOLATED, health_reason=Reason.GATE_VIOLATION)
            why = "the held batch is already in the Session before its release"
            return withhold(violated, event, Reason.GATE_VIOLATION, why, suffix, alert=True)
        return grant(
            state, event, position, Verdict.CONTINUE, Reason.HELD_RIDES, Classification.NONE, suffix
        )
    if slot.status in (SlotStatus.DISCARDED, SlotStatus.ABANDONED):
        why = f"intent {slot.intent_id} was {slot.status.value.lower()}"
        return withhold(state, event, Reason.ABANDONED, why, suffix, action=ACTION_NEWER)
    if slot.status is SlotStatus.COMMITTED:
        if (slot.committed_by_store or slot.committed_by_runner) and not _tail_ends_with_batch(
            state, slot, event
        ):
            return _history_changed(state, event, suffix, slot)
        reason = Reason.COMMITTED_BY_STORE if slot.committed_by_store else Reason.KNOWN_COMMITTED
        return grant(state, event, position, Verdict.CONTINUE, reason, Classification.NONE, suffix)
    if slot.status is SlotStatus.ABSENT:
        return grant(
            state,
            event,
            position,
            Verdict.APPEND_ONCE,
            Reason.ACCEPTED_ABSENT,
            Classification.NONE,
            suffix,
            new_attempt(slot),
        )
    return _classify_open(state, event, position, suffix, slot, pending)


def _classify_open(
    state: SessionState,
    event: ResumeEvent,
    position: int,
    suffix: AnswerSuffix,
    slot: IntentSlot,
    pending: PendingRecord,
) -> tuple[SessionState, Decision]:
    """The SDK's classification of an open write, on the tail the resume observed.

    The record's ``append_acknowledged`` is the checkpoint's claim, not evidence: the engine
    classifies as if it were unset (only acks it folded count). A claim the tail does not prove
    committed is a contradiction, and nothing is granted on a contradiction.
    """
    chunk = state.binding.chunk_size if state.binding else None
    claimed = pending.append_acknowledged
    cls = classify(
        observed=event.observed_tail,
        before=[] if claimed and pending.before is None else pending.before,
        batch=slot.batch,
        append_acknowledged=False,
        chunk_size=chunk,
    )
    observed = (
        f"tail of {len(event.observed_tail)} digests vs "
        f"before {len(pending.before or [])} + batch {len(slot.items)}"
    )
    if claimed and cls is not Classification.COMMITTED:
        ambiguous = with_(state, health=Health.AMBIGUOUS, health_reason=Reason.AMBIGUOUS)
        why = (
            "the checkpoint claims the append was acknowledged, the engine folded no committed "
            "ack for this attempt and the tail does not prove it"
        )
        return withhold(
            ambiguous,
            event,
            Reason.AMBIGUOUS,
            why,
            suffix,
            classification=cls,
            alert=True,
            observed=observed,
        )
    if cls is Classification.NOT_STARTED:
        return grant(
            state,
            event,
            position,
            Verdict.APPEND_ONCE,
            Reason.APPEND_NOT_STARTED,
            cls,
            suffix,
            new_attempt(slot),
        )
    if cls is Classification.COMMITTED:
        if slot.not_written:
            why = "tail matches the batch but the append definitively failed: not our authorship"
            return withhold(
                state,
                event,
                Reason.CONTENT_NOT_AUTHORSHIP,
                why,
                suffix,
                classification=cls,
                alert=True,
                observed=observed,
            )
        committed = slot.model_copy(update={"status": SlotStatus.COMMITTED})
        return grant(
            state, event, position, Verdict.CONTINUE, Reason.COMMITTED, cls, suffix, committed
        )
    binding = state.binding
    unstable = binding is not None and not binding.items_digest_stable
    if cls is Classification.UNCHANGED and binding and unstable and not slot.not_written:
        ambiguous = with_(state, health=Health.AMBIGUOUS, health_reason=Reason.DIGEST_UNSTABLE)
        why = (
            f"backend {binding.backend_id} does not store items that digest like the appended "
            "ones: an unchanged-looking tail is no evidence the batch is absent"
        )
        return withhold(
            ambiguous,
            event,
            Reason.DIGEST_UNSTABLE,
            why,
            suffix,
            classification=cls,
            alert=True,
            observed=observed,
        )
    if cls is Classification.UNCHANGED:
        return grant(
            state,
            event,
            position,
            Verdict.APPEND_ONCE,
            Reason.UNCHANGED,
            cls,
            suffix,
            new_attempt(slot),
        )
    reason = Reason.PARTIAL_COMMIT if cls is Classification.PARTIAL else Reason.AMBIGUOUS
    new_slot = slot.model_copy(
        update={"partial_seen": slot.partial_seen or cls is Classification.PARTIAL}
    )
    ambiguous = with_(state, slot=new_slot, health=Health.AMBIGUOUS, health_reason=reason)
    why = "history changed or is ambiguous: neither or both of committed/unchanged hold"
    return withhold(
        ambiguous, event, reason, why, suffix, classification=cls, alert=True, observed=observed
    )


def grant(
    state: SessionState,
    event: ResumeEvent,
    position: int,
    verdict: Verdict,
    reason: Reason,
    classification: Classification,
    suffix: AnswerSuffix,
    slot: IntentSlot | None = None,
) -> tuple[SessionState, Decision]:
    """Grant authority; ``slot`` (if given) replaces the session's slot in the same update."""
    fence = max(state.fence_token + 1, position)
    changes: dict[str, Any] = {} if slot is None else {"slot": slot}
    state = with_(
        state,
        **changes,
        holder=event.runner_id,
        fence_token=fence,
        lease_expires_ms=event.event_time_ms + LEASE_MS,
        grant_request_id=event.event_id,
        grant_verdict=verdict,
        granted_checkpoint_id=event.checkpoint_id,
        progress_sequence=max(state.progress_sequence, event.checkpoint_sequence),
        binding=state.binding or event.binding,
    )
    trail = make_trail(
        (
            TrailStep.OBSERVED,
            f"resume {event.checkpoint_id} by {event.runner_id}, tail {len(event.observed_tail)}",
        ),
        (TrailStep.EVIDENCE, evidence(state.slot)),
        (TrailStep.CLASSIFICATION, classification.value),
        (TrailStep.AUTHORITY, f"granted to {event.runner_id} with fence {fence}"),
        (TrailStep.WHY, reason.value),
    )
    return state, decide(
        state, event, verdict, reason, trail=trail, classification=classification, suffix=suffix
    )
