"""Property: once event time has moved past the bound, every input has exactly one final answer.

The logs are `test_properties.worlds` (intents, acks, resumes from several runners, repairs,
duplicates, any interleaving) plus inputs that wait for something that never comes: acks of
intents never registered, acks and intents under a fence never granted. At the end of the log
the partition watermark moves `PARK_MS` past the last input (what the runtime does for a
session nobody writes to any more: `watermark.expire`).

The count is per event id, as a runner sees it: it waits for `in_reply_to` = its request id and
`final = true`, and de-duplicates by `decision_id` (SPEC.md §6). The invariant (SPEC.md §6
"Parked inputs", engine/core/README.md): an event id that waited gets exactly one final answer,
whatever the number of copies; a copy folded while a copy of it waits is answered like the
first (same decision id, same waiting answer), changes no state and so takes no place in
`PARKED_LIMIT` / `PARKED_WRITES_LIMIT`. The one case the fold cannot see (its memory of event
ids is the 8-entry de-duplication window): a copy re-sent after its final answer *and* out of
the window is a new input; if it waits, that is a second wait, with its own final answer. The
property counts waits per event id and checks that such a second wait starts only then.
"""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.events import (
    AckOutcome,
    AckSource,
    Decision,
    Event,
    Reason,
    RepairResolution,
    Verdict,
)
from engine.core.fold import fold, replay
from engine.core.state import PARK_MS, PARKED_LIMIT, SessionState
from engine.core.watermark import expire, park_deadline
from tests.unit.core.builders import ack, intent, msg, repair, resume
from tests.unit.core.test_properties import worlds

EXAMPLES = int(os.environ.get("PARKED_EXAMPLES", "400"))
WAITING = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
WAITS = {Reason.PARKED, Reason.AWAITING_INTENT}


@st.composite
def waiting_worlds(draw: st.DrawFn) -> list[Event]:
    events = list(draw(worlds()))
    extra: list[Event] = []
    for n in range(draw(st.integers(0, 4))):
        fenced = draw(st.booleans())
        extra.append(
            ack(
                f"w-{n}",
                draw(st.sampled_from(list(AckOutcome))),
                source=draw(st.sampled_from(list(AckSource))),
                intent_id=draw(st.sampled_from(["i1", "ghost"])) if fenced else "ghost",
                fence=draw(st.integers(5, 9)) if fenced else None,
                t=draw(st.integers(0, 4)) * (PARK_MS // 2) + 1_200 + n,
            )
        )
    for n in range(draw(st.integers(0, 2))):
        extra.append(
            intent(
                f"f-{n}",
                [msg("a")],
                [],
                intent_id=draw(st.sampled_from(["i1", "i3"])),
                fence=draw(st.integers(5, 9)),
                t=draw(st.integers(0, 4)) * (PARK_MS // 2) + 1_300 + n,
            )
        )
    slots = [draw(st.integers(0, len(events))) for _ in extra]
    for event, slot in sorted(zip(extra, slots, strict=True), key=lambda x: x[1], reverse=True):
        events.insert(slot, event)
    return events


def _waiting_ids(state: SessionState | None) -> list[str]:
    if state is None:
        return []
    return [
        *(p.resume.event_id for p in state.parked_resumes),
        *(a.event_id for a in state.parked_acks),
        *(i.event_id for i in state.parked_intents),
    ]


def _fold_then_expire(
    events: list[Event],
) -> tuple[SessionState, list[Decision], Counter[str]]:
    """The state and decisions after the log and the watermark's sweep, and per event id how
    many times it started to wait: a copy answered "wait" (parked or deferred) while no copy
    of it waited. Checked on every step: a copy of a waiting input is answered like the first
    and changes no state; no event id waits twice at once; PARKED_OVERFLOW only when
    `PARKED_LIMIT` other resumes waited; a second wait only for a copy re-sent after its
    final answer and out of the de-duplication window."""
    state: SessionState | None = None
    decisions: list[Decision] = []
    waits: Counter[str] = Counter()
    answered: set[str] = set()
    for position, event in enumerate(events):
        waiting = _waiting_ids(state)
        result = fold(state, event, position)
        answer = next(d for d in result.decisions if d.decision_id == event.event_id)
        if event.event_id in waiting:
            assert result.state == state
            assert [answer] == list(result.decisions)
            assert answer.reason in WAITS
        elif answer.reason in WAITS:
            if event.event_id in answered:
                assert state is not None
                assert event.event_id not in state.recent_event_ids
            waits[event.event_id] += 1
        if any(d.reason is Reason.PARKED_OVERFLOW for d in result.decisions):
            assert state is not None
            resumes = {p.resume.event_id for p in state.parked_resumes}
            assert len(resumes) == PARKED_LIMIT
            assert event.event_id not in resumes
        now = _waiting_ids(result.state)
        assert len(now) == len(set(now))
        answered |= {d.in_reply_to for d in result.decisions if d.decision_id.endswith("/final")}
        state, decisions = result.state, [*decisions, *result.decisions]
    assert state is not None
    end = max(e.event_time_ms for e in events) + PARK_MS
    state, expired = expire(state, end)
    return state, [*decisions, *expired], waits


@WAITING
@given(waiting_worlds())
def test_every_input_has_one_final_answer_once_event_time_passes_the_bound(
    events: list[Event],
) -> None:
    state, decisions, waits = _fold_then_expire(events)
    finals = Counter(d.in_reply_to for d in decisions if d.decision_id.endswith("/final"))
    for event_id in {e.event_id for e in events}:
        assert finals[event_id] == waits[event_id], event_id
    assert all(d.verdict is not Verdict.DEFERRED for d in decisions if "/final" in d.decision_id)
    # Nothing is left waiting (a copy of the open intent's REGISTER re-sent after the
    # de-duplication window waits as a re-arm for its failure: the watermark answers it too).
    assert (state.parked_acks, state.parked_intents, state.parked_resumes) == ([], [], [])
    assert park_deadline(state) is None


@WAITING
@given(waiting_worlds(), st.data())
def test_replay_with_waiting_inputs_is_deterministic(
    events: list[Event], data: st.DataObject
) -> None:
    full = replay(events)
    assert full == replay(events)
    cut = data.draw(st.integers(0, len(events)))
    state: SessionState | None = None
    decisions: list[Decision] = []
    for position, event in enumerate(events):
        if position == cut and state is not None:
            state = SessionState.from_record(state.to_record())
        result = fold(state, event, position)
        state, decisions = result.state, [*decisions, *result.decisions]
    assert decisions == full
    assert _fold_then_expire(events) == _fold_then_expire(events)


def test_a_resume_redelivered_while_it_waits_gets_one_final_answer() -> None:
    """The log Hypothesis found (CI, 2026-12): `r-0` is DEFERRED, eight inputs push it out of
    the de-duplication window, and its copy comes while it still waits: DEFERRED again, not
    parked beside it. When the watermark answers the acks as they stand, `a-2` (a commit of
    `i2` with no count) turns the session AMBIGUOUS, progress reaches the checkpoint, and
    `drain` answers `r-0` once: a runner waiting for `r-0` sees one final answer."""
    batch = [msg("a")]
    events: list[Event] = [
        resume("r-0", None, [], runner="r1", seq=2, t=3_000),
        ack("w-1", AckOutcome.COMMITTED, intent_id="ghost", t=1_201),
        ack("w-0", AckOutcome.COMMITTED, intent_id="ghost", t=1_200),
        ack("a-0", AckOutcome.COMMITTED, intent_id="i2", count=0, t=1_500),
        ack("a-1", AckOutcome.COMMITTED, intent_id="i1", t=1_501),
        ack("a-2", AckOutcome.COMMITTED, intent_id="i2", t=1_502),
        intent("i-1", batch, [], seq=1, t=1_000),
        repair("fix", RepairResolution.ACCEPT_COMMITTED, intent_id=None, t=50_000),
        intent("i-2", batch, batch, intent_id="i2", seq=2, t=2_000),
        resume("r-0", None, [], runner="r1", seq=2, t=3_000),
    ]
    state, decisions, waits = _fold_then_expire(events)
    first = [d for d in decisions if d.decision_id == "r-0"]
    assert [(d.verdict, d.final) for d in first] == [(Verdict.DEFERRED, False)] * 2
    assert waits["r-0"] == 1
    finals = [d for d in decisions if d.decision_id == "r-0/final"]
    assert [(d.verdict, d.reason, d.final) for d in finals] == [
        (Verdict.WITHHELD, Reason.SESSION_AMBIGUOUS, True)
    ]
    assert (state.parked_acks, state.parked_intents, state.parked_resumes) == ([], [], [])
