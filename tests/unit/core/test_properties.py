"""Hypothesis properties of the fold over generated interleavings of intents, acks, resumes,
repairs and duplicates."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.classify import classify
from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Classification,
    Decision,
    Event,
    Reason,
    RepairEvent,
    RepairResolution,
    ResumeEvent,
    Verdict,
)
from engine.core.fold import fold, replay
from engine.core.state import LEASE_MS, Health, SessionState
from tests.unit.core.builders import ack, d, intent, msg, record, repair, resume

INTERLEAVINGS = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
ORDERS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ALPHABET = [msg(x) for x in "abc"]
items_st = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=3)
AMBIGUOUS = {Classification.AMBIGUOUS_BOTH, Classification.CHANGED, Classification.PARTIAL}


@st.composite
def worlds(draw: st.DrawFn) -> list[Event]:
    """A log: one or two intents, acks, resumes from several runners/checkpoints, repairs,
    duplicates, in an arbitrary interleaving."""
    before = draw(st.lists(st.sampled_from(ALPHABET), max_size=3))
    batch = draw(items_st)
    events: list[Event] = [intent("i-1", batch, before, runner="r1", seq=1, t=1_000)]
    if draw(st.booleans()):
        events.append(intent("i-2", batch[:1], [*before, *batch], intent_id="i2", seq=2, t=2_000))
    for n in range(draw(st.integers(0, 3))):
        events.append(
            ack(
                f"a-{n}",
                draw(st.sampled_from(list(AckOutcome))),
                source=draw(st.sampled_from(list(AckSource))),
                intent_id=draw(st.sampled_from(["i1", "i2"])),
                count=draw(st.one_of(st.none(), st.integers(0, len(batch)))),
                t=1_500 + n,
            )
        )
    tails = [before, [*before, *batch], [*before, *batch[:1]], [*before, msg("z")]]
    for n in range(draw(st.integers(1, 4))):
        rec = draw(
            st.sampled_from(
                [
                    None,
                    record(batch, before),
                    record(batch, None),
                    record(batch[:1], [*before, *batch], intent_id="i2"),
                ]
            )
        )
        events.append(
            resume(
                f"r-{n}",
                rec,
                draw(st.sampled_from(tails)),
                runner=draw(st.sampled_from(["r1", "r2", "r3"])),
                checkpoint=draw(st.sampled_from(["c1", "c2", "c3"])),
                seq=draw(st.integers(0, 2)),
                t=draw(st.integers(0, 4)) * (LEASE_MS // 2) + 3_000 + n,
            )
        )
    if draw(st.booleans()):
        events.append(
            repair("fix", draw(st.sampled_from(list(RepairResolution))), intent_id=None, t=50_000)
        )
    order = draw(st.permutations(events))
    dup_count = draw(st.integers(0, 2))
    dups = [draw(st.sampled_from(order)) for _ in range(dup_count)]
    return [*order, *dups]


def _fold_all(events: list[Event]) -> list[tuple[SessionState | None, Event, list[Decision]]]:
    steps: list[tuple[SessionState | None, Event, list[Decision]]] = []
    state: SessionState | None = None
    for position, event in enumerate(events):
        result = fold(state, event, position)
        steps.append((state, event, list(result.decisions)))
        state = result.state
    return steps


@INTERLEAVINGS
@given(worlds())
def test_never_grants_on_ambiguity(events: list[Event]) -> None:
    for before_state, event, decisions in _fold_all(events):
        for decision in decisions:
            if not decision.grants or decision.in_reply_to != event.event_id:
                continue  # a parked input's final answer is judged on the state after `event`
            assert before_state is None or before_state.health is Health.CLEAR
            assert decision.classification not in AMBIGUOUS
            if isinstance(event, ResumeEvent) and decision.reason in (
                Reason.UNCHANGED,
                Reason.COMMITTED,
            ):
                assert event.pending is not None
                expected = classify(
                    observed=event.observed_tail,
                    before=event.pending.before,
                    batch=[f.digest for f in event.pending.items],
                    append_acknowledged=event.pending.append_acknowledged,
                )
                assert expected == decision.classification


@INTERLEAVINGS
@given(worlds())
def test_never_two_holders(events: list[Event]) -> None:
    last: tuple[str, int, int] | None = None  # holder, fence, grant time
    for _state, event, decisions in _fold_all(events):
        if isinstance(event, RepairEvent):
            last = None if last is None else (last[0], last[1], -LEASE_MS)
        for decision in decisions:
            if not decision.grants or decision.reason is Reason.REGRANT_DUPLICATE_REQUEST:
                continue
            assert decision.holder is not None
            assert decision.fence_token is not None
            if last is not None:
                holder, fence, granted_at = last
                assert decision.fence_token > fence
                if decision.holder != holder:
                    assert decision.event_time_ms >= granted_at + LEASE_MS
            last = (decision.holder, decision.fence_token, decision.event_time_ms)


@INTERLEAVINGS
@given(worlds())
def test_every_event_leaves_exactly_one_answer(events: list[Event]) -> None:
    for _state, event, decisions in _fold_all(events):
        answers = [x for x in decisions if x.decision_id == event.event_id]
        assert len(answers) == 1
        assert all(x.in_reply_to for x in decisions)


@INTERLEAVINGS
@given(worlds(), st.data())
def test_replay_and_snapshot_then_tail(events: list[Event], data: st.DataObject) -> None:
    full = replay(events)
    assert full == replay(events)
    cut = data.draw(st.integers(0, len(events)))
    state: SessionState | None = None
    decisions: list[Decision] = []
    for position, event in enumerate(events[:cut]):
        result = fold(state, event, position)
        state, decisions = result.state, decisions + list(result.decisions)
    if state is not None:
        state = SessionState.from_record(state.to_record())
    for position, event in enumerate(events[cut:], start=cut):
        result = fold(state, event, position)
        state, decisions = result.state, decisions + list(result.decisions)
    assert full == decisions


@st.composite
def evidence_sets(draw: st.DrawFn) -> tuple[list[Event], ResumeEvent]:
    before = draw(st.lists(st.sampled_from(ALPHABET), max_size=3))
    batch = draw(items_st)
    evidence: list[Event] = [intent("i-1", batch, before, runner="r1", t=1_000)]
    for n in range(draw(st.integers(0, 3))):
        evidence.append(
            ack(
                f"a-{n}",
                draw(st.sampled_from(list(AckOutcome))),
                source=draw(st.sampled_from(list(AckSource))),
                count=draw(st.one_of(st.none(), st.integers(0, len(batch)))),
                t=1_100 + n,
            )
        )
    tail = draw(st.sampled_from([before, [*before, *batch], [*before, *batch[:1]], batch]))
    rec = draw(st.sampled_from([record(batch, before), record(batch, None)]))
    return evidence, resume("res", rec, tail, runner="r2", t=10 * LEASE_MS)


def _outcome(decisions: list[Decision]) -> tuple[Any, ...]:
    final = [x for x in decisions if x.in_reply_to == "res" and x.final][-1]
    return (final.verdict, final.reason, final.classification, final.holder, final.fence_token)


def _runner_acks(events: list[Event]) -> list[Event]:
    return [e for e in events if isinstance(e, AckEvent) and e.source is AckSource.RUNNER]


def _runner_acks_in_order(shuffled: list[Event], evidence: list[Event]) -> list[Event]:
    """`shuffled`, with the runner's acks put back in the order it published them: they are one
    producer's records in one partition, which Kafka delivers in order. Only a re-send puts an
    older one after a newer one, and the fold reads a runner's NOT_WRITTEN after its COMMITTED
    of the same attempt, stamped earlier, as such a late copy (`acks._past_evidence`;
    `test_late_copies.py`)."""
    in_order = iter(_runner_acks(evidence))
    runner = set(map(id, _runner_acks(evidence)))
    return [next(in_order) if id(e) in runner else e for e in shuffled]


@ORDERS
@given(evidence_sets(), st.data())
def test_order_independence_once_evidence_is_complete(
    world: tuple[list[Event], ResumeEvent], data: st.DataObject
) -> None:
    evidence, res = world
    reference = _outcome(replay([*evidence, res]))
    shuffled = _runner_acks_in_order(data.draw(st.permutations(evidence)), evidence)
    assert reference == _outcome(replay([*shuffled, res]))
    # The resume first: deferred until its intent, which arrives last of the evidence.
    acks_first = [e for e in shuffled if e.event_id != "i-1"]
    early = replay([res, *acks_first, evidence[0]])
    assert early[0].verdict == Verdict.DEFERRED
    assert reference[:3] == _outcome(early)[:3]


def test_the_digests_in_worlds_are_distinct() -> None:
    assert len(set(d(ALPHABET))) == 3
