"""Repairs: an operator resolution clears AMBIGUOUS/VIOLATED and ends the current grant."""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.decide import (
    decide,
    evidence,
    make_trail,
    reject,
)
from engine.core.events import (
    Decision,
    RepairEvent,
    RepairResolution,
)
from engine.core.members import (
    HEALTH_CLEAR,
    REASON_NOTHING_TO_REPAIR,
    REASON_REPAIRED,
    REASON_STALE_CHECKPOINT,
    REASON_UNKNOWN_INTENT,
    SLOT_ABANDONED,
    SLOT_ABSENT,
    SLOT_COMMITTED,
    STEP_OBSERVED,
    STEP_REPAIR,
    STEP_WHY,
    VERDICT_RECORDED,
    VERDICT_REJECTED,
)
from engine.core.state import (
    LEASE_MS,
    UNRESOLVED,
    SessionState,
)

ACTION_STALE_REPAIR = (
    "The session moved on after this repair was stamped, or the operator's clock is behind "
    "the runners': compare the repair's stamp with the lease in the trail and check both "
    "clocks (NTP); then run `reconciler explain` on the session and publish a new repair if "
    "it still needs one."
)


def fold_repair(state: SessionState, event: RepairEvent) -> tuple[SessionState, Decision]:
    slot = state.slot
    if event.intent_id is not None and (slot is None or slot.intent_id != event.intent_id):
        return state, reject(state, event, REASON_UNKNOWN_INTENT, "repair names another intent")
    open_slot = slot is not None and slot.status in UNRESOLVED
    if state.health is HEALTH_CLEAR and not open_slot:
        return state, decide(state, event, VERDICT_RECORDED, REASON_NOTHING_TO_REPAIR)
    lease = state.lease_expires_ms
    if lease is not None and event.event_time_ms + LEASE_MS < lease:
        # Stamped before the session's latest grant or accepted write: the operator looked at
        # an older state (or this is a late copy of an earlier repair, which would resolve a
        # newer incident of the same intent unseen: ACCEPT_ABSENT over a batch that landed).
        why = (
            f"repair stamped {event.event_time_ms} ms, before the session's latest grant or "
            f"write (its lease runs to {lease} ms)"
        )
        return state, decide(
            state,
            event,
            VERDICT_REJECTED,
            REASON_STALE_CHECKPOINT,
            trail=make_trail((STEP_WHY, why)),
            action=ACTION_STALE_REPAIR,
        )
    status = {
        RepairResolution.ACCEPT_COMMITTED: SLOT_COMMITTED,
        RepairResolution.ACCEPT_ABSENT: SLOT_ABSENT,
        RepairResolution.ABANDON: SLOT_ABANDONED,
    }[event.resolution]
    new_slot = None
    if slot is not None:
        # The operator's resolution supersedes the ack evidence it was made from.
        new_slot = replace(
            slot,
            status=status,
            partial_seen=False,
            not_written=False,
            committed_by_store=False,
            committed_by_runner=False,
        )
    # A repair also ends the current grant: the next resume starts a fresh authority epoch.
    # It ends at the repair's event time, not for all time: a resume stamped before the repair
    # was sent into the old epoch (a late copy, or a runner's re-send of a request that was
    # withheld), and from another runner it is still withheld HELD_BY_OTHER, never granted.
    repaired = replace(
        state,
        slot=new_slot,
        health=HEALTH_CLEAR,
        health_reason=None,
        lease_expires_ms=event.event_time_ms,
        granted_checkpoint_id=None,
    )
    trail = make_trail(
        (STEP_REPAIR, f"{event.resolution} by {event.actor}: {event.reason}"),
        (STEP_OBSERVED, f"was {state.health} ({state.health_reason}); {evidence(slot)}"),
    )
    return repaired, decide(repaired, event, VERDICT_RECORDED, REASON_REPAIRED, trail=trail)
