"""Resumes: park the ones that name an unknown intent, gate the rest, answer parked ones."""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.answers import withhold
from engine.core.authority import lease_active
from engine.core.decide import (
    ACTION_BINDING,
    ACTION_LOST_INTENT,
    ACTION_NEWER,
    ACTION_WAIT,
    decide,
    make_trail,
)
from engine.core.events import (
    AnswerSuffix,
    Decision,
    Reason,
    ResumeEvent,
)
from engine.core.members import (
    HEALTH_CLEAR,
    HEALTH_VIOLATED,
    REASON_AWAITING_INTENT,
    REASON_BINDING_MISMATCH,
    REASON_CHECKPOINT_ALREADY_RESUMED,
    REASON_HELD_BY_OTHER,
    REASON_INTENT_NEVER_ARRIVED,
    REASON_PARKED_OVERFLOW,
    REASON_SESSION_AMBIGUOUS,
    REASON_SESSION_VIOLATED,
    REASON_STALE_CHECKPOINT,
    STEP_WHY,
    SUFFIX_FINAL,
    SUFFIX_FIRST,
    VERDICT_DEFERRED,
)
from engine.core.reconcile import reconcile
from engine.core.state import (
    PARK_MS,
    PARKED_LIMIT,
    UNRESOLVED,
    ParkedResume,
    SessionState,
)


def fold_resume(
    state: SessionState, event: ResumeEvent, position: int
) -> tuple[SessionState, list[Decision]]:
    foreign = event.checkpoint_session_id
    if foreign is not None and foreign != event.session_id:
        why = f"the checkpoint belongs to session {foreign}, not to {event.session_id}"
        new_state, decision = withhold(
            state, event, REASON_BINDING_MISMATCH, why, SUFFIX_FIRST, action=ACTION_BINDING
        )
        return new_state, [decision]
    if awaits(state, event):
        return _park(state, event, position)
    new_state, decision = evaluate_resume(state, event, position, SUFFIX_FIRST)
    return new_state, [decision]


def awaits(state: SessionState, event: ResumeEvent) -> bool:
    """Whether the checkpoint refers to writes the engine has not folded yet.

    It knew a later write than the engine has seen (the intents topic is behind the resumes
    topic), or names an intent the engine has not seen, or a released batch whose RELEASE has
    not arrived, or it has no record while the write it knew is still open here. Judging it
    now would answer on a state that is behind the checkpoint; it is DEFERRED instead and
    answered when the intents and acks catch up.
    """
    slot, pending = state.slot, event.pending
    if event.checkpoint_sequence != state.progress_sequence:
        # Ahead: wait for the intents. Behind: a stale checkpoint, judged as such now.
        return event.checkpoint_sequence > state.progress_sequence
    if pending is None:
        if event.causal is not None:
            # A v3 resume names what its checkpoint's runner had published: an ack it sent
            # before saving the checkpoint is folded already (`causal.py`), so an open write
            # now is one the checkpoint never covered, decided at once (`reconcile`).
            return False
        # The runner dropped the record only after its append returned and was acked (client
        # contract): the ack of that open write is on its way.
        open_write = slot is not None and slot.status in UNRESOLVED and not slot.held
        return open_write and slot is not None and event.checkpoint_sequence >= slot.sequence
    if slot is None or pending.intent_id not in (slot.intent_id, state.previous_intent_id):
        return True
    return pending.intent_id == slot.intent_id and slot.held and not pending.held


def _park(
    state: SessionState, event: ResumeEvent, position: int
) -> tuple[SessionState, list[Decision]]:
    """DEFERRED now; the final answer comes with the intent, or when it is overdue or evicted."""
    parked = [*state.parked_resumes, ParkedResume(resume=event, position=position)]
    evicted, kept = parked[:-PARKED_LIMIT], parked[-PARKED_LIMIT:]
    decisions = [deferred(state, event)]
    new_state = replace(state, parked_resumes=kept)
    # A state written before copies were kept out (SPEC.md §6) can hold two of one event id:
    # an evicted copy is answered only when no other copy of it waits on.
    still = {p.resume.event_id for p in kept}
    for old in evicted:
        if old.resume.event_id in still:
            continue
        still.add(old.resume.event_id)
        why = f"more than {PARKED_LIMIT} resumes wait for unregistered intents; oldest answered"
        decisions.append(_final_withhold(new_state, old.resume, REASON_PARKED_OVERFLOW, why))
    return new_state, decisions


def deferred(state: SessionState, event: ResumeEvent) -> Decision:
    """The first answer of a resume that waits, and of every copy of it while it waits."""
    pending = event.pending
    named = "no pending write" if pending is None else f"intent {pending.intent_id}"
    why = f"the checkpoint ({named}, write {event.checkpoint_sequence}) is ahead of the engine"
    return decide(
        state,
        event,
        VERDICT_DEFERRED,
        REASON_AWAITING_INTENT,
        trail=make_trail((STEP_WHY, why)),
        final=False,
    )


def expire_parked(state: SessionState, at_ms: int) -> tuple[SessionState, list[Decision]]:
    """Answer, finally, every parked resume whose intent is overdue at event time ``at_ms``.

    The fold calls this with the time of each intent it folds for the session: the intent a
    checkpoint names was published before the append, hence before the resume, so once the
    session's intents have moved ``PARK_MS`` past the resume without it, it is not coming. A
    runtime may also call it with its intents-topic watermark for sessions nobody writes to.
    """
    overdue: dict[str, ResumeEvent] = {}
    for p in state.parked_resumes:
        if p.resume.event_time_ms + PARK_MS <= at_ms:
            # One answer per event id, even for a state that holds two copies (older engines).
            overdue.setdefault(p.resume.event_id, p.resume)
    if not overdue:
        return state, []
    rest = [p for p in state.parked_resumes if p.resume.event_id not in overdue]
    new_state = replace(state, parked_resumes=rest)
    why = f"its intent did not arrive within {PARK_MS} ms of event time"
    return new_state, [
        _final_withhold(new_state, resume, REASON_INTENT_NEVER_ARRIVED, why)
        for resume in overdue.values()
    ]


def _final_withhold(state: SessionState, event: ResumeEvent, reason: Reason, why: str) -> Decision:
    return withhold(
        state,
        event,
        reason,
        why,
        SUFFIX_FINAL,
        action=ACTION_LOST_INTENT,
        alert=True,
    )[1]


def evaluate_resume(
    state: SessionState, event: ResumeEvent, position: int, suffix: AnswerSuffix
) -> tuple[SessionState, Decision]:
    at = event.event_time_ms
    if state.binding is not None and event.binding != state.binding:
        why = "the resume's backend/namespace/digest scheme differs from the session's binding"
        return withhold(state, event, REASON_BINDING_MISMATCH, why, suffix, action=ACTION_BINDING)
    if state.health is not HEALTH_CLEAR:
        reason = (
            REASON_SESSION_VIOLATED if state.health is HEALTH_VIOLATED else REASON_SESSION_AMBIGUOUS
        )
        why = f"session is {state.health} ({state.health_reason}); only a repair clears it"
        return withhold(state, event, reason, why, suffix)
    if state.granted_checkpoint_id == event.checkpoint_id:
        if lease_active(state, at) and state.holder != event.runner_id:
            why = f"checkpoint already granted to {state.holder} (fence {state.fence_token})"
            return withhold(state, event, REASON_HELD_BY_OTHER, why, suffix, action=ACTION_WAIT)
        why = "this checkpoint was already resumed once; its copies may not run again"
        return withhold(
            state, event, REASON_CHECKPOINT_ALREADY_RESUMED, why, suffix, action=ACTION_NEWER
        )
    if event.checkpoint_sequence < state.progress_sequence:
        why = (
            f"checkpoint knew write {event.checkpoint_sequence}, "
            f"session reached {state.progress_sequence}"
        )
        return withhold(state, event, REASON_STALE_CHECKPOINT, why, suffix, action=ACTION_NEWER)
    if lease_active(state, at) and state.holder != event.runner_id:
        why = f"{state.holder} holds authority (fence {state.fence_token})"
        why += f" until {state.lease_expires_ms} ms"
        return withhold(state, event, REASON_HELD_BY_OTHER, why, suffix, action=ACTION_WAIT)
    return reconcile(state, event, position, suffix)
