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

from engine.core.acks import ack_ready, answer_unready, awaits_rearm, fold_ack, knows_attempt
from engine.core.authority import awaits_grant
from engine.core.decide import decide, make_trail, reject
from engine.core.events import (
    AckEvent,
    Decision,
    Event,
    IntentEvent,
    ResumeEvent,
)
from engine.core.intents import awaits_failure, fold_intent, opens_attempt
from engine.core.members import (
    REASON_PARKED,
    REASON_UNKNOWN_FENCE,
    STEP_WHY,
    SUFFIX_FINAL,
    VERDICT_RECORDED,
)
from engine.core.resumes import awaits, deferred, evaluate_resume, expire_parked
from engine.core.state import PARK_MS, PARKED_WRITES_LIMIT, SessionState


def intent_waits(state: SessionState, event: IntentEvent) -> bool:
    """An intent under a fence not granted yet, or a retry in place ahead of its failure."""
    return awaits_grant(state, event) or awaits_failure(state, event)


def park_intent(state: SessionState, event: IntentEvent) -> tuple[SessionState, list[Decision]]:
    """A holder's intent under a fence whose grant the engine has not folded yet, or a re-arm
    whose NOT_WRITTEN has not been folded yet (`intents.awaits_failure`)."""
    parked = [*state.parked_intents, event]
    evicted, kept = parked[:-PARKED_WRITES_LIMIT], parked[-PARKED_WRITES_LIMIT:]
    new_state = replace(state, parked_intents=kept)
    decisions = [_intent_parked(state, event)]
    still = {i.event_id for i in kept}
    for old in evicted:
        if old.event_id in still:  # a copy in a state from an older engine: answered later
            continue
        still.add(old.event_id)
        why = f"no grant of fence {old.fence_token} arrived while {PARKED_WRITES_LIMIT} waited"
        decisions.append(reject(new_state, old, REASON_UNKNOWN_FENCE, why, SUFFIX_FINAL))
    return new_state, decisions


def _intent_parked(state: SessionState, event: IntentEvent) -> Decision:
    why = f"fence {event.fence_token} is ahead of the engine's {state.fence_token}"
    if not awaits_grant(state, event):
        why = f"re-arm of {event.intent_id} ahead of the failure it retries"
    return _parked_answer(state, event, why)


def park_ack(state: SessionState, event: AckEvent) -> tuple[SessionState, list[Decision]]:
    """An ack ahead of its intent, fence, release or re-arm (`acks.ack_ready`): RECORDED PARKED
    now; the oldest beyond `PARKED_WRITES_LIMIT` is answered finally, as it stands."""
    parked = [*state.parked_acks, event]
    evicted, kept = parked[:-PARKED_WRITES_LIMIT], parked[-PARKED_WRITES_LIMIT:]
    new_state = replace(state, parked_acks=kept)
    decisions = [_ack_parked(state, event)]
    still = {a.event_id for a in kept}
    for old in evicted:
        if old.event_id in still:  # a copy in a state from an older engine: answered later
            continue
        still.add(old.event_id)
        why = f"what the ack refers to did not arrive while {PARKED_WRITES_LIMIT} acks waited"
        new_state, answer = answer_unready(new_state, old, why)
        decisions.append(answer)
    return new_state, decisions


def _ack_parked(state: SessionState, event: AckEvent) -> Decision:
    why = "the ack refers to an intent, fence, release or re-arm not folded yet"
    return _parked_answer(state, event, why)


def _parked_answer(state: SessionState, event: Event, why: str) -> Decision:
    """RECORDED PARKED, ``final=False``: the `/final` answer replaces it (SPEC.md §4, Decision
    ``final``), so a producer waiting for ``final=true`` waits for the answer that counts."""
    trail = make_trail((STEP_WHY, why))
    return decide(state, event, VERDICT_RECORDED, REASON_PARKED, trail=trail, final=False)


def answer_waiting_copy(state: SessionState, event: Event) -> Decision | None:
    """The answer to a copy (same event id) of an input that waits, or None if none waits.

    A copy is answered as its first copy was (RECORDED PARKED, or DEFERRED for a resume, same
    `decision_id`) and is not parked again: each event id waits once, takes one place in the
    limits and gets one final answer (SPEC.md §6 "Parked inputs"). It changes no state, so it
    also times nothing: the first copy, with the same event time, already did."""
    event_id = event.event_id
    if type(event) is ResumeEvent:
        waits = any(p.resume.event_id == event_id for p in state.parked_resumes)
        return deferred(state, event) if waits else None
    if type(event) is AckEvent:
        waits = any(a.event_id == event_id for a in state.parked_acks)
        return _ack_parked(state, event) if waits else None
    if type(event) is IntentEvent and any(i.event_id == event_id for i in state.parked_intents):
        return _intent_parked(state, event)
    return None


def _final(decision: Decision) -> Decision:
    if decision.decision_id.endswith(SUFFIX_FINAL):
        return decision
    return replace(decision, decision_id=decision.in_reply_to + SUFFIX_FINAL)


def drain(state: SessionState) -> tuple[SessionState, list[Decision]]:
    """Answer every waiting input that is ready now, oldest first, until none is."""
    decisions: list[Decision] = []
    while True:
        intent = next((i for i in state.parked_intents if not intent_waits(state, i)), None)
        if intent is not None:
            rest = [i for i in state.parked_intents if i.event_id != intent.event_id]
            state, answers = fold_ready_intent(replace(state, parked_intents=rest), intent)
            decisions.append(_final(answers[0]))
            decisions.extend(answers[1:])
            continue
        ack = next((a for a in state.parked_acks if ack_ready(state, a)), None)
        if ack is not None:
            rest_acks = [a for a in state.parked_acks if a.event_id != ack.event_id]
            state, decision = fold_ack(replace(state, parked_acks=rest_acks), ack, SUFFIX_FINAL)
            decisions.append(decision)
            continue
        parked = next((p for p in state.parked_resumes if not awaits(state, p.resume)), None)
        if parked is None:
            return state, decisions
        rest_resumes = [
            p for p in state.parked_resumes if p.resume.event_id != parked.resume.event_id
        ]
        # As when it is folded at once (fold.py): overdue waiting writes are judged first, on
        # the resumes' clock (`expire_writes`: acks waiting for their intent keep waiting).
        state, settled = expire_writes(
            replace(state, parked_resumes=rest_resumes), parked.resume.event_time_ms, unseen=False
        )
        state, decision = evaluate_resume(state, parked.resume, parked.position, SUFFIX_FINAL)
        decisions.append(decision)
        decisions.extend(settled)


def fold_ready_intent(
    state: SessionState, event: IntentEvent
) -> tuple[SessionState, list[Decision]]:
    """Fold an intent that waits for nothing; its own answer first, then any final answers of
    waiting writes it settles (a superseded re-arm, commits of the attempt it retries)."""
    state, superseded = settle_superseded_rearms(state, event)
    state, early = settle_failed_attempt(state, event)
    state, decision = fold_intent(state, event)
    return state, [decision, *superseded, *early]


def settle_superseded_rearms(
    state: SessionState, event: IntentEvent
) -> tuple[SessionState, list[Decision]]:
    """A newer intent of the holder's is about to supersede a re-arm still waiting for its
    NOT_WRITTEN: the holder moved on, so the retry ran, and the failure it retried is implied
    by the re-arm itself. The re-arm opens its attempt now, as it would have in time order."""
    slot = state.slot
    if slot is None or event.intent_id == slot.intent_id:
        return state, []
    waiting = [i for i in state.parked_intents if awaits_failure(state, i)]
    decisions: list[Decision] = []
    for rearm in waiting:
        current = state.slot
        if current is None:
            break
        rest = [i for i in state.parked_intents if i.event_id != rearm.event_id]
        failed = replace(current, not_written=True)
        state, decision = fold_intent(replace(state, parked_intents=rest, slot=failed), rearm)
        decisions.append(_final(decision))
    return state, decisions


def settle_failed_attempt(
    state: SessionState, event: IntentEvent
) -> tuple[SessionState, list[Decision]]:
    """Before a re-arm opens a new attempt: parked commits older than it are the failed
    attempt's own (`acks.awaits_rearm`), so they are judged against that attempt first.

    A commit of an attempt that also reported a definite failure is contradictory evidence
    (AMBIGUOUS, alert), and it must not pass for the retry's commit, which could hide a second
    copy of the batch. Event time tells the two apart: the runner publishes the re-arm after
    the failed attempt's acks and before the retry's.
    """
    if not opens_attempt(state, event):
        return state, []
    older = [
        a
        for a in state.parked_acks
        if a.event_time_ms < event.event_time_ms and awaits_rearm(state, a)
    ]
    return _judge_acks(state, older)


def _judge_acks(state: SessionState, acks: list[AckEvent]) -> tuple[SessionState, list[Decision]]:
    decisions: list[Decision] = []
    for ack in acks:
        rest = [a for a in state.parked_acks if a.event_id != ack.event_id]
        state, decision = fold_ack(replace(state, parked_acks=rest), ack, SUFFIX_FINAL)
        decisions.append(decision)
    return state, decisions


def wait_deadline(state: SessionState, *, all_topics: bool = True) -> int | None:
    """The earliest event time at which a waiting input is answered as it stands, `PARK_MS`
    after its own time. `all_topics` (the runtime's partition watermark): every waiting input.
    Without it (the fold's own intents): only the inputs that wait on the intents topic, that
    is parked resumes and acks waiting for an intent, a release or a re-arm."""
    times = [p.resume.event_time_ms for p in state.parked_resumes]
    times += [
        a.event_time_ms for a in state.parked_acks if all_topics or not awaits_grant(state, a)
    ]
    if all_topics:
        times += [i.event_time_ms for i in state.parked_intents]
    return min(times) + PARK_MS if times else None


def expire_writes(
    state: SessionState,
    at_ms: int,
    *,
    acks: bool = True,
    unseen: bool = True,
    rearms: bool = True,
    grants: bool = True,
) -> tuple[SessionState, list[Decision]]:
    """Answer, finally and as they stand, the parked writes `PARK_MS` older than `at_ms`, the
    time of an input of the topic they wait on (what they wait for was published before them
    on that topic, which is read in order): `unseen` acks waiting for their intent, `acks` of a
    known attempt waiting for its release or re-arm, `rearms` waiting for their failure, and
    (`grants`) intents and acks waiting for the grant of their fence.
    `acks.answer_unready` says what an ack that stops waiting is answered.

    Why a resume may judge `acks` but not `unseen` ones (SPEC.md §6 "Parked inputs"): an ack of
    a known attempt judged as it stands lands on that attempt (fail closed, nothing is lost),
    and it must be, before the resume is classified against that attempt. An ack of an intent
    not folded yet is answered UNKNOWN_INTENT and never counts afterwards: only the intents
    topic's own clock may say that intent is not coming."""
    decisions: list[Decision] = []
    for ack in list(state.parked_acks):
        if not any(a.event_id == ack.event_id for a in state.parked_acks):
            continue  # a copy (state from an older engine) answered with its first
        waits_on_grant = awaits_grant(state, ack)
        clock = grants if waits_on_grant else acks if knows_attempt(state, ack) else unseen
        if ack.event_time_ms + PARK_MS > at_ms or not clock:
            continue
        rest_acks = [a for a in state.parked_acks if a.event_id != ack.event_id]
        if waits_on_grant:
            why = f"no grant of fence {ack.fence_token} arrived within {PARK_MS} ms of event time"
        else:
            why = f"intent {ack.intent_id} (or its release or re-arm) did not arrive in time"
            why += f" ({PARK_MS} ms of event time)"
        state, decision = answer_unready(replace(state, parked_acks=rest_acks), ack, why)
        decisions.append(decision)
    overdue = _first_copies([i for i in state.parked_intents if i.event_time_ms + PARK_MS <= at_ms])
    unfenced = [i for i in overdue if grants and awaits_grant(state, i)]
    retries = [
        i for i in overdue if rearms and not awaits_grant(state, i) and awaits_failure(state, i)
    ]
    for intent in unfenced:
        why = f"no grant of fence {intent.fence_token} arrived within {PARK_MS} ms of event time"
        rest = [i for i in state.parked_intents if i.event_id != intent.event_id]
        state = replace(state, parked_intents=rest)
        decisions.append(reject(state, intent, REASON_UNKNOWN_FENCE, why, SUFFIX_FINAL))
    for intent in retries:
        rest = [i for i in state.parked_intents if i.event_id != intent.event_id]
        state, decision = fold_intent(replace(state, parked_intents=rest), intent)
        decisions.append(_final(decision))
    if not decisions:
        return state, decisions
    state, drained = drain(state)
    return state, [*decisions, *drained]


def _first_copies(intents: list[IntentEvent]) -> list[IntentEvent]:
    """One intent per event id (a state from an older engine can hold two copies of one)."""
    seen: set[str] = set()
    first: list[IntentEvent] = []
    for i in intents:
        if i.event_id not in seen:
            seen.add(i.event_id)
            first.append(i)
    return first


def expire_overdue(
    state: SessionState, at_ms: int, *, all_topics: bool = True
) -> tuple[SessionState, list[Decision]]:
    """Final answers of the inputs that waited `PARK_MS` of intents event time (`at_ms`):
    parked acks (answered as they stand, `acks.answer_unready`), then parked resumes (WITHHELD
    INTENT_NEVER_ARRIVED). With `all_topics` (the runtime's partition watermark), also the
    writes that wait on another topic: intents and acks waiting for the grant of their fence
    (on the resumes topic), re-arms waiting for their failure (on the acks topic). The runtime
    reads a partition's three topics in event-time order (`runtime/intake/ordering.py`), so once its
    intents are `PARK_MS` past, so are the others; and a grant is decided before its holder can
    write under it, so a live engine waits on one only for a token it never issued. The fold
    bounds those by the session's own resumes and acks instead (`expire_writes`), so that its
    answers do not depend on how far one topic is read ahead of another."""
    deadline = wait_deadline(state, all_topics=all_topics)
    if deadline is None or deadline > at_ms:
        return state, []
    state, decisions = expire_writes(state, at_ms, rearms=all_topics, grants=all_topics)
    state, expired = expire_parked(state, at_ms)
    return state, [*decisions, *expired]
