"""Intents: REGISTER, HELD, RELEASE and DISCARD of the single pending-write slot."""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.authority import check_writer
from engine.core.decide import (
    decide,
    make_trail,
    reject,
)
from engine.core.digest import has_outputs, orphan_outputs
from engine.core.events import (
    Decision,
    IntentEvent,
)
from engine.core.members import (
    HEALTH_CLEAR,
    HEALTH_VIOLATED,
    KIND_HELD,
    KIND_REGISTER,
    KIND_RELEASE,
    REASON_ACCEPTED,
    REASON_BINDING_MISMATCH,
    REASON_DUPLICATE,
    REASON_HELD_LOSS,
    REASON_INTENT_CONFLICT,
    REASON_INVALID,
    REASON_ORPHAN_OUTPUT,
    REASON_SESSION_AMBIGUOUS,
    REASON_SESSION_VIOLATED,
    REASON_SETTLE_ORDER,
    REASON_SLOT_OCCUPIED,
    REASON_STALE_CHECKPOINT,
    REASON_UNKNOWN_INTENT,
    SLOT_APPEND_GRANTED,
    SLOT_DISCARDED,
    SLOT_HELD,
    SLOT_PENDING,
    STEP_ALERT,
    STEP_OBSERVED,
    VERDICT_RECORDED,
)
from engine.core.state import (
    LEASE_MS,
    UNRESOLVED,
    IntentSlot,
    SessionState,
)


def fold_intent(state: SessionState, event: IntentEvent) -> tuple[SessionState, Decision]:
    """Answer an intent whose fence the engine knows (`parked.py` holds the others back)."""
    return _apply_intent(state, event)


def _apply_intent(state: SessionState, event: IntentEvent) -> tuple[SessionState, Decision]:
    if state.binding is not None and event.binding != state.binding:
        return state, reject(state, event, REASON_BINDING_MISMATCH, "intent points elsewhere")
    slot = state.slot
    same = slot is not None and slot.intent_id == event.intent_id
    rearm = same and slot is not None and _opens_attempt(state, slot, event)
    if same and slot is not None and _is_repeat(slot, event) and not rearm:
        return state, decide(state, event, VERDICT_RECORDED, REASON_DUPLICATE)
    if same and slot is not None and event.kind is KIND_HELD and slot.status is not SLOT_HELD:
        return state, _held_stage_over(state, event, slot)
    refusal = check_writer(state, event.runner_id, event.fence_token, event.event_time_ms)
    if refusal is not None:
        return state, reject(state, event, refusal, f"writer {event.runner_id} lacks authority")
    if state.health is not HEALTH_CLEAR and event.kind in (KIND_REGISTER, KIND_HELD):
        reason = REASON_SESSION_AMBIGUOUS
        if state.health is HEALTH_VIOLATED:
            reason = REASON_SESSION_VIOLATED
        return state, reject(state, event, reason, "session needs repair before new writes")
    if event.sequence < state.progress_sequence and not same:
        return state, reject(state, event, REASON_STALE_CHECKPOINT, "sequence behind session")
    if event.kind is KIND_REGISTER:
        return _register(state, event)
    if event.kind is KIND_HELD:
        return _hold(state, event)
    if slot is None or not same or slot.status is not SLOT_HELD:
        return state, reject(state, event, REASON_UNKNOWN_INTENT, "no held batch with this id")
    if event.kind is KIND_RELEASE:
        return _release(state, event, slot)
    return _discard(state, event, slot)


def _held_stage_over(state: SessionState, event: IntentEvent, slot: IntentSlot) -> Decision:
    """A HELD naming an intent that was since released, discarded or resolved.

    The held stage of an intent ends for good with its RELEASE or DISCARD (a re-park replaces
    a batch that is still held). A HELD that still names the intent is a late copy (a producer
    retry, a runner re-sending after a crash): folded, it would put a batch that was settled or
    dropped back into the slot, and the holder's next write would be refused SLOT_OCCUPIED.
    """
    if event.items == slot.items[: len(event.items)]:
        return decide(state, event, VERDICT_RECORDED, REASON_DUPLICATE)
    return reject(state, event, REASON_INTENT_CONFLICT, "intent id reused after its held stage")


def _is_repeat(slot: IntentSlot, event: IntentEvent) -> bool:
    kind_matches = (event.kind is KIND_HELD) == slot.held or (
        event.kind is KIND_REGISTER and not slot.held
    )
    return (
        kind_matches
        and event.kind in (KIND_REGISTER, KIND_HELD)
        and slot.items == event.items
        and slot.before == event.before
        and slot.status is not SLOT_DISCARDED
    )


def awaits_failure(state: SessionState, event: IntentEvent) -> bool:
    """A repeat of the open intent's REGISTER from its holder while the attempt has no evidence.

    The holder re-registers an intent it already registered only to retry it in place, and
    only after a definite failure, which it acknowledges first: with the intents topic read
    ahead of the acks, that NOT_WRITTEN is on its way. Judged now, the re-arm would be a plain
    duplicate and the failure would land on the retry's attempt; it waits for the failure (or
    for `PARK_MS` of intents, after which it is judged as it stands). A distinct event id is
    implied: the fold answers a repeated event id as a duplicate before this is asked.
    """
    slot = state.slot
    return (
        slot is not None
        and event.kind is KIND_REGISTER
        and slot.intent_id == event.intent_id
        and _is_repeat(slot, event)
        and not slot.held
        and slot.status is SLOT_PENDING
        and event.runner_id == state.holder
        and (event.fence_token or 0) == state.fence_token
        and not (
            slot.not_written
            or slot.committed_by_store
            or slot.committed_by_runner
            or slot.partial_seen
        )
    )


def opens_attempt(state: SessionState, event: IntentEvent) -> bool:
    """Whether folding `event` now would re-arm the open intent for a new attempt."""
    slot = state.slot
    same = slot is not None and slot.intent_id == event.intent_id
    return same and slot is not None and _opens_attempt(state, slot, event)


def _opens_attempt(state: SessionState, slot: IntentSlot, event: IntentEvent) -> bool:
    """The holder re-arms its intent for another append under the current fence.

    That starts a new attempt when the engine granted APPEND_ONCE (the grant's attempt) or when
    the only evidence so far is a definite failure: the earlier attempt wrote nothing, so its
    NOT_WRITTEN must not make this attempt's COMMITTED ack look ambiguous.
    """
    return (
        event.kind is KIND_REGISTER
        and not slot.held
        and slot.status in (SLOT_PENDING, SLOT_APPEND_GRANTED)
        and event.runner_id == state.holder
        and (event.fence_token or 0) == state.fence_token
        and (slot.status is SLOT_APPEND_GRANTED or slot.not_written)
        and not (slot.committed_by_store or slot.committed_by_runner or slot.partial_seen)
    )


def _accepted(state: SessionState, event: IntentEvent, slot: IntentSlot) -> SessionState:
    previous = (
        state.slot.intent_id if state.slot and state.slot.intent_id != slot.intent_id else None
    )
    # One copy: the lease renewal (`renew`) is folded into the same update.
    return replace(
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
        return state, reject(state, event, REASON_INVALID, "an intent needs a non-empty batch")
    trail = make_trail((STEP_OBSERVED, f"register {event.intent_id}: {len(event.items)} items"))
    if slot is not None and slot.intent_id == event.intent_id:
        if slot.held or slot.items != event.items or slot.before not in (None, event.before):
            return state, reject(state, event, REASON_INTENT_CONFLICT, "intent id reused")
        # The same intent armed with its before digests (or re-armed by the granted holder).
        update: dict[str, object] = {"before": event.before}
        if _opens_attempt(state, slot, event):
            update.update(not_written=False, committed_by_store=False, committed_by_runner=False)
            trail = make_trail((STEP_OBSERVED, f"re-armed {event.intent_id}: new attempt"))
        new_slot = replace(slot, **update)
        return _accepted(state, event, new_slot), decide(
            state, event, VERDICT_RECORDED, REASON_ACCEPTED, trail=trail
        )
    if slot is not None and slot.status is SLOT_HELD:
        return state, reject(state, event, REASON_SLOT_OCCUPIED, "a held batch stands")
    # A newer intent from the writer means its previous append returned (the runner only moves
    # on after success or a granted reconciliation): the superseded slot is resolved.
    new_slot = IntentSlot(
        intent_id=event.intent_id,
        runner_id=event.runner_id,
        sequence=event.sequence,
        held=False,
        status=SLOT_PENDING,
        before=event.before,
        items=event.items,
        persisted_count=event.persisted_count,
    )
    new_state = _accepted(state, event, new_slot)
    return new_state, decide(new_state, event, VERDICT_RECORDED, REASON_ACCEPTED, trail=trail)


def _hold(state: SessionState, event: IntentEvent) -> tuple[SessionState, Decision]:
    slot = state.slot
    if not event.items or event.before is not None:
        return state, reject(state, event, REASON_INVALID, "a held batch has items, no before")
    # A later write supersedes an ordinary one, as for REGISTER: the writer moved on, so its
    # append returned (its ack may simply not be folded yet).
    ordinary = slot is not None and slot.status in UNRESOLVED and not slot.held
    if ordinary and slot is not None and event.sequence <= slot.sequence:
        return state, reject(state, event, REASON_SLOT_OCCUPIED, "an ordinary write stands")
    # A re-park replaces the standing held batch with its superset (one canonical batch).
    superset = slot is None or event.items[: len(slot.items)] == slot.items
    if slot is not None and slot.status is SLOT_HELD and not superset:
        return state, reject(state, event, REASON_INTENT_CONFLICT, "re-park is no superset")
    new_slot = IntentSlot(
        intent_id=event.intent_id,
        runner_id=event.runner_id,
        sequence=event.sequence,
        held=True,
        status=SLOT_HELD,
        items=event.items,
        persisted_count=event.persisted_count,
    )
    new_state = _accepted(state, event, new_slot)
    trail = make_trail((STEP_OBSERVED, f"held batch {event.intent_id}: {len(event.items)} items"))
    return new_state, decide(new_state, event, VERDICT_RECORDED, REASON_ACCEPTED, trail=trail)


def _release(
    state: SessionState, event: IntentEvent, slot: IntentSlot
) -> tuple[SessionState, Decision]:
    if event.items[: len(slot.items)] != slot.items:
        why = "a settle must carry the held batch first, in order"
        return state, reject(state, event, REASON_SETTLE_ORDER, why)
    orphans = orphan_outputs(event.items)
    if orphans:
        ids = ", ".join(sorted({str(o.call_id) for o in orphans}))
        return state, reject(state, event, REASON_ORPHAN_OUTPUT, f"outputs without calls: {ids}")
    new_slot = replace(
        slot,
        held=False,
        status=SLOT_PENDING,
        items=event.items,
        before=event.before,
        persisted_count=event.persisted_count,
        sequence=max(slot.sequence, event.sequence),
    )
    new_state = _accepted(state, event, new_slot)
    trail = make_trail((STEP_OBSERVED, f"held batch released as a {len(event.items)}-item settle"))
    return new_state, decide(new_state, event, VERDICT_RECORDED, REASON_ACCEPTED, trail=trail)


def _discard(
    state: SessionState, event: IntentEvent, slot: IntentSlot
) -> tuple[SessionState, Decision]:
    new_slot = replace(slot, status=SLOT_DISCARDED)
    new_state = _accepted(state, event, new_slot)
    if event.tools_ran or has_outputs(slot.items):
        why = "held batch discarded after its tools ran: their calls and outputs are lost"
        return new_state, decide(
            new_state,
            event,
            VERDICT_RECORDED,
            REASON_HELD_LOSS,
            trail=make_trail((STEP_ALERT, why)),
            action="Re-create the lost call/output pair in the Session or accept the loss.",
            alert=True,
        )
    return new_state, decide(new_state, event, VERDICT_RECORDED, REASON_ACCEPTED)
