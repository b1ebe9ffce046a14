"""The two answers to a resume that reached reconciliation: withhold, or grant with a fence."""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.decide import (
    ACTION_REPAIR,
    decide,
    evidence,
    make_trail,
)
from engine.core.events import (
    AnswerSuffix,
    Classification,
    Decision,
    Reason,
    ResumeEvent,
    Verdict,
)
from engine.core.members import (
    CLS_NONE,
    STEP_AUTHORITY,
    STEP_CLASSIFICATION,
    STEP_EVIDENCE,
    STEP_OBSERVED,
    STEP_WHY,
    VERDICT_WITHHELD,
)
from engine.core.state import (
    LEASE_MS,
    IntentSlot,
    SessionState,
)


def withhold(
    state: SessionState,
    event: ResumeEvent,
    reason: Reason,
    why: str,
    suffix: AnswerSuffix,
    *,
    action: str | None = ACTION_REPAIR,
    classification: Classification = CLS_NONE,
    alert: bool = False,
    observed: str = "",
) -> tuple[SessionState, Decision]:
    trail = make_trail(
        (STEP_OBSERVED, observed or f"resume {event.checkpoint_id} by {event.runner_id}"),
        (STEP_CLASSIFICATION, str(classification)),
        (STEP_AUTHORITY, f"withheld; holder={state.holder} fence={state.fence_token}"),
        (STEP_WHY, why),
    )
    return state, decide(
        state,
        event,
        VERDICT_WITHHELD,
        reason,
        trail=trail,
        classification=classification,
        action=action,
        alert=alert,
        suffix=suffix,
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
    state = replace(
        state,
        slot=state.slot if slot is None else slot,
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
            STEP_OBSERVED,
            f"resume {event.checkpoint_id} by {event.runner_id}, tail {len(event.observed_tail)}",
        ),
        (STEP_EVIDENCE, evidence(state.slot)),
        (STEP_CLASSIFICATION, str(classification)),
        (STEP_AUTHORITY, f"granted to {event.runner_id} with fence {fence}"),
        (STEP_WHY, str(reason)),
    )
    return state, decide(
        state, event, verdict, reason, trail=trail, classification=classification, suffix=suffix
    )
