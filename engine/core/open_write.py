"""An open write classified on the tail a resume observed, as the SDK does (plus attempts,
claims and digest stability)."""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.answers import grant, withhold
from engine.core.classify import classify
from engine.core.decide import batch_of
from engine.core.events import (
    AnswerSuffix,
    Decision,
    PendingRecord,
    ResumeEvent,
)
from engine.core.members import (
    CLS_COMMITTED,
    CLS_NOT_STARTED,
    CLS_PARTIAL,
    CLS_UNCHANGED,
    HEALTH_AMBIGUOUS,
    REASON_AMBIGUOUS,
    REASON_APPEND_NOT_STARTED,
    REASON_COMMITTED,
    REASON_CONTENT_NOT_AUTHORSHIP,
    REASON_DIGEST_UNSTABLE,
    REASON_PARTIAL_COMMIT,
    REASON_UNCHANGED,
    SLOT_APPEND_GRANTED,
    SLOT_COMMITTED,
    VERDICT_APPEND_ONCE,
    VERDICT_CONTINUE,
)
from engine.core.state import (
    IntentSlot,
    SessionState,
)


def new_attempt(slot: IntentSlot) -> IntentSlot:
    """An APPEND_ONCE grant opens a new attempt of the intent.

    Evidence belongs to one attempt: a definite failure or a lost ack of an earlier append says
    nothing about the append the new holder makes now, so it must not poison its COMMITTED ack.
    """
    return replace(
        slot,
        status=SLOT_APPEND_GRANTED,
        not_written=False,
        committed_by_store=False,
        committed_by_runner=False,
        partial_seen=False,
    )


def classify_open(
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
        batch=batch_of(slot),
        append_acknowledged=False,
        chunk_size=chunk,
    )
    if claimed and cls is not CLS_COMMITTED:
        ambiguous = replace(state, health=HEALTH_AMBIGUOUS, health_reason=REASON_AMBIGUOUS)
        why = (
            "the checkpoint claims the append was acknowledged, the engine folded no committed "
            "ack for this attempt and the tail does not prove it"
        )
        return withhold(
            ambiguous,
            event,
            REASON_AMBIGUOUS,
            why,
            suffix,
            classification=cls,
            alert=True,
            observed=_observed(event, pending, slot),
        )
    if cls is CLS_NOT_STARTED:
        return grant(
            state,
            event,
            position,
            VERDICT_APPEND_ONCE,
            REASON_APPEND_NOT_STARTED,
            cls,
            suffix,
            new_attempt(slot),
        )
    if cls is CLS_COMMITTED:
        if slot.not_written:
            why = "tail matches the batch but the append definitively failed: not our authorship"
            return withhold(
                state,
                event,
                REASON_CONTENT_NOT_AUTHORSHIP,
                why,
                suffix,
                classification=cls,
                alert=True,
                observed=_observed(event, pending, slot),
            )
        committed = replace(slot, status=SLOT_COMMITTED)
        return grant(
            state, event, position, VERDICT_CONTINUE, REASON_COMMITTED, cls, suffix, committed
        )
    binding = state.binding
    unstable = binding is not None and not binding.items_digest_stable
    if cls is CLS_UNCHANGED and binding and unstable and not slot.not_written:
        ambiguous = replace(state, health=HEALTH_AMBIGUOUS, health_reason=REASON_DIGEST_UNSTABLE)
        why = (
            f"backend {binding.backend_id} does not store items that digest like the appended "
            "ones: an unchanged-looking tail is no evidence the batch is absent"
        )
        return withhold(
            ambiguous,
            event,
            REASON_DIGEST_UNSTABLE,
            why,
            suffix,
            classification=cls,
            alert=True,
            observed=_observed(event, pending, slot),
        )
    if cls is CLS_UNCHANGED:
        return grant(
            state,
            event,
            position,
            VERDICT_APPEND_ONCE,
            REASON_UNCHANGED,
            cls,
            suffix,
            new_attempt(slot),
        )
    reason = REASON_PARTIAL_COMMIT if cls is CLS_PARTIAL else REASON_AMBIGUOUS
    new_slot = replace(slot, partial_seen=slot.partial_seen or cls is CLS_PARTIAL)
    ambiguous = replace(state, slot=new_slot, health=HEALTH_AMBIGUOUS, health_reason=reason)
    why = "history changed or is ambiguous: neither or both of committed/unchanged hold"
    observed = _observed(event, pending, slot)
    return withhold(
        ambiguous, event, reason, why, suffix, classification=cls, alert=True, observed=observed
    )


def _observed(event: ResumeEvent, pending: PendingRecord, slot: IntentSlot) -> str:
    """The trail's observation of a withheld open write (a grant's trail names the tail
    itself: `answers.grant`), built only on the way to that answer."""
    return (
        f"tail of {len(event.observed_tail)} digests vs "
        f"before {len(pending.before or [])} + batch {len(slot.items)}"
    )
