"""Inputs that arrived ahead of what they refer to, and their final answers.

The three input topics are read in whatever order the brokers deliver them, so an ack can come
before its intent, a holder's intent before the resume that granted its fence, a resume before
the intent its checkpoint names. Such an input is answered at once (RECORDED PARKED, or DEFERRED
for a resume) and waits; after every folded event, `drain` answers, finally, each waiting input
that has become ready (``decision_id = event_id + "/final"``), until none is. Evicted or overdue
inputs are answered finally too (`resumes.expire_parked`, the bounds in `state.py`).
"""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.acks import ack_ready, fold_ack
from engine.core.decide import decide, make_trail, reject, with_
from engine.core.events import AnswerSuffix, Decision, IntentEvent, Reason, TrailStep, Verdict
from engine.core.intents import fold_intent
from engine.core.resumes import awaits, evaluate_resume
from engine.core.state import PARKED_WRITES_LIMIT, SessionState


def fence_ahead(state: SessionState, fence_token: int | None) -> bool:
    return fence_token is not None and fence_token > state.fence_token


def park_intent(state: SessionState, event: IntentEvent) -> tuple[SessionState, list[Decision]]:
    """A holder's intent under a fence whose grant the engine has not folded yet."""
    parked = [*state.parked_intents, event]
    evicted, kept = parked[:-PARKED_WRITES_LIMIT], parked[-PARKED_WRITES_LIMIT:]
    new_state = with_(state, parked_intents=kept)
    why = f"fence {event.fence_token} is ahead of the engine's {state.fence_token}"
    decisions = [
        decide(
            state, event, Verdict.RECORDED, Reason.PARKED, trail=make_trail((TrailStep.WHY, why))
        )
    ]
    for old in evicted:
        why = f"no grant of fence {old.fence_token} arrived while {PARKED_WRITES_LIMIT} waited"
        decisions.append(reject(new_state, old, Reason.UNKNOWN_FENCE, why, AnswerSuffix.FINAL))
    return new_state, decisions


def _final(decision: Decision) -> Decision:
    if decision.decision_id.endswith(AnswerSuffix.FINAL):
        return decision
    return replace(decision, decision_id=decision.in_reply_to + AnswerSuffix.FINAL)


def drain(state: SessionState) -> tuple[SessionState, list[Decision]]:
    """Answer every waiting input that is ready now, oldest first, until none is."""
    decisions: list[Decision] = []
    while True:
        intent = next(
            (i for i in state.parked_intents if not fence_ahead(state, i.fence_token)), None
        )
        if intent is not None:
            rest = [i for i in state.parked_intents if i.event_id != intent.event_id]
            state, decision = fold_intent(with_(state, parked_intents=rest), intent)
            decisions.append(_final(decision))
            continue
        ack = next((a for a in state.parked_acks if ack_ready(state, a)), None)
        if ack is not None:
            rest_acks = [a for a in state.parked_acks if a.event_id != ack.event_id]
            state, decision = fold_ack(with_(state, parked_acks=rest_acks), ack, AnswerSuffix.FINAL)
            decisions.append(decision)
            continue
        parked = next((p for p in state.parked_resumes if not awaits(state, p.resume)), None)
        if parked is None:
            return state, decisions
        rest_resumes = [
            p for p in state.parked_resumes if p.resume.event_id != parked.resume.event_id
        ]
        state, decision = evaluate_resume(
            with_(state, parked_resumes=rest_resumes),
            parked.resume,
            parked.position,
            AnswerSuffix.FINAL,
        )
        decisions.append(decision)
