"""Property: once event time has moved past the bound, every input has exactly one final answer.

The logs are `test_properties.worlds` (intents, acks, resumes from several runners, repairs,
duplicates, any interleaving) plus inputs that wait for something that never comes: acks of
intents never registered, acks and intents under a fence never granted. At the end of the log
the partition watermark moves `PARK_MS` past the last input (what the runtime does for a
session nobody writes to any more: `watermark.expire`).

The count is per event id, as a runner sees it: it waits for `in_reply_to` = its request id and
`final = true`, and de-duplicates by `decision_id` (SPEC.md §6), so every copy of one input has
the same `<event id>/final`. A copy re-sent after the de-duplication window while the first
still waits is parked beside it; the fold then answers the event id once when what it waits
for arrives (`parked.drain` takes every copy of it: judging both would give the second copy
CHECKPOINT_ALREADY_RESUMED under the grant's own decision id), or once per copy when the
watermark answers them as they stand. Both leave the runner one final answer, so the property
is: an event id that waited gets at least one final answer, and no more than it has waiting
copies; one that never waited gets none.
"""

from __future__ import annotations

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
from engine.core.state import PARK_MS, SessionState
from engine.core.watermark import expire, park_deadline
from tests.unit.core.builders import ack, intent, msg, repair, resume
from tests.unit.core.test_properties import worlds

WAITING = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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


def _fold_then_expire(
    events: list[Event],
) -> tuple[SessionState, list[Decision], Counter[str]]:
    """The state and decisions after the log and the watermark's sweep, and per event id how
    many of its copies were answered "wait" (parked or deferred) when folded. A copy re-sent
    after the de-duplication window (`RECENT_EVENT_IDS`) is folded as a new input and waits
    again; one inside it is only re-answered (a parked resume's copy: DEFERRED again)."""
    state: SessionState | None = None
    decisions: list[Decision] = []
    waited: Counter[str] = Counter()
    for position, event in enumerate(events):
        duplicate = state is not None and event.event_id in state.recent_event_ids
        result = fold(state, event, position)
        answer = next(d for d in result.decisions if d.decision_id == event.event_id)
        waited[event.event_id] += not duplicate and answer.reason in WAITS
        state, decisions = result.state, [*decisions, *result.decisions]
    assert state is not None
    end = max(e.event_time_ms for e in events) + PARK_MS
    state, expired = expire(state, end)
    return state, [*decisions, *expired], waited


@WAITING
@given(waiting_worlds())
def test_every_input_has_one_final_answer_once_event_time_passes_the_bound(
    events: list[Event],
) -> None:
    state, decisions, waited = _fold_then_expire(events)
    finals = Counter(d.in_reply_to for d in decisions if d.decision_id.endswith("/final"))
    for event_id in {e.event_id for e in events}:
        assert min(waited[event_id], 1) <= finals[event_id] <= waited[event_id], event_id
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
    the de-duplication window, and its copy is DEFERRED again and parked beside it. When the
    watermark answers the acks as they stand, `a-2` (a commit of `i2` with no count) turns the
    session AMBIGUOUS, progress reaches the checkpoint, and `drain` answers `r-0` once for both
    copies: a runner waiting for `r-0` sees exactly one final answer, and nothing is left."""
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
    state, decisions, waited = _fold_then_expire(events)
    first = [d for d in decisions if d.decision_id == "r-0"]
    assert [(d.verdict, d.final) for d in first] == [(Verdict.DEFERRED, False)] * 2
    assert waited["r-0"] == 2
    finals = [d for d in decisions if d.decision_id == "r-0/final"]
    assert [(d.verdict, d.reason, d.final) for d in finals] == [
        (Verdict.WITHHELD, Reason.SESSION_AMBIGUOUS, True)
    ]
    assert (state.parked_acks, state.parked_intents, state.parked_resumes) == ([], [], [])
