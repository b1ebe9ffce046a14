"""The fold: ``state + event -> new state + decisions``. Pure, total, deterministic.

Decisions per input (what the engine service can check end to end):

* Every input event gets **exactly one answer decision**, ``decision_id == event_id``:
  intents, acks and repairs get RECORDED or REJECTED; resumes get CONTINUE, APPEND_ONCE,
  WITHHELD or DEFERRED. Duplicates (same ``event_id`` inside the de-duplication window) are
  answered too, with the same ``decision_id``: a duplicate of the granting resume is re-answered
  with the same grant and fence; any other duplicate gets RECORDED/WITHHELD ``DUPLICATE``.
* An input that refers to something not folded yet waits (`parked.py`): a resume whose
  checkpoint is ahead of the engine (DEFERRED), an ack ahead of its intent, fence or release,
  an intent under a fence not granted yet (RECORDED PARKED); that first answer has
  ``final=False``. Each gets one more decision when it is answered for good, ``final=True``
  and ``decision_id == event_id + "/final"``, at the
  latest when it is evicted or ``PARK_MS`` of event time old (SPEC.md §6 "Parked inputs").
* Every decision carries a ``runner_action`` (README "Runner actions").

Authority: at most one holder per session. A grant carries a fence token that only grows
(``max(previous + 1, position)``, the resume's offset in its topic partition). The first
intent of a fresh session makes its runner the implicit holder (fence 0). A holder's lease runs
``LEASE_MS`` of event time from the grant or from its last accepted write; while it runs, other
runners are withheld HELD_BY_OTHER. A granted checkpoint is consumed: another resume of it is
withheld. A resume whose checkpoint knew less than the session's progress is withheld
STALE_CHECKPOINT.

Health: AMBIGUOUS or VIOLATED is sticky; only a repair clears it. Nothing grants on ambiguity.
"""

from __future__ import annotations

from collections.abc import Iterable

from msgspec.structs import force_setattr, replace

from engine.core.acks import ack_ready, fold_ack
from engine.core.causal import (
    answer_waiting_copy as answer_causal_copy,
)
from engine.core.causal import (
    as_final,
    event_of,
    next_ready,
    note,
    overdue,
    wait,
    waits,
    without,
)
from engine.core.decide import (
    ACTION_REPAIR,
    FoldResult,
    action_of,
    decide,
    make_trail,
)
from engine.core.errors import SessionMismatchError
from engine.core.events import (
    AckEvent,
    Decision,
    Event,
    IntentEvent,
    RepairEvent,
    ResumeEvent,
    RunnerAction,
    Verdict,
)
from engine.core.members import (
    HEALTH_CLEAR,
    HEALTH_VIOLATED,
    REASON_DUPLICATE,
    REASON_HELD_RIDES,
    REASON_KNOWN_COMMITTED,
    REASON_REGRANT_DUPLICATE_REQUEST,
    REASON_SESSION_AMBIGUOUS,
    REASON_SESSION_VIOLATED,
    SLOT_HELD,
    STEP_WHY,
    VERDICT_RECORDED,
    VERDICT_WITHHELD,
)
from engine.core.parked import (
    answer_waiting_copy,
    drain,
    expire_overdue,
    expire_writes,
    fold_ready_intent,
    intent_waits,
    park_ack,
    park_intent,
)
from engine.core.repairs import fold_repair
from engine.core.resumes import fold_resume
from engine.core.state import RECENT_EVENT_IDS, CausalWait, SessionState

__all__ = ["FoldResult", "fold", "release_overdue", "release_ready", "replay"]


def _remember(before: SessionState, after: SessionState, event_id: str) -> SessionState:
    """``after`` with ``event_id`` last in its de-duplication window.

    ``after`` is the state this fold built from ``before``: ``before`` itself when the input
    changed nothing, else a new value no one else holds yet (every state a fold returns is
    ``before`` or a `replace` of it). A new one takes the window in place: one copy of the whole
    state per input only to remember its id was the largest single cost of the fold. ``before``,
    the caller's value, is never changed. Nothing the fold reads before returning looks at the
    window, so setting it last gives the state setting it first gave.
    """
    recent = [*after.recent_event_ids, event_id][-RECENT_EVENT_IDS:]
    if after is before:
        return replace(before, recent_event_ids=recent)
    force_setattr(after, "recent_event_ids", recent)
    return after


def fold(state: SessionState | None, event: Event, position: int) -> FoldResult:
    """Fold one event into the session's state. Never raises for any input event (anything
    else is a TypeError)."""
    if state is None:
        state = SessionState(session_id=event.session_id)
    elif state.session_id != event.session_id:
        raise SessionMismatchError(
            state_session_id=state.session_id, event_session_id=event.session_id
        )
    if _waiting(state):
        copy = answer_waiting_copy(state, event)
        if copy is not None:
            return FoldResult(state, (copy,))
    if state.causal_waiting:
        copy = answer_causal_copy(state, event)
        if copy is not None:
            return FoldResult(state, (copy,))
    if event.event_id in state.recent_event_ids or (
        type(event) is ResumeEvent and event.event_id == state.grant_request_id
    ):
        # The granting request is remembered beyond the window: a copy of it gets the same
        # grant again, never a second, different answer under the grant's decision id.
        return FoldResult(state, (_answer_duplicate(state, event),))
    if waits(state, event):
        # A v3 input ahead of an event it names waits for it (`causal.py`).
        waiting, answer, evicted = wait(state, event, position)
        waiting, released = _fold_released(waiting, evicted)
        return FoldResult(_remember(state, waiting, event.event_id), (answer, *released))
    new_state, decisions = _fold_now(state, event, position)
    if new_state.causal_waiting:
        new_state, released = release_ready(new_state)
        decisions = [*decisions, *released]
    return FoldResult(_remember(state, new_state, event.event_id), tuple(decisions))


def _fold_now(
    state: SessionState, event: Event, position: int
) -> tuple[SessionState, list[Decision]]:
    """Fold an input whose causes (if it names any) are all folded."""
    # Draining and expiring only look at waiting inputs: with none (almost every event) they
    # would find nothing, so they are not called.
    settled: list[Decision] = []
    if _waiting(state):
        # Writes that waited too long are judged before this later input is, on the clock of
        # the topic they wait on (SPEC.md §6 "Parked inputs"): an intent times acks waiting
        # for their intent; an intent or a resume, acks of a known attempt waiting for its
        # release or re-arm (judged on that attempt before a resume is); an ack or a resume,
        # re-arms waiting for their failure; a resume, writes waiting for a grant. A repair
        # rides on the intents topic but, like the watermark, times nothing.
        kind = type(event)
        state, settled = expire_writes(
            state,
            event.event_time_ms,
            acks=kind is IntentEvent or kind is ResumeEvent,
            unseen=kind is IntentEvent,
            rearms=kind is AckEvent or kind is ResumeEvent,
            grants=kind is ResumeEvent,
        )
    new_state, decisions = _dispatch(state, event, position)
    new_state = note(new_state, event)
    if not _waiting(new_state):
        return new_state, [*decisions, *settled]
    new_state, finals = drain(new_state)
    if type(event) is IntentEvent:
        new_state, expired = expire_overdue(new_state, event.event_time_ms, all_topics=False)
        finals.extend(expired)
    return new_state, [*decisions, *settled, *finals]


def _fold_released(
    state: SessionState, released: list[CausalWait]
) -> tuple[SessionState, list[Decision]]:
    """Fold inputs that stop waiting for their causes; their answers are their final ones."""
    decisions: list[Decision] = []
    for waiting in released:
        event = event_of(waiting)
        state, answers = _fold_now(state, event, waiting.position)
        decisions.extend(as_final(event.event_id, answers))
    return state, decisions


def release_ready(state: SessionState) -> tuple[SessionState, list[Decision]]:
    """Fold, oldest first, every input waiting for causes that are all folded now."""
    decisions: list[Decision] = []
    while True:
        ready = next_ready(state)
        if ready is None:
            return state, decisions
        state, answers = _fold_released(without(state, ready), [ready])
        decisions.extend(answers)


def release_overdue(state: SessionState, at_ms: int) -> tuple[SessionState, list[Decision]]:
    """Fold, as they stand, the inputs that waited `PARK_MS` of watermark time for a cause
    (a producer that published it never had it acknowledged, or a forgotten producer)."""
    late = overdue(state, at_ms)
    if not late:
        return state, []
    for waiting in late:
        state = without(state, waiting)
    state, decisions = _fold_released(state, late)
    state, more = release_ready(state)
    return state, [*decisions, *more]


def _waiting(state: SessionState) -> bool:
    """Whether any input waits in ``state``: all that `drain` and the expiries look at."""
    return bool(state.parked_intents or state.parked_acks or state.parked_resumes)


def _dispatch(
    state: SessionState, event: Event, position: int
) -> tuple[SessionState, list[Decision]]:
    # `type(...) is`, not isinstance: events are never subclassed, and a negative isinstance on
    # a msgspec class goes through the metaclass's __instancecheck__ (slow, per input).
    if type(event) is IntentEvent:
        if intent_waits(state, event):
            return park_intent(state, event)
        return fold_ready_intent(state, event)
    if type(event) is AckEvent:
        if not ack_ready(state, event):
            return park_ack(state, event)
        new_state, decision = fold_ack(state, event)
        return new_state, [decision]
    if type(event) is ResumeEvent:
        return fold_resume(state, event, position)
    if type(event) is RepairEvent:
        new_state, decision = fold_repair(state, event)
        return new_state, [decision]
    # Anything else (another type, or a subclass the checks above do not match) is a caller's
    # bug: folding it as a repair would clear a session's health that no operator repaired.
    raise TypeError(
        "fold takes an IntentEvent, AckEvent, ResumeEvent or RepairEvent (engine.core.events),"
        f" not {type(event).__name__}: fix the caller that passed it"
    )


def replay(events: Iterable[Event]) -> list[Decision]:
    """Fold a log from empty states (per session), positions = index in the log."""
    states: dict[str, SessionState] = {}
    decisions: list[Decision] = []
    for position, event in enumerate(events):
        result = fold(states.get(event.session_id), event, position)
        states[event.session_id] = result.state
        decisions.extend(result.decisions)
    return decisions


def _grant_action(state: SessionState, verdict: Verdict) -> RunnerAction:
    """The action of the standing grant: a CONTINUE over a still-held batch releases it later."""
    held = state.slot is not None and state.slot.status is SLOT_HELD
    return action_of(verdict, REASON_HELD_RIDES if held else REASON_KNOWN_COMMITTED)


def _answer_duplicate(state: SessionState, event: Event) -> Decision:
    why = make_trail((STEP_WHY, "event id already folded; nothing changes"))
    if isinstance(event, ResumeEvent):
        if event.event_id == state.grant_request_id and state.health is not HEALTH_CLEAR:
            # Re-granting a request the session has since turned ambiguous or violated on would
            # hand out authority the engine no longer gives to anyone.
            reason = (
                REASON_SESSION_VIOLATED
                if state.health is HEALTH_VIOLATED
                else REASON_SESSION_AMBIGUOUS
            )
            return decide(state, event, VERDICT_WITHHELD, reason, trail=why, action=ACTION_REPAIR)
        if event.event_id == state.grant_request_id and state.grant_verdict is not None:
            return decide(
                state,
                event,
                state.grant_verdict,
                REASON_REGRANT_DUPLICATE_REQUEST,
                runner_action=_grant_action(state, state.grant_verdict),
            )
        return decide(state, event, VERDICT_WITHHELD, REASON_DUPLICATE, trail=why)
    return decide(state, event, VERDICT_RECORDED, REASON_DUPLICATE, trail=why)
