"""Acks: evidence about an append (committed, not written, unknown), from runner or store."""

from __future__ import annotations

from typing import Any

from msgspec.structs import replace

from engine.core.authority import awaits_grant, check_writer, renew
from engine.core.decide import (
    ACTION_REPAIR,
    decide,
    make_trail,
    reject,
)
from engine.core.events import (
    AckEvent,
    AnswerSuffix,
    Decision,
    Reason,
)
from engine.core.members import (
    HEALTH_AMBIGUOUS,
    HEALTH_CLEAR,
    HEALTH_VIOLATED,
    OUTCOME_COMMITTED,
    OUTCOME_NOT_WRITTEN,
    OUTCOME_UNKNOWN,
    REASON_ACCEPTED,
    REASON_AMBIGUOUS,
    REASON_GATE_VIOLATION,
    REASON_HISTORY_CHANGED,
    REASON_LATE_APPEND,
    REASON_PARTIAL_COMMIT,
    REASON_STALE_FENCE,
    REASON_UNKNOWN_FENCE,
    REASON_UNKNOWN_INTENT,
    SLOT_ABANDONED,
    SLOT_ABSENT,
    SLOT_APPEND_GRANTED,
    SLOT_COMMITTED,
    SLOT_DISCARDED,
    SLOT_HELD,
    SLOT_PENDING,
    SOURCE_RUNNER,
    SOURCE_STORE,
    STEP_ALERT,
    STEP_EVIDENCE,
    STEP_WHY,
    SUFFIX_FINAL,
    SUFFIX_FIRST,
    VERDICT_RECORDED,
    VERDICT_REJECTED,
)
from engine.core.state import (
    LEASE_MS,
    UNRESOLVED,
    IntentSlot,
    SessionState,
)


def fold_ack(
    state: SessionState, event: AckEvent, suffix: AnswerSuffix = SUFFIX_FIRST
) -> tuple[SessionState, Decision]:
    """Fold an ack as it stands: the caller parks one that is not `ack_ready` (`parked.py`)."""
    slot = state.slot
    if event.source is SOURCE_RUNNER:
        refusal = check_writer(state, event.runner_id, event.fence_token, event.event_time_ms)
        if refusal is not None:
            late = (
                event.outcome is OUTCOME_COMMITTED
                and slot is not None
                and slot.intent_id == event.intent_id
                and slot.status is SLOT_APPEND_GRANTED
            )
            if late:
                why = "a fenced-out writer's append landed after another holder was told to append"
                state = replace(state, health=HEALTH_VIOLATED, health_reason=REASON_LATE_APPEND)
                return state, decide(
                    state,
                    event,
                    VERDICT_REJECTED,
                    REASON_LATE_APPEND,
                    trail=make_trail((STEP_ALERT, why)),
                    action=ACTION_REPAIR,
                    alert=True,
                    suffix=suffix,
                )
            if refusal is REASON_STALE_FENCE:
                # Evidence of an attempt older than the current grant: recorded, kept out of
                # the current attempt (whether it is folded before or after the grant).
                why = f"ack under fence {event.fence_token}, older than {state.fence_token}"
                # A v3 ack names its causes, and the old holder never learns of the grant
                # that superseded it: the two are concurrent, so the answer is the one the
                # ack gets folded before that grant (README "Causal order").
                answer_reason = REASON_ACCEPTED if event.causal is not None else refusal
                if event.causal is not None:
                    why += "; kept as evidence of that attempt, the current one is untouched"
                trail = make_trail((STEP_WHY, why))
                return state, decide(
                    state, event, VERDICT_RECORDED, answer_reason, trail=trail, suffix=suffix
                )
            why = "ack from a runner without authority"
            return state, reject(state, event, refusal, why, suffix)
    if slot is None or slot.intent_id != event.intent_id:  # the superseded intent's ack
        return state, decide(state, event, VERDICT_RECORDED, REASON_ACCEPTED, suffix=suffix)
    why = _past_evidence(state, slot, event)
    if why:
        trail = make_trail((STEP_WHY, why))
        return state, decide(
            state, event, VERDICT_RECORDED, REASON_ACCEPTED, trail=trail, suffix=suffix
        )
    new_state, reason, alert = apply_ack(state, slot, event)
    return new_state, ack_answer(new_state, event, reason, alert, suffix)


def tail_lost_batch(slot: IntentSlot, event: AckEvent) -> bool:
    """A store COMMITTED ack whose observed tail does not end with the intent's batch.

    The store reads its tail as of the append's own transaction (an outbox row written with the
    append, or CDC at that change), in the appended form of its items (SPEC.md §6 "Store acks"),
    so an honest tail ends with the batch whatever the runner appended since: a tail that does
    not means the append committed something other than the batch, or another writer's rows
    landed in it. Only the batch is compared: ``before`` was read by the runner in the stored form,
    which a backend that rewrites items (``items_digest_stable`` false) digests differently.
    On such a backend this is the only evidence of a foreign rewrite, since a resume's tail can
    be compared by ``before`` and length only (`reconcile._tail_ends_with_batch`).
    """
    tail = event.observed_tail
    if event.source is not SOURCE_STORE or tail is None:
        return False
    batch = slot.batch
    return len(tail) < len(batch) or tail[len(tail) - len(batch) :] != batch


def _past_evidence(state: SessionState, slot: IntentSlot, event: AckEvent) -> str:
    """Why the ack cannot be evidence about the slot's attempt any more ("" if it can be).

    The fold keeps event ids only in its window, so a late copy of an ack (a producer retry, a
    runner re-sending after a crash) is folded again. Two cases are recognised from the state
    alone, without remembering more ids (SPEC.md §6 "Late copies"):

    * The write was resolved without acks: by an operator's repair (ABSENT, ABANDONED, or
      COMMITTED with every evidence flag cleared) or by a resume whose tail proved it
      committed. That resolution supersedes the evidence it was made from; the next attempt
      starts with a grant under a new fence. Folded again, a copy of the partial commit the
      operator repaired would turn the session AMBIGUOUS a second time.
    * A runner's NOT_WRITTEN after that runner's COMMITTED of the same intent, under the same
      fence (the caller checked the writer), stamped before the lease that COMMITTED renewed
      (`event_time_ms + LEASE_MS < lease_expires_ms`): the runner acks in order on one topic,
      so it is the failure of an earlier attempt, retried in place. Folded, it would
      contradict the retry's commit (AMBIGUOUS) although nothing went wrong. A NOT_WRITTEN
      stamped at or after the commit stays a contradiction.
    """
    if slot.status in (SLOT_ABSENT, SLOT_ABANDONED) or (
        slot.status is SLOT_COMMITTED
        and not (
            slot.committed_by_store
            or slot.committed_by_runner
            or slot.not_written
            or slot.partial_seen
        )
    ):
        return f"intent {slot.intent_id} was resolved {slot.status} without acks; not reopened"
    if (
        event.source is SOURCE_RUNNER
        and event.outcome is OUTCOME_NOT_WRITTEN
        and slot.committed_by_runner
        and event.event_time_ms + LEASE_MS < (state.lease_expires_ms or 0)
    ):
        return "the runner acknowledged this intent committed already: an earlier attempt's failure"
    return ""


def ack_ready(state: SessionState, event: AckEvent) -> bool:
    """Whether the engine has folded everything this ack refers to.

    Not yet: a fence newer than any grant (the grant's resume is still on its way), an intent
    id it has not seen, a COMMITTED for a batch still held (the RELEASE or DISCARD that says
    what was written is still on its way), or a COMMITTED after a definite failure of the same
    attempt (`awaits_rearm`). Correctness may not depend on which topic is read first, so such
    an ack waits instead of being judged on a state that is behind.
    """
    if awaits_grant(state, event):
        return False
    slot = state.slot
    if slot is None or slot.intent_id != event.intent_id:
        # An id the state no longer holds is a write superseded since, whose evidence changes
        # nothing, however many intents superseded it, when the ack's causal order says its
        # intent was folded (`follows_its_intent`); otherwise it waits for that intent.
        return follows_its_intent(event) or event.intent_id == state.previous_intent_id
    if awaits_rearm(state, event):
        return False
    return not (event.outcome is OUTCOME_COMMITTED and slot.status is SLOT_HELD)


def follows_its_intent(event: AckEvent) -> bool:
    """Whether the ack's causal context says its intent was folded: it names a runner event (a
    runner ack its own previous one; a store ack, beside the store's previous ack, the runner
    event its append followed), which follows the intent in that runner's chain, and it was
    folded only after it. Not a store ack naming only the store's own acks, nor an ack folded
    without its causes (evicted, or released by the watermark), which names none any more
    (`causal.released`): such an ack is folded as one without causal context would be, and
    waits for its intent (SPEC.md §7 "Causal context")."""
    context = event.causal
    if context is None:
        return False
    own = context.producer
    if event.source is SOURCE_RUNNER:
        return any(cause.producer == own for cause in context.after)
    return any(cause.producer != own for cause in context.after)


def awaits_rearm(state: SessionState, event: AckEvent) -> bool:
    """A COMMITTED ack for an attempt whose only evidence is a definite failure, same fence.

    The failed attempt wrote nothing, so a commit can only come from a retry in place, and the
    runner publishes that retry's re-arm (a REGISTER of the same intent) before appending: with
    the acks topic read ahead of the intents, the re-arm is on its way. Judged now, the commit
    would contradict the failure (AMBIGUOUS); it waits for the re-arm, which opens the attempt
    it belongs to, or for `PARK_MS` of intents (`parked.expire_overdue`), after which it is
    judged as it stands. A commit older than the re-arm is the failed attempt's own: see
    `parked.settle_failed_attempt`.
    """
    slot = state.slot
    return (
        slot is not None
        and slot.intent_id == event.intent_id
        and event.outcome is OUTCOME_COMMITTED
        and event.committed_count in (None, len(slot.items))
        and event.fence_token in (None, state.fence_token)
        and slot.not_written
        and not slot.held
        and slot.status in (SLOT_PENDING, SLOT_APPEND_GRANTED)
        and not (slot.committed_by_store or slot.committed_by_runner or slot.partial_seen)
    )


def knows_attempt(state: SessionState, event: AckEvent) -> bool:
    """Whether the ack names an attempt the engine folded: its intent (current or superseded)
    under a fence that was granted. Only such an ack can be evidence about a write."""
    if awaits_grant(state, event):
        return False
    slot = state.slot
    known = slot is not None and slot.intent_id == event.intent_id
    return known or event.intent_id == state.previous_intent_id


def may_have_written(event: AckEvent) -> bool:
    """The ack does not rule out that its batch (or part of it) is in the Session."""
    if event.outcome is OUTCOME_UNKNOWN:
        return True
    return event.outcome is OUTCOME_COMMITTED and event.committed_count != 0


def answer_unready(state: SessionState, event: AckEvent, why: str) -> tuple[SessionState, Decision]:
    """The final answer of a parked ack that stops waiting (evicted, or overdue).

    An ack of a known attempt is judged as it stands (a commit after a definite failure with no
    re-arm: AMBIGUOUS; a commit of a batch still held: GATE_VIOLATION). Any other ack is
    evidence of no attempt and changes no slot:

    * under a fence the engine never granted: REJECTED UNKNOWN_FENCE (the writer has no
      authority). If it says the batch may be in the Session (`may_have_written`), a write
      landed under a token no grant accounts for, so the session turns AMBIGUOUS (alerted on
      the transition) and nothing is granted on it until a repair.
    * naming an intent the engine does not know: RECORDED UNKNOWN_INTENT. The state keeps only
      the current and the previous intent id, so an ack of a write superseded twice (its
      intents read ahead of its acks) looks the same as one of a write never registered; the
      former is harmless, and turning the session AMBIGUOUS on it would lock sessions that
      only had a backlog. A write whose intent never came is caught where it matters: a
      checkpoint that names it is withheld INTENT_NEVER_ARRIVED (SPEC.md §6 "Parked inputs").
    """
    if knows_attempt(state, event):
        return fold_ack(state, event, SUFFIX_FINAL)
    if not awaits_grant(state, event):
        trail = make_trail((STEP_WHY, why))
        return state, decide(
            state,
            event,
            VERDICT_RECORDED,
            REASON_UNKNOWN_INTENT,
            trail=trail,
            suffix=SUFFIX_FINAL,
        )
    if may_have_written(event) and state.health is HEALTH_CLEAR:
        state = replace(state, health=HEALTH_AMBIGUOUS, health_reason=REASON_UNKNOWN_FENCE)
        why += f"; it says {event.outcome}: a write may have landed under a fence never granted"
        return state, decide(
            state,
            event,
            VERDICT_REJECTED,
            REASON_UNKNOWN_FENCE,
            trail=make_trail((STEP_ALERT, why)),
            action=ACTION_REPAIR,
            alert=True,
            suffix=SUFFIX_FINAL,
        )
    return state, reject(state, event, REASON_UNKNOWN_FENCE, why, SUFFIX_FINAL)


def ack_answer(
    state: SessionState, event: AckEvent, reason: Reason, alert: bool, suffix: AnswerSuffix
) -> Decision:
    """RECORDED, with the alert set when this evidence moved the session out of CLEAR."""
    trail = make_trail((STEP_EVIDENCE, f"{event.source} ack {event.outcome}"))
    if reason is REASON_HISTORY_CHANGED:
        tail = event.observed_tail or []
        why = (
            f"the store's tail after the append ({len(tail)} digests) does not end with the "
            "batch: the Session history changed after it was written"
        )
        trail.extend(make_trail((STEP_WHY, why)))
    return decide(
        state,
        event,
        VERDICT_RECORDED,
        reason,
        alert=alert,
        action=ACTION_REPAIR if alert else None,
        trail=trail,
        suffix=suffix,
    )


def apply_ack(
    state: SessionState, slot: IntentSlot, event: AckEvent
) -> tuple[SessionState, Reason, bool]:
    """Apply evidence to the slot. Returns the new state, the answer's reason and the alert.

    The alert is raised exactly when the session's health changes (CLEAR to AMBIGUOUS or
    VIOLATED, AMBIGUOUS to VIOLATED): one alerting decision per transition, whichever input
    caused it and whenever it is folded.
    """
    new_state, reason = _apply_evidence(state, slot, event)
    return new_state, reason, new_state.health is not state.health


def _from_older_attempt(state: SessionState, slot: IntentSlot, event: AckEvent) -> bool:
    """A store ack stamped with a fence older than the running APPEND_ONCE attempt's."""
    return (
        event.source is SOURCE_STORE
        and event.fence_token is not None
        and event.fence_token < state.fence_token
        and slot.status is SLOT_APPEND_GRANTED
    )


def _apply_evidence(
    state: SessionState, slot: IntentSlot, event: AckEvent
) -> tuple[SessionState, Reason]:
    n = len(slot.items)
    count = event.committed_count
    if event.runner_id and event.source is SOURCE_RUNNER:
        state = renew(state, event.runner_id, event.event_time_ms)
    if _from_older_attempt(state, slot, event):
        if event.outcome is OUTCOME_COMMITTED and count != 0:
            # The old attempt landed after a new holder was told to append: a duplicate.
            return replace(state, health=HEALTH_VIOLATED, health_reason=REASON_LATE_APPEND), (
                REASON_LATE_APPEND
            )
        return state, REASON_ACCEPTED  # a failure of an earlier attempt says nothing of this one
    if event.outcome is OUTCOME_COMMITTED and count is not None and 0 < count < n:
        state = _at_least_ambiguous(state, REASON_PARTIAL_COMMIT)
        return replace(state, slot=replace(slot, partial_seen=True)), REASON_PARTIAL_COMMIT
    if event.outcome is OUTCOME_COMMITTED and count == 0:
        event = replace(event, outcome=OUTCOME_NOT_WRITTEN)
    if event.outcome is OUTCOME_COMMITTED:
        if slot.status in (SLOT_HELD, SLOT_DISCARDED):
            return (
                replace(state, health=HEALTH_VIOLATED, health_reason=REASON_GATE_VIOLATION),
                REASON_GATE_VIOLATION,
            )
        store = event.source is SOURCE_STORE
        update: dict[str, Any] = {
            "committed_by_store": slot.committed_by_store or store,
            "committed_by_runner": slot.committed_by_runner or not store,
        }
        if slot.status in UNRESOLVED:
            update["status"] = SLOT_COMMITTED
        if slot.not_written:
            state = _at_least_ambiguous(state, REASON_AMBIGUOUS)
            return replace(state, slot=replace(slot, **update)), REASON_AMBIGUOUS
        if tail_lost_batch(slot, event):
            # The batch was written, and the store saw it gone or followed since: "do not
            # replay" could lose output or hide a second writer (like a resume's HISTORY_CHANGED).
            if state.health is HEALTH_CLEAR:
                state = replace(
                    state, health=HEALTH_AMBIGUOUS, health_reason=REASON_HISTORY_CHANGED
                )
            return replace(state, slot=replace(slot, **update)), REASON_HISTORY_CHANGED
        return replace(state, slot=replace(slot, **update)), REASON_ACCEPTED
    if event.outcome is OUTCOME_NOT_WRITTEN:
        new_slot = replace(slot, not_written=True)
        if slot.committed_by_store or slot.committed_by_runner:
            state = _at_least_ambiguous(state, REASON_AMBIGUOUS)
            return replace(state, slot=new_slot), REASON_AMBIGUOUS
        return replace(state, slot=new_slot), REASON_ACCEPTED
    return state, REASON_ACCEPTED


def _at_least_ambiguous(state: SessionState, reason: Reason) -> SessionState:
    """Evidence that contradicts itself makes a session AMBIGUOUS, never less than it was: a
    VIOLATED session (a duplicate already happened) keeps its health and its reason."""
    if state.health is HEALTH_VIOLATED:
        return state
    return replace(state, health=HEALTH_AMBIGUOUS, health_reason=reason)
