"""The decision builder shared by every handler: trail, answer, state copy, operator actions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from msgspec.structs import replace

from engine.core.events import (
    AnswerSuffix,
    Classification,
    Decision,
    Event,
    Fence,
    Reason,
    RunnerAction,
    TrailEntry,
    TrailStep,
    Verdict,
)
from engine.core.state import (
    RECENT_EVENT_IDS,
    IntentSlot,
    SessionState,
)

ACTION_REPAIR = (
    "Inspect the Session tail against the intent's digests, then publish a repair command "
    "(ACCEPT_COMMITTED, ACCEPT_ABSENT or ABANDON) with actor and reason."
)
ACTION_WAIT = "Wait for the current holder's lease to lapse or for it to finish; do not resume."
ACTION_NEWER = "Resume from the session's newest checkpoint; this one is behind the session."
ACTION_LOST_INTENT = (
    "The checkpoint names a pending write the engine never saw registered: check that the "
    "runner publishes its intent before appending, inspect the Session tail, then resume from a "
    "newer checkpoint or publish a repair command."
)
ACTION_BINDING = "Resume against the backend, namespace and digest scheme the session is bound to."


@dataclass(frozen=True)
class FoldResult:
    state: SessionState
    decisions: tuple[Decision, ...]


def make_trail(*entries: tuple[TrailStep, str]) -> list[TrailEntry]:
    return [TrailEntry(step=step, detail=detail) for step, detail in entries]


def decide(
    state: SessionState,
    event: Event,
    verdict: Verdict,
    reason: Reason,
    *,
    trail: list[TrailEntry] | None = None,
    classification: Classification = Classification.NONE,
    action: str | None = None,
    alert: bool = False,
    final: bool = True,
    suffix: AnswerSuffix = AnswerSuffix.FIRST,
    runner_action: RunnerAction | None = None,
) -> Decision:
    granted = verdict in (Verdict.CONTINUE, Verdict.APPEND_ONCE)
    fence: Fence | None = None
    if granted and state.binding is not None:
        fence = Fence.STORE_ENFORCED if state.binding.store_enforces_fence else Fence.ADVISORY
    return Decision(
        decision_id=event.event_id + suffix,
        session_id=state.session_id,
        in_reply_to=event.event_id,
        verdict=verdict,
        reason=reason,
        fence_token=state.fence_token if state.fence_token > 0 else None,
        fence=fence,
        holder=state.holder,
        classification=classification,
        operator_action=action,
        alert=alert,
        final=final,
        event_time_ms=event.event_time_ms,
        trail=trail or [],
        runner_action=runner_action or action_of(verdict, reason),
    )


def action_of(verdict: Verdict, reason: Reason) -> RunnerAction:
    """The runner action a verdict and reason stand for (README: "Runner actions")."""
    if verdict is Verdict.APPEND_ONCE:
        return RunnerAction.APPEND_ONCE
    if verdict is Verdict.CONTINUE:
        return (
            RunnerAction.RELEASE_HELD if reason is Reason.HELD_RIDES else RunnerAction.DO_NOT_REPLAY
        )
    if verdict is Verdict.DEFERRED:
        return RunnerAction.WAIT
    if verdict in (Verdict.WITHHELD, Verdict.REJECTED):
        return RunnerAction.STOP
    return RunnerAction.NONE


def with_(state: SessionState, **changes: Any) -> SessionState:
    return replace(state, **changes)


def _remember(state: SessionState, event_id: str) -> SessionState:
    recent = [*state.recent_event_ids, event_id][-RECENT_EVENT_IDS:]
    return with_(state, recent_event_ids=recent)


def reject(
    state: SessionState,
    event: Event,
    reason: Reason,
    why: str,
    suffix: AnswerSuffix = AnswerSuffix.FIRST,
) -> Decision:
    action = ACTION_BINDING if reason is Reason.BINDING_MISMATCH else None
    return decide(
        state,
        event,
        Verdict.REJECTED,
        reason,
        trail=make_trail((TrailStep.WHY, why)),
        action=action,
        suffix=suffix,
    )


def evidence(slot: IntentSlot | None) -> str:
    if slot is None:
        return "no intent registered"
    flags = [
        name
        for name, on in (
            ("store-ack", slot.committed_by_store),
            ("runner-ack", slot.committed_by_runner),
            ("not-written", slot.not_written),
            ("partial-seen", slot.partial_seen),
        )
        if on
    ]
    return f"intent {slot.intent_id} {slot.status} [{', '.join(flags)}]"
