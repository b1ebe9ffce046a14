"""Causal order: a v3 input is folded only after every event it names (README "Causal order").

An intent, ack or resume of version 3 carries a `CausalContext`: its producer, its number among
that producer's events in the session, and the events it follows (`after`). The session keeps,
per producer, the highest number folded (`ProducerMark`). An input naming an event above that
mark arrived before its cause: it is answered at once as a waiting input (DEFERRED for a
resume, RECORDED PARKED otherwise) and kept in ``causal_waiting``; after every folded input the
fold folds each waiting one whose causes are now all folded (`fold.py`), and its answer is its
``/final`` one. Inputs without a context (v1, v2) never wait here.

A wait ends without its cause only at the partition watermark, `PARK_MS` of event time after
the input (`watermark.expire`), or when more than `CAUSAL_WAIT_LIMIT` wait: the input is then
folded as it stands, as a producer without causal context would have been (`released`).
"""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.decide import decide, make_trail
from engine.core.events import (
    AckEvent,
    CausalContext,
    Cause,
    Decision,
    Event,
    IntentEvent,
    ResumeEvent,
)
from engine.core.members import (
    REASON_AWAITING_INTENT,
    REASON_PARKED,
    STEP_WHY,
    SUFFIX_FINAL,
    VERDICT_DEFERRED,
    VERDICT_RECORDED,
)
from engine.core.state import (
    CAUSAL_WAIT_LIMIT,
    PARK_MS,
    PRODUCERS_LIMIT,
    CausalWait,
    ProducerMark,
    SessionState,
)


def context_of(event: Event) -> CausalContext | None:
    """The event's causal context (None for v1/v2 producers and for repairs)."""
    if type(event) is IntentEvent or type(event) is AckEvent or type(event) is ResumeEvent:
        return event.causal
    return None


def mark_of(state: SessionState, producer: str) -> int:
    """The highest causal seq of ``producer`` folded in the session (-1: none remembered)."""
    for mark in state.producers:
        if mark.producer == producer:
            return mark.seq
    return -1


def missing(state: SessionState, context: CausalContext) -> list[Cause]:
    """The events ``context`` names that the session has not folded yet."""
    return [cause for cause in context.after if mark_of(state, cause.producer) < cause.seq]


def waits(state: SessionState, event: Event) -> bool:
    """Whether ``event`` names an event the session has not folded yet."""
    context = context_of(event)
    return context is not None and bool(context.after) and bool(missing(state, context))


def note(state: SessionState, event: Event) -> SessionState:
    """Remember that ``event`` was folded: its producer's mark rises to its seq."""
    context = context_of(event)
    if context is None or mark_of(state, context.producer) >= context.seq:
        return state
    marks = [m for m in state.producers if m.producer != context.producer]
    marks.append(
        ProducerMark(producer=context.producer, seq=context.seq, at_ms=event.event_time_ms)
    )
    if len(marks) > PRODUCERS_LIMIT:
        # Forget the producer quiet for longest in event time: the same one whatever the
        # arrival order, so end states do not depend on it.
        marks.remove(min(marks, key=lambda m: (m.at_ms, m.producer)))
    marks.sort(key=lambda m: m.producer)
    return replace(state, producers=marks)


def event_of(waiting: CausalWait) -> IntentEvent | AckEvent | ResumeEvent:
    if waiting.intent is not None:
        return waiting.intent
    if waiting.ack is not None:
        return waiting.ack
    if waiting.resume is not None:
        return waiting.resume
    raise ValueError("a causal wait holds no event")


def _names(causes: list[Cause]) -> str:
    return ", ".join(f"{c.producer}#{c.seq}" for c in causes)


def waiting_answer(state: SessionState, event: Event) -> Decision:
    """The first answer of an input that waits for its causes (and of every copy of it):
    ``final=False``, since its ``/final`` answer replaces it (SPEC.md §4)."""
    context = context_of(event)
    named = _names(missing(state, context)) if context is not None else ""
    why = f"named events not folded yet: {named}; folded when they are"
    trail = make_trail((STEP_WHY, why))
    if type(event) is ResumeEvent:
        return decide(
            state, event, VERDICT_DEFERRED, REASON_AWAITING_INTENT, trail=trail, final=False
        )
    return decide(state, event, VERDICT_RECORDED, REASON_PARKED, trail=trail, final=False)


def wait(
    state: SessionState, event: Event, position: int
) -> tuple[SessionState, Decision, list[CausalWait]]:
    """Keep ``event`` until its causes are folded. Returns the new state, the event's first
    answer and the waits evicted beyond `CAUSAL_WAIT_LIMIT` (oldest first), which the caller
    folds at once."""
    if type(event) is IntentEvent:
        entry = CausalWait(intent=event, position=position)
    elif type(event) is AckEvent:
        entry = CausalWait(ack=event, position=position)
    elif type(event) is ResumeEvent:
        entry = CausalWait(resume=event, position=position)
    else:
        raise TypeError(f"only intents, acks and resumes carry causes, not {type(event).__name__}")
    queue = [*state.causal_waiting, entry]
    evicted, kept = queue[:-CAUSAL_WAIT_LIMIT], queue[-CAUSAL_WAIT_LIMIT:]
    answer = waiting_answer(state, event)
    return replace(state, causal_waiting=kept), answer, [released(w) for w in evicted]


def answer_waiting_copy(state: SessionState, event: Event) -> Decision | None:
    """A copy (same event id) of an input that waits for its causes gets the same answer."""
    for waiting in state.causal_waiting:
        if event_of(waiting).event_id == event.event_id:
            return waiting_answer(state, event_of(waiting))
    return None


def next_ready(state: SessionState) -> CausalWait | None:
    """The oldest waiting input whose causes are all folded now."""
    for waiting in state.causal_waiting:
        context = context_of(event_of(waiting))
        if context is None or not missing(state, context):
            return waiting
    return None


def without(state: SessionState, waiting: CausalWait) -> SessionState:
    event_id = event_of(waiting).event_id
    rest = [w for w in state.causal_waiting if event_of(w).event_id != event_id]
    return replace(state, causal_waiting=rest)


def overdue(state: SessionState, at_ms: int) -> list[CausalWait]:
    """Waiting inputs `PARK_MS` older than the watermark ``at_ms``, oldest first, `released`."""
    return [
        released(w) for w in state.causal_waiting if event_of(w).event_time_ms + PARK_MS <= at_ms
    ]


def released(waiting: CausalWait) -> CausalWait:
    """``waiting`` as it is folded without its causes: its event names none any more (`after`
    emptied; its producer and seq stay), so nothing reads it as following them, also once it is
    noted or parked (`acks.follows_its_intent`): it is folded as it stands."""
    event = event_of(waiting)
    if event.causal is None:
        return waiting
    bare = replace(event, causal=replace(event.causal, after=[]))
    if type(bare) is IntentEvent:
        return replace(waiting, intent=bare)
    if type(bare) is AckEvent:
        return replace(waiting, ack=bare)
    return replace(waiting, resume=bare)


def deadline(state: SessionState) -> int | None:
    """The watermark at which the oldest waiting input is folded without its causes."""
    times = [event_of(w).event_time_ms for w in state.causal_waiting]
    return min(times) + PARK_MS if times else None


def as_final(event_id: str, decisions: list[Decision]) -> list[Decision]:
    """The decisions of an input folded after it waited for its causes.

    It was answered once already (`waiting_answer`): an answer that says it waits again (for
    its intent, fence or release, `parked.py`) is that same first answer and is dropped, and
    any other answer to it is its final one (``/final``). Answers to other inputs pass."""
    out: list[Decision] = []
    for decision in decisions:
        if decision.decision_id != event_id:
            out.append(decision)
            continue
        if decision.verdict is VERDICT_DEFERRED or (
            decision.verdict is VERDICT_RECORDED and decision.reason is REASON_PARKED
        ):
            continue
        out.append(replace(decision, decision_id=event_id + SUFFIX_FINAL))
    return out
