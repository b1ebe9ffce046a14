"""Resumes: park the ones that name an unknown intent, gate the rest, answer parked ones."""

from __future__ import annotations

from engine.core.acks import ack_answer, apply_ack
from engine.core.decide import (
    ACTION_BINDING,
    ACTION_NEWER,
    ACTION_WAIT,
    decide,
    make_trail,
    with_,
)
from engine.core.events import (
    AnswerSuffix,
    Decision,
    Reason,
    ResumeEvent,
    TrailStep,
    Verdict,
)
from engine.core.reconcile import reconcile, withhold
from engine.core.state import (
    PARKED_LIMIT,
    Health,
    ParkedResume,
    SessionState,
)


def apply_parked(state: SessionState, intent_id: str) -> tuple[SessionState, list[Decision]]:
    decisions: list[Decision] = []
    acks = [a for a in state.parked_acks if a.intent_id == intent_id]
    if acks:
        state = with_(state, parked_acks=[a for a in state.parked_acks if a.intent_id != intent_id])
        for ack in acks:
            slot = state.slot
            if slot is not None:
                # The ack was answered PARKED on arrival; now that its evidence counts, it gets
                # its final answer (and the alert, if it moved the session out of CLEAR).
                state, reason, alert = apply_ack(state, slot, ack)
                decisions.append(ack_answer(state, ack, reason, alert, AnswerSuffix.FINAL))
    waiting = [
        p
        for p in state.parked_resumes
        if p.resume.pending and p.resume.pending.intent_id == intent_id
    ]
    if waiting:
        rest = [
            p
            for p in state.parked_resumes
            if not (p.resume.pending and p.resume.pending.intent_id == intent_id)
        ]
        state = with_(state, parked_resumes=rest)
        for parked in waiting:
            state, decision = evaluate_resume(
                state, parked.resume, parked.position, AnswerSuffix.FINAL
            )
            decisions.append(decision)
    return state, decisions


def fold_resume(
    state: SessionState, event: ResumeEvent, position: int
) -> tuple[SessionState, Decision]:
    pending = event.pending
    known = (
        state.slot is not None
        and pending is not None
        and (pending.intent_id in (state.slot.intent_id, state.previous_intent_id))
    )
    if pending is not None and not known:
        parked = [*state.parked_resumes, ParkedResume(resume=event, position=position)]
        why = f"the checkpoint names intent {pending.intent_id}, not registered yet"
        return with_(state, parked_resumes=parked[-PARKED_LIMIT:]), decide(
            state,
            event,
            Verdict.DEFERRED,
            Reason.AWAITING_INTENT,
            trail=make_trail((TrailStep.WHY, why)),
            final=False,
        )
    return evaluate_resume(state, event, position, AnswerSuffix.FIRST)


def evaluate_resume(
    state: SessionState, event: ResumeEvent, position: int, suffix: AnswerSuffix
) -> tuple[SessionState, Decision]:
    at = event.event_time_ms
    if state.binding is not None and event.binding != state.binding:
        why = "the resume's backend/namespace/digest scheme differs from the session's binding"
        return withhold(state, event, Reason.BINDING_MISMATCH, why, suffix, action=ACTION_BINDING)
    if state.health is not Health.CLEAR:
        reason = (
            Reason.SESSION_VIOLATED if state.health is Health.VIOLATED else Reason.SESSION_AMBIGUOUS
        )
        why = f"session is {state.health.value} ({state.health_reason}); only a repair clears it"
        return withhold(state, event, reason, why, suffix)
    if state.granted_checkpoint_id == event.checkpoint_id:
        if state.lease_active(at) and state.holder != event.runner_id:
            why = f"checkpoint already granted to {state.holder} (fence {state.fence_token})"
            return withhold(state, event, Reason.HELD_BY_OTHER, why, suffix, action=ACTION_WAIT)
        why = "this checkpoint was already resumed once; its copies may not run again"
        return withhold(
            state, event, Reason.CHECKPOINT_ALREADY_RESUMED, why, suffix, action=ACTION_NEWER
        )
    if event.checkpoint_sequence < state.progress_sequence:
        why = (
            f"checkpoint knew write {event.checkpoint_sequence}, "
            f"session reached {state.progress_sequence}"
        )
        return withhold(state, event, Reason.STALE_CHECKPOINT, why, suffix, action=ACTION_NEWER)
    if state.lease_active(at) and state.holder != event.runner_id:
        why = f"{state.holder} holds authority (fence {state.fence_token})"
        why += f" until {state.lease_expires_ms} ms"
        return withhold(state, event, Reason.HELD_BY_OTHER, why, suffix, action=ACTION_WAIT)
    return reconcile(state, event, position, suffix)
