"""The fold: ``state + event -> new state + decisions``. Pure, total, deterministic.

Decisions per input (what the engine service can check end to end):

* Every input event gets **exactly one answer decision**, ``decision_id == event_id``:
  intents, acks and repairs get RECORDED or REJECTED; resumes get CONTINUE, APPEND_ONCE,
  WITHHELD or DEFERRED. Duplicates (same ``event_id`` inside the de-duplication window) are
  answered too, with the same ``decision_id``: a duplicate of the granting resume is re-answered
  with the same grant and fence; any other duplicate gets RECORDED/WITHHELD ``DUPLICATE``.
* A resume whose pending record names an intent the engine has not seen yet is answered
  ``DEFERRED`` (``final=False``) and parked; when that intent arrives, the fold emits one more
  decision for it, ``decision_id == resume_event_id + "/final"``, alongside the intent's answer.

Authority: at most one holder per session. A grant carries a fence token that only grows
(``max(previous + 1, position)``, the resume's offset). The first intent of a fresh session makes
its runner the implicit holder (fence 0). A holder's lease runs ``LEASE_MS`` of event time from
the grant or from its last accepted write; while it runs, other runners are withheld
HELD_BY_OTHER. A granted checkpoint is consumed: another resume of it is withheld. A resume whose
checkpoint knew less than the session's progress is withheld STALE_CHECKPOINT.

Health: AMBIGUOUS or VIOLATED is sticky; only a repair clears it. Nothing grants on ambiguity.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.core.classify import classify
from engine.core.digest import has_outputs, orphan_outputs
from engine.core.errors import CoreError, SessionMismatchError
from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Classification,
    Decision,
    Event,
    Fence,
    IntentEvent,
    IntentKind,
    Reason,
    RepairEvent,
    RepairResolution,
    ResumeEvent,
    TrailEntry,
    Verdict,
)
from engine.core.state import (
    LEASE_MS,
    PARKED_LIMIT,
    RECENT_EVENT_IDS,
    UNRESOLVED,
    Health,
    IntentSlot,
    ParkedResume,
    SessionState,
    SlotStatus,
)

_ACTION_REPAIR = (
    "Inspect the Session tail against the intent's digests, then publish a repair command "
    "(ACCEPT_COMMITTED, ACCEPT_ABSENT or ABANDON) with actor and reason."
)
_ACTION_WAIT = "Wait for the current holder's lease to lapse or for it to finish; do not resume."
_ACTION_NEWER = "Resume from the session's newest checkpoint; this one is behind the session."
_ACTION_BINDING = "Resume against the backend, namespace and digest scheme the session is bound to."


@dataclass(frozen=True)
class FoldResult:
    state: SessionState
    decisions: tuple[Decision, ...]


def _trail(*entries: tuple[str, str]) -> list[TrailEntry]:
    return [TrailEntry(step=step, detail=detail) for step, detail in entries]


def _decide(
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
    suffix: str = "",
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
    )


def _with(state: SessionState, **changes: Any) -> SessionState:
    return state.model_copy(update=changes)


def _remember(state: SessionState, event_id: str) -> SessionState:
    recent = [*state.recent_event_ids, event_id][-RECENT_EVENT_IDS:]
    return _with(state, recent_event_ids=recent)


def fold(state: SessionState | None, event: Event, position: int) -> FoldResult:
    """Fold one event into the session's state. Never raises for any input event."""
    if state is None:
        state = SessionState(session_id=event.session_id)
    elif state.session_id != event.session_id:
        raise SessionMismatchError(
            state_session_id=state.session_id, event_session_id=event.session_id
        )
    if event.event_id in state.recent_event_ids:
        return FoldResult(state, (_answer_duplicate(state, event),))
    remembered = _remember(state, event.event_id)
    if isinstance(event, IntentEvent):
        return _fold_intent(remembered, event)
    if isinstance(event, AckEvent):
        new_state, decision = _fold_ack(remembered, event)
        return FoldResult(new_state, (decision,))
    if isinstance(event, ResumeEvent):
        new_state, decision = _fold_resume(remembered, event, position)
        return FoldResult(new_state, (decision,))
    new_state, decision = _fold_repair(remembered, event)
    return FoldResult(new_state, (decision,))


def replay(events: Iterable[Event]) -> list[Decision]:
    """Fold a log from empty states (per session), positions = index in the log."""
    states: dict[str, SessionState] = {}
    decisions: list[Decision] = []
    for position, event in enumerate(events):
        result = fold(states.get(event.session_id), event, position)
        states[event.session_id] = result.state
        decisions.extend(result.decisions)
    return decisions


def _answer_duplicate(state: SessionState, event: Event) -> Decision:
    why = _trail(("why", "event id already folded; nothing changes"))
    if isinstance(event, ResumeEvent):
        if event.event_id == state.grant_request_id and state.grant_verdict is not None:
            return _decide(state, event, state.grant_verdict, Reason.REGRANT_DUPLICATE_REQUEST)
        if any(p.resume.event_id == event.event_id for p in state.parked_resumes):
            return _decide(state, event, Verdict.DEFERRED, Reason.AWAITING_INTENT, final=False)
        return _decide(state, event, Verdict.WITHHELD, Reason.DUPLICATE, trail=why)
    return _decide(state, event, Verdict.RECORDED, Reason.DUPLICATE, trail=why)


# --- authority -----------------------------------------------------------------------------


def _check_writer(
    state: SessionState, runner_id: str, fence_token: int | None, at_ms: int
) -> Reason | None:
    """None when this runner may write under this token now; else why not."""
    if state.fence_token > 0:
        if fence_token is None or fence_token < state.fence_token:
            return Reason.STALE_FENCE
        if fence_token > state.fence_token:
            return Reason.UNKNOWN_FENCE
        return None if runner_id == state.holder else Reason.NOT_HOLDER
    if fence_token is not None:
        return Reason.UNKNOWN_FENCE
    if state.holder not in (None, runner_id) and state.lease_active(at_ms):
        return Reason.NOT_HOLDER
    return None


def _renew(state: SessionState, runner_id: str, at_ms: int) -> SessionState:
    lease = max(state.lease_expires_ms or 0, at_ms + LEASE_MS)
    return _with(state, holder=runner_id, lease_expires_ms=lease)


# --- intents -------------------------------------------------------------------------------


def _fold_intent(state: SessionState, event: IntentEvent) -> FoldResult:
    new_state, decision = _apply_intent(state, event)
    decisions = [decision]
    if decision.verdict is Verdict.RECORDED and new_state.slot is not None:
        new_state, more = _apply_parked(new_state, new_state.slot.intent_id)
        decisions.extend(more)
    return FoldResult(new_state, tuple(decisions))


def _reject(state: SessionState, event: Event, reason: Reason, why: str) -> Decision:
    action = _ACTION_BINDING if reason is Reason.BINDING_MISMATCH else None
    return _decide(
        state, event, Verdict.REJECTED, reason, trail=_trail(("why", why)), action=action
    )


def _apply_intent(state: SessionState, event: IntentEvent) -> tuple[SessionState, Decision]:
    if state.binding is not None and event.binding != state.binding:
        return state, _reject(state, event, Reason.BINDING_MISMATCH, "intent points elsewhere")
    slot = state.slot
    same = slot is not None and slot.intent_id == event.intent_id
    if same and slot is not None and _is_repeat(slot, event):
        return state, _decide(state, event, Verdict.RECORDED, Reason.DUPLICATE)
    refusal = _check_writer(state, event.runner_id, event.fence_token, event.event_time_ms)
    if refusal is not None:
        return state, _reject(state, event, refusal, f"writer {event.runner_id} lacks authority")
    if state.health is not Health.CLEAR and event.kind in (IntentKind.REGISTER, IntentKind.HELD):
        reason = Reason.SESSION_AMBIGUOUS
        if state.health is Health.VIOLATED:
            reason = Reason.SESSION_VIOLATED
        return state, _reject(state, event, reason, "session needs repair before new writes")
    if event.sequence < state.progress_sequence and not same:
        return state, _reject(state, event, Reason.STALE_CHECKPOINT, "sequence behind session")
    if event.kind is IntentKind.REGISTER:
        return _register(state, event)
    if event.kind is IntentKind.HELD:
        return _hold(state, event)
    if slot is None or not same or slot.status is not SlotStatus.HELD:
        return state, _reject(state, event, Reason.UNKNOWN_INTENT, "no held batch with this id")
    if event.kind is IntentKind.RELEASE:
        return _release(state, event, slot)
    return _discard(state, event, slot)


def _is_repeat(slot: IntentSlot, event: IntentEvent) -> bool:
    kind_matches = (event.kind is IntentKind.HELD) == slot.held or (
        event.kind is IntentKind.REGISTER and not slot.held
    )
    return (
        kind_matches
        and event.kind in (IntentKind.REGISTER, IntentKind.HELD)
        and slot.items == event.items
        and slot.before == event.before
        and slot.status is not SlotStatus.DISCARDED
    )


def _accepted(state: SessionState, event: IntentEvent, slot: IntentSlot) -> SessionState:
    previous = (
        state.slot.intent_id if state.slot and state.slot.intent_id != slot.intent_id else None
    )
    # One copy: the lease renewal (`_renew`) is folded into the same update.
    return _with(
        state,
        slot=slot,
        previous_intent_id=previous or state.previous_intent_id,
        progress_sequence=max(state.progress_sequence, event.sequence),
        binding=state.binding or event.binding,
        holder=event.runner_id,
        lease_expires_ms=max(state.lease_expires_ms or 0, event.event_time_ms + LEASE_MS),
    )


def _register(state: SessionState, event: IntentEvent) -> tuple[SessionState, Decision]:
    slot = state.slot
    if not event.items:
        return state, _reject(state, event, Reason.INVALID, "an intent needs a non-empty batch")
    trail = _trail(("observed", f"register {event.intent_id}: {len(event.items)} items"))
    if slot is not None and slot.intent_id == event.intent_id:
        if slot.held or slot.items != event.items or slot.before not in (None, event.before):
            return state, _reject(state, event, Reason.INTENT_CONFLICT, "intent id reused")
        # The same intent armed with its before digests (or re-armed by the granted holder).
        new_slot = slot.model_copy(update={"before": event.before})
        return _accepted(state, event, new_slot), _decide(
            state, event, Verdict.RECORDED, Reason.ACCEPTED, trail=trail
        )
    if slot is not None and slot.status is SlotStatus.HELD:
        return state, _reject(state, event, Reason.SLOT_OCCUPIED, "a held batch stands")
    # A newer intent from the writer means its previous append returned (the runner only moves
    # on after success or a granted reconciliation): the superseded slot is resolved.
    new_slot = IntentSlot(
        intent_id=event.intent_id,
        runner_id=event.runner_id,
        sequence=event.sequence,
        held=False,
        status=SlotStatus.PENDING,
        before=event.before,
        items=event.items,
        persisted_count=event.persisted_count,
    )
    new_state = _accepted(state, event, new_slot)
    return new_state, _decide(new_state, event, Verdict.RECORDED, Reason.ACCEPTED, trail=trail)


def _hold(state: SessionState, event: IntentEvent) -> tuple[SessionState, Decision]:
    slot = state.slot
    if not event.items or event.before is not None:
        return state, _reject(state, event, Reason.INVALID, "a held batch has items, no before")
    if slot is not None and slot.status in UNRESOLVED and not slot.held:
        return state, _reject(state, event, Reason.SLOT_OCCUPIED, "an ordinary write stands")
    # A re-park replaces the standing held batch with its superset (one canonical batch).
    superset = slot is None or event.items[: len(slot.items)] == slot.items
    if slot is not None and slot.status is SlotStatus.HELD and not superset:
        return state, _reject(state, event, Reason.INTENT_CONFLICT, "re-park is no superset")
    new_slot = IntentSlot(
        intent_id=event.intent_id,
        runner_id=event.runner_id,
        sequence=event.sequence,
        held=True,
        status=SlotStatus.HELD,
        items=event.items,
        persisted_count=event.persisted_count,
    )
    new_state = _accepted(state, event, new_slot)
    trail = _trail(("observed", f"held batch {event.intent_id}: {len(event.items)} items"))
    return new_state, _decide(new_state, event, Verdict.RECORDED, Reason.ACCEPTED, trail=trail)


def _release(
    state: SessionState, event: IntentEvent, slot: IntentSlot
) -> tuple[SessionState, Decision]:
    if event.items[: len(slot.items)] != slot.items:
        why = "a settle must carry the held batch first, in order"
        return state, _reject(state, event, Reason.SETTLE_ORDER, why)
    orphans = orphan_outputs(event.items)
    if orphans:
        ids = ", ".join(sorted({str(o.call_id) for o in orphans}))
        return state, _reject(state, event, Reason.ORPHAN_OUTPUT, f"outputs without calls: {ids}")
    new_slot = slot.model_copy(
        update={
            "held": False,
            "status": SlotStatus.PENDING,
            "items": event.items,
            "before": event.before,
            "persisted_count": event.persisted_count,
            "sequence": max(slot.sequence, event.sequence),
        }
    )
    new_state = _accepted(state, event, new_slot)
    trail = _trail(("observed", f"held batch released as a {len(event.items)}-item settle"))
    return new_state, _decide(new_state, event, Verdict.RECORDED, Reason.ACCEPTED, trail=trail)


def _discard(
    state: SessionState, event: IntentEvent, slot: IntentSlot
) -> tuple[SessionState, Decision]:
    new_slot = slot.model_copy(update={"status": SlotStatus.DISCARDED})
    new_state = _accepted(state, event, new_slot)
    if event.tools_ran or has_outputs(slot.items):
        why = "held batch discarded after its tools ran: their calls and outputs are lost"
        return new_state, _decide(
            new_state,
            event,
            Verdict.RECORDED,
            Reason.HELD_LOSS,
            trail=_trail(("alert", why)),
            action="Re-create the lost call/output pair in the Session or accept the loss.",
            alert=True,
        )
    return new_state, _decide(new_state, event, Verdict.RECORDED, Reason.ACCEPTED)


# --- acks ----------------------------------------------------------------------------------


def _fold_ack(state: SessionState, event: AckEvent) -> tuple[SessionState, Decision]:
    slot = state.slot
    if event.source is AckSource.RUNNER:
        refusal = _check_writer(state, event.runner_id, event.fence_token, event.event_time_ms)
        if refusal is not None:
            late = (
                event.outcome is AckOutcome.COMMITTED
                and slot is not None
                and slot.intent_id == event.intent_id
                and slot.status is SlotStatus.APPEND_GRANTED
            )
            if late:
                why = "a fenced-out writer's append landed after another holder was told to append"
                state = _with(state, health=Health.VIOLATED, health_reason=Reason.LATE_APPEND)
                return state, _decide(
                    state,
                    event,
                    Verdict.REJECTED,
                    Reason.LATE_APPEND,
                    trail=_trail(("alert", why)),
                    action=_ACTION_REPAIR,
                    alert=True,
                )
            return state, _reject(state, event, refusal, "ack from a runner without authority")
    if slot is None or slot.intent_id != event.intent_id:
        if event.intent_id == state.previous_intent_id:
            return state, _decide(state, event, Verdict.RECORDED, Reason.ACCEPTED)
        parked = [*state.parked_acks, event][-PARKED_LIMIT:]
        return _with(state, parked_acks=parked), _decide(
            state, event, Verdict.RECORDED, Reason.PARKED
        )
    new_state, reason, alert = _apply_ack(state, slot, event)
    return new_state, _decide(
        new_state,
        event,
        Verdict.RECORDED,
        reason,
        alert=alert,
        action=_ACTION_REPAIR if alert else None,
        trail=_trail(("evidence", f"{event.source.value} ack {event.outcome.value}")),
    )


def _apply_ack(
    state: SessionState, slot: IntentSlot, event: AckEvent
) -> tuple[SessionState, Reason, bool]:
    """Apply evidence to the slot. Returns the new state, the answer's reason and the alert."""
    n = len(slot.items)
    count = event.committed_count
    if event.runner_id and event.source is AckSource.RUNNER:
        state = _renew(state, event.runner_id, event.event_time_ms)
    if event.outcome is AckOutcome.COMMITTED and count is not None and 0 < count < n:
        new_slot = slot.model_copy(update={"partial_seen": True})
        return (
            _with(
                state, slot=new_slot, health=Health.AMBIGUOUS, health_reason=Reason.PARTIAL_COMMIT
            ),
            Reason.PARTIAL_COMMIT,
            True,
        )
    if event.outcome is AckOutcome.COMMITTED and count == 0:
        event = event.model_copy(update={"outcome": AckOutcome.NOT_WRITTEN})
    if event.outcome is AckOutcome.COMMITTED:
        if slot.status is SlotStatus.HELD:
            return (
                _with(state, health=Health.VIOLATED, health_reason=Reason.GATE_VIOLATION),
                Reason.GATE_VIOLATION,
                True,
            )
        store = event.source is AckSource.STORE
        update: dict[str, Any] = {
            "committed_by_store": slot.committed_by_store or store,
            "committed_by_runner": slot.committed_by_runner or not store,
        }
        if slot.status in UNRESOLVED:
            update["status"] = SlotStatus.COMMITTED
        if slot.not_written:
            state = _with(state, health=Health.AMBIGUOUS, health_reason=Reason.AMBIGUOUS)
            return _with(state, slot=slot.model_copy(update=update)), Reason.AMBIGUOUS, True
        return _with(state, slot=slot.model_copy(update=update)), Reason.ACCEPTED, False
    if event.outcome is AckOutcome.NOT_WRITTEN:
        new_slot = slot.model_copy(update={"not_written": True})
        if slot.committed_by_store or slot.committed_by_runner:
            state = _with(state, health=Health.AMBIGUOUS, health_reason=Reason.AMBIGUOUS)
            return _with(state, slot=new_slot), Reason.AMBIGUOUS, True
        return _with(state, slot=new_slot), Reason.ACCEPTED, False
    return state, Reason.ACCEPTED, False


def _apply_parked(state: SessionState, intent_id: str) -> tuple[SessionState, list[Decision]]:
    decisions: list[Decision] = []
    acks = [a for a in state.parked_acks if a.intent_id == intent_id]
    if acks:
        state = _with(state, parked_acks=[a for a in state.parked_acks if a.intent_id != intent_id])
        for ack in acks:
            slot = state.slot
            if slot is not None:
                state, _reason, _alert = _apply_ack(state, slot, ack)
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
        state = _with(state, parked_resumes=rest)
        for parked in waiting:
            state, decision = _evaluate_resume(state, parked.resume, parked.position, "/final")
            decisions.append(decision)
    return state, decisions


# --- resumes -------------------------------------------------------------------------------


def _fold_resume(
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
        return _with(state, parked_resumes=parked[-PARKED_LIMIT:]), _decide(
            state,
            event,
            Verdict.DEFERRED,
            Reason.AWAITING_INTENT,
            trail=_trail(("why", why)),
            final=False,
        )
    return _evaluate_resume(state, event, position, "")


def _withhold(
    state: SessionState,
    event: ResumeEvent,
    reason: Reason,
    why: str,
    suffix: str,
    *,
    action: str | None = _ACTION_REPAIR,
    classification: Classification = Classification.NONE,
    alert: bool = False,
    observed: str = "",
) -> tuple[SessionState, Decision]:
    trail = _trail(
        ("observed", observed or f"resume {event.checkpoint_id} by {event.runner_id}"),
        ("classification", classification.value),
        ("authority", f"withheld; holder={state.holder} fence={state.fence_token}"),
        ("why", why),
    )
    return state, _decide(
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


def _evaluate_resume(
    state: SessionState, event: ResumeEvent, position: int, suffix: str
) -> tuple[SessionState, Decision]:
    at = event.event_time_ms
    if state.binding is not None and event.binding != state.binding:
        why = "the resume's backend/namespace/digest scheme differs from the session's binding"
        return _withhold(state, event, Reason.BINDING_MISMATCH, why, suffix, action=_ACTION_BINDING)
    if state.health is not Health.CLEAR:
        reason = (
            Reason.SESSION_VIOLATED if state.health is Health.VIOLATED else Reason.SESSION_AMBIGUOUS
        )
        why = f"session is {state.health.value} ({state.health_reason}); only a repair clears it"
        return _withhold(state, event, reason, why, suffix)
    if state.granted_checkpoint_id == event.checkpoint_id:
        if state.lease_active(at) and state.holder != event.runner_id:
            why = f"checkpoint already granted to {state.holder} (fence {state.fence_token})"
            return _withhold(state, event, Reason.HELD_BY_OTHER, why, suffix, action=_ACTION_WAIT)
        why = "this checkpoint was already resumed once; its copies may not run again"
        return _withhold(
            state, event, Reason.CHECKPOINT_ALREADY_RESUMED, why, suffix, action=_ACTION_NEWER
        )
    if event.checkpoint_sequence < state.progress_sequence:
        why = (
            f"checkpoint knew write {event.checkpoint_sequence}, "
            f"session reached {state.progress_sequence}"
        )
        return _withhold(state, event, Reason.STALE_CHECKPOINT, why, suffix, action=_ACTION_NEWER)
    if state.lease_active(at) and state.holder != event.runner_id:
        why = f"{state.holder} holds authority (fence {state.fence_token})"
        why += f" until {state.lease_expires_ms} ms"
        return _withhold(state, event, Reason.HELD_BY_OTHER, why, suffix, action=_ACTION_WAIT)
    return _reconcile(state, event, position, suffix)


def _record_matches(slot: IntentSlot, event: ResumeEvent) -> bool:
    pending = event.pending
    if pending is None:
        raise CoreError("record check needs a pending record")
    if pending.items != slot.items or pending.held != (slot.status is SlotStatus.HELD):
        return False
    if pending.persisted_count != slot.persisted_count:
        return False
    return slot.status not in UNRESOLVED or slot.held or pending.before == slot.before


def _reconcile(
    state: SessionState, event: ResumeEvent, position: int, suffix: str
) -> tuple[SessionState, Decision]:
    slot, pending = state.slot, event.pending
    if pending is None:
        if slot is not None and slot.status in UNRESOLVED:
            why = f"the checkpoint carries no pending write but intent {slot.intent_id} is open"
            reason = Reason.HELD_NOT_SETTLED if slot.held else Reason.RECORD_MISMATCH
            return _withhold(state, event, reason, why, suffix, alert=slot.held)
        return _grant(
            state,
            event,
            position,
            Verdict.CONTINUE,
            Reason.NO_PENDING_WRITE,
            Classification.NONE,
            suffix,
        )
    if slot is None:  # _fold_resume parks every resume naming an unknown intent
        raise CoreError("reconcile reached without an intent slot", session_id=state.session_id)
    if pending.intent_id != slot.intent_id:
        why = f"the checkpoint names superseded intent {pending.intent_id}"
        return _withhold(state, event, Reason.STALE_CHECKPOINT, why, suffix, action=_ACTION_NEWER)
    if not _record_matches(slot, event):
        why = "the checkpoint's pending-write record disagrees with the registered intent"
        return _withhold(state, event, Reason.RECORD_MISMATCH, why, suffix, alert=True)
    if slot.status is SlotStatus.HELD:
        tail = event.observed_tail
        if len(tail) >= len(slot.items) and tail[-len(slot.items) :] == slot.batch:
            violated = _with(state, health=Health.VIOLATED, health_reason=Reason.GATE_VIOLATION)
            why = "the held batch is already in the Session before its release"
            return _withhold(violated, event, Reason.GATE_VIOLATION, why, suffix, alert=True)
        return _grant(
            state, event, position, Verdict.CONTINUE, Reason.HELD_RIDES, Classification.NONE, suffix
        )
    if slot.status in (SlotStatus.DISCARDED, SlotStatus.ABANDONED):
        why = f"intent {slot.intent_id} was {slot.status.value.lower()}"
        return _withhold(state, event, Reason.ABANDONED, why, suffix, action=_ACTION_NEWER)
    if slot.status is SlotStatus.COMMITTED:
        reason = Reason.COMMITTED_BY_STORE if slot.committed_by_store else Reason.KNOWN_COMMITTED
        return _grant(state, event, position, Verdict.CONTINUE, reason, Classification.NONE, suffix)
    if slot.status is SlotStatus.ABSENT:
        return _grant(
            state,
            event,
            position,
            Verdict.APPEND_ONCE,
            Reason.ACCEPTED_ABSENT,
            Classification.NONE,
            suffix,
        )
    chunk = state.binding.chunk_size if state.binding else None
    cls = classify(
        observed=event.observed_tail,
        before=pending.before,
        batch=slot.batch,
        append_acknowledged=pending.append_acknowledged,
        chunk_size=chunk,
    )
    observed = (
        f"tail of {len(event.observed_tail)} digests vs "
        f"before {len(pending.before or [])} + batch {len(slot.items)}"
    )
    if cls is Classification.NOT_STARTED:
        return _grant(
            state, event, position, Verdict.APPEND_ONCE, Reason.APPEND_NOT_STARTED, cls, suffix
        )
    if cls is Classification.COMMITTED:
        if slot.not_written:
            why = "tail matches the batch but the append definitively failed: not our authorship"
            return _withhold(
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
        return _grant(
            state, event, position, Verdict.CONTINUE, Reason.COMMITTED, cls, suffix, committed
        )
    if cls is Classification.UNCHANGED:
        granted = slot.model_copy(update={"status": SlotStatus.APPEND_GRANTED})
        return _grant(
            state, event, position, Verdict.APPEND_ONCE, Reason.UNCHANGED, cls, suffix, granted
        )
    reason = Reason.PARTIAL_COMMIT if cls is Classification.PARTIAL else Reason.AMBIGUOUS
    new_slot = slot.model_copy(
        update={"partial_seen": slot.partial_seen or cls is Classification.PARTIAL}
    )
    ambiguous = _with(state, slot=new_slot, health=Health.AMBIGUOUS, health_reason=reason)
    why = "history changed or is ambiguous: neither or both of committed/unchanged hold"
    return _withhold(
        ambiguous, event, reason, why, suffix, classification=cls, alert=True, observed=observed
    )


def _grant(
    state: SessionState,
    event: ResumeEvent,
    position: int,
    verdict: Verdict,
    reason: Reason,
    classification: Classification,
    suffix: str,
    slot: IntentSlot | None = None,
) -> tuple[SessionState, Decision]:
    """Grant authority; ``slot`` (if given) replaces the session's slot in the same update."""
    fence = max(state.fence_token + 1, position)
    changes: dict[str, Any] = {} if slot is None else {"slot": slot}
    state = _with(
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
    trail = _trail(
        (
            "observed",
            f"resume {event.checkpoint_id} by {event.runner_id}, tail {len(event.observed_tail)}",
        ),
        ("evidence", _evidence(state.slot)),
        ("classification", classification.value),
        ("authority", f"granted to {event.runner_id} with fence {fence}"),
        ("why", reason.value),
    )
    return state, _decide(
        state, event, verdict, reason, trail=trail, classification=classification, suffix=suffix
    )


def _evidence(slot: IntentSlot | None) -> str:
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
    return f"intent {slot.intent_id} {slot.status.value} [{', '.join(flags)}]"


# --- repairs -------------------------------------------------------------------------------


def _fold_repair(state: SessionState, event: RepairEvent) -> tuple[SessionState, Decision]:
    slot = state.slot
    if event.intent_id is not None and (slot is None or slot.intent_id != event.intent_id):
        return state, _reject(state, event, Reason.UNKNOWN_INTENT, "repair names another intent")
    open_slot = slot is not None and slot.status in UNRESOLVED
    if state.health is Health.CLEAR and not open_slot:
        return state, _decide(state, event, Verdict.RECORDED, Reason.NOTHING_TO_REPAIR)
    status = {
        RepairResolution.ACCEPT_COMMITTED: SlotStatus.COMMITTED,
        RepairResolution.ACCEPT_ABSENT: SlotStatus.ABSENT,
        RepairResolution.ABANDON: SlotStatus.ABANDONED,
    }[event.resolution]
    new_slot = None
    if slot is not None:
        new_slot = slot.model_copy(
            update={"status": status, "partial_seen": False, "not_written": False}
        )
    # A repair also ends the current grant: the next resume starts a fresh authority epoch.
    repaired = _with(
        state,
        slot=new_slot,
        health=Health.CLEAR,
        health_reason=None,
        lease_expires_ms=None,
        granted_checkpoint_id=None,
    )
    trail = _trail(
        ("repair", f"{event.resolution.value} by {event.actor}: {event.reason}"),
        ("observed", f"was {state.health.value} ({state.health_reason}); {_evidence(slot)}"),
    )
    return repaired, _decide(repaired, event, Verdict.RECORDED, Reason.REPAIRED, trail=trail)
