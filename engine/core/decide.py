"""The decision builder shared by every handler: trail, answer, operator actions."""

from __future__ import annotations

from typing import Final, final

from engine.core.events import (
    GRANTING_VERDICTS,
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
from engine.core.members import (
    CLS_NONE,
    FENCE_ADVISORY,
    FENCE_STORE_ENFORCED,
    REASON_BINDING_MISMATCH,
    REASON_HELD_RIDES,
    RUNNER_NONE,
    RUNNER_RELEASE_HELD,
    STEP_WHY,
    SUFFIX_FIRST,
    VERDICT_CONTINUE,
    VERDICT_REJECTED,
)
from engine.core.state import IntentSlot, SessionState

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

# Looked up at every decision, instead of reading members off enum classes (`members`: why).
_GRANTING: Final = GRANTING_VERDICTS
_ACTION_OF_VERDICT: Final[dict[Verdict, RunnerAction]] = {
    Verdict.APPEND_ONCE: RunnerAction.APPEND_ONCE,
    Verdict.CONTINUE: RunnerAction.DO_NOT_REPLAY,  # RELEASE_HELD for HELD_RIDES (action_of)
    Verdict.DEFERRED: RunnerAction.WAIT,
    Verdict.WITHHELD: RunnerAction.STOP,
    Verdict.REJECTED: RunnerAction.STOP,
}


@final
class FoldResult:
    """The new state of the session and the decisions of one folded event, in order.

    A plain class with read-only attributes rather than a frozen dataclass: mypyc compiles this
    constructor, while a dataclass's generated ``__init__`` runs interpreted, once per event.
    """

    def __init__(self, state: SessionState, decisions: tuple[Decision, ...]) -> None:
        self.state: Final = state
        self.decisions: Final = decisions

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FoldResult):
            return NotImplemented
        return self.state == other.state and self.decisions == other.decisions

    def __repr__(self) -> str:
        return f"FoldResult(state={self.state!r}, decisions={self.decisions!r})"


def make_trail(*entries: tuple[TrailStep, str]) -> list[TrailEntry]:
    return [TrailEntry(step=step, detail=detail) for step, detail in entries]


def decide(
    state: SessionState,
    event: Event,
    verdict: Verdict,
    reason: Reason,
    *,
    trail: list[TrailEntry] | None = None,
    classification: Classification = CLS_NONE,
    action: str | None = None,
    alert: bool = False,
    final: bool = True,
    suffix: AnswerSuffix = SUFFIX_FIRST,
    runner_action: RunnerAction | None = None,
) -> Decision:
    fence: Fence | None = None
    if verdict in _GRANTING and state.binding is not None:
        fence = FENCE_STORE_ENFORCED if state.binding.store_enforces_fence else FENCE_ADVISORY
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
    if verdict is VERDICT_CONTINUE and reason is REASON_HELD_RIDES:
        return RUNNER_RELEASE_HELD
    return _ACTION_OF_VERDICT.get(verdict, RUNNER_NONE)


def reject(
    state: SessionState,
    event: Event,
    reason: Reason,
    why: str,
    suffix: AnswerSuffix = SUFFIX_FIRST,
) -> Decision:
    action = ACTION_BINDING if reason is REASON_BINDING_MISMATCH else None
    return decide(
        state,
        event,
        VERDICT_REJECTED,
        reason,
        trail=make_trail((STEP_WHY, why)),
        action=action,
        suffix=suffix,
    )


def evidence(slot: IntentSlot | None) -> str:
    if slot is None:
        return "no intent registered"
    # Once per grant: plain tests, not a table of pairs built and filtered on every call.
    flags: list[str] = []
    if slot.committed_by_store:
        flags.append("store-ack")
    if slot.committed_by_runner:
        flags.append("runner-ack")
    if slot.not_written:
        flags.append("not-written")
    if slot.partial_seen:
        flags.append("partial-seen")
    return f"intent {slot.intent_id} {slot.status} [{', '.join(flags)}]"


def batch_of(slot: IntentSlot) -> list[str]:
    """``slot.batch`` (the batch's digests) for the compiled modules: the property runs
    interpreted, as the struct modules are not compiled (~0.4 us a call)."""
    return [facts.digest for facts in slot.items]
