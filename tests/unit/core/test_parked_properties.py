"""Property: once event time has moved past the bound, every input has exactly one final answer.

The logs are `test_properties.worlds` (intents, acks, resumes from several runners, repairs,
duplicates, any interleaving) plus inputs that wait for something that never comes: acks of
intents never registered, acks and intents under a fence never granted. At the end of the log
the partition watermark moves `PARK_MS` past the last input (what the runtime does for a
session nobody writes to any more: `watermark.expire`).
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.events import AckOutcome, AckSource, Decision, Event, Reason, Verdict
from engine.core.fold import fold, replay
from engine.core.state import PARK_MS, SessionState
from engine.core.watermark import expire, park_deadline
from tests.unit.core.builders import ack, intent, msg
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
        assert finals[event_id] == waited[event_id], event_id
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
