"""The partition watermark: event time that answers a parked resume with no session traffic.

A resume that waits for its intent (`resumes.awaits`) is normally answered when the session's
own intents arrive. A session whose intent never comes has no further traffic, so its resume
would wait forever; the runtime therefore keeps, per partition, the highest event time of the
*intents* it folded and, whenever that moves, asks `expire_parked` of every session whose
`park_deadline` it passed.

Why the intents topic only: the intent a checkpoint names was published before the append and
so before the resume. Once the intents partition has moved `PARK_MS` past the resume, that
intent is not coming. Resumes and acks say nothing about how far the intents topic was read: if
the resumes topic is read a backlog ahead, their times run ahead of intents still unread, and
a watermark fed by them would answer INTENT_NEVER_ARRIVED for intents that are only late.

The same sweep bounds every other waiting input of a quiet session (`parked.expire_overdue`):
an ack whose intent, release or re-arm never comes, an intent or ack under a fence never granted,
a re-arm whose failure never comes. The last two wait on the resumes and acks topics; the
runtime reads a partition's topics in event-time order, so the intents watermark stands for
them too (SPEC.md "Answer protocol" says why that fails closed when it is wrong).

Pure functions: the runtime keeps the value (persisted with the changelog) and passes it in.
"""

from __future__ import annotations

from engine.core.causal import deadline as causal_deadline
from engine.core.events import Decision, Event, IntentEvent
from engine.core.fold import release_overdue
from engine.core.parked import expire_overdue, wait_deadline
from engine.core.state import SessionState

NO_WATERMARK = -1
"""No intent folded on the partition yet."""


def advance(watermark: int, event: Event) -> int:
    """The partition watermark after folding `event` (only intents move it; it never falls)."""
    # `type(...) is`: a negative isinstance on a msgspec class is slow (`fold._dispatch`).
    if type(event) is IntentEvent and event.event_time_ms > watermark:
        return event.event_time_ms
    return watermark


def park_deadline(state: SessionState | None) -> int | None:
    """The watermark at which the session's earliest waiting input is answered; None if none
    (a parked resume, ack or intent: `parked.wait_deadline`; an input waiting for its causes:
    `causal.deadline`)."""
    if state is None:
        return None
    deadlines = [d for d in (wait_deadline(state), causal_deadline(state)) if d is not None]
    return min(deadlines) if deadlines else None


def expire(state: SessionState, watermark: int) -> tuple[SessionState, list[Decision]]:
    """Final answers of the inputs overdue at `watermark` (`parked.expire_overdue`); inputs
    that waited as long for their causes are first folded as they stand (`fold.release_overdue`).
    """
    deadline = park_deadline(state)
    if deadline is None or deadline > watermark:
        return state, []
    state, released = release_overdue(state, watermark)
    state, expired = expire_overdue(state, watermark)
    return state, [*released, *expired]
