"""Scenario table mirroring the openai-agents SDK 0.24.0 pending-write conformance scenarios."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.classify import classify
from engine.core.events import (
    AckOutcome,
    Classification,
    Decision,
    Event,
    IntentEvent,
    IntentKind,
    Reason,
    Verdict,
)
from engine.core.fold import replay
from tests.unit.core.builders import (
    ack,
    call,
    d,
    intent,
    msg,
    out,
    record,
    resume,
)

U, C, OUTPUT = msg("charge 7"), call("charge-1"), out("charge-1")
BEFORE = [U, C]
BATCH = [OUTPUT]


def _final(events: list[Event]) -> Decision:
    return replay(events)[-1]


SCENARIOS = [
    # name, tail the runner rereads, runner ack, expected verdict, expected reason
    ("atomic failure", BEFORE, AckOutcome.UNKNOWN, Verdict.APPEND_ONCE, Reason.UNCHANGED),
    (
        "lost acknowledgement",
        [*BEFORE, *BATCH],
        AckOutcome.UNKNOWN,
        Verdict.CONTINUE,
        Reason.COMMITTED,
    ),
    (
        "changed history",
        [*BEFORE, msg("extra")],
        AckOutcome.UNKNOWN,
        Verdict.WITHHELD,
        Reason.AMBIGUOUS,
    ),
    (
        "other writer extended",
        [*BEFORE, *BATCH, msg("x")],
        AckOutcome.UNKNOWN,
        Verdict.WITHHELD,
        Reason.AMBIGUOUS,
    ),
]


@pytest.mark.parametrize(("name", "tail", "outcome", "verdict", "reason"), SCENARIOS)
def test_ordinary_pending_write(
    name: str,
    tail: list[dict[str, Any]],
    outcome: AckOutcome,
    verdict: Verdict,
    reason: Reason,
) -> None:
    decision = _final(
        [
            intent("e1", BATCH, BEFORE),
            ack("e2", outcome),
            resume("e3", record(BATCH, BEFORE), tail),
        ]
    )
    assert (verdict, reason) == (decision.verdict, decision.reason), name


def test_partial_commit_of_two_items_fails_closed() -> None:
    batch = [out("a"), out("b")]
    decision = _final(
        [intent("e1", batch, BEFORE), resume("e2", record(batch, BEFORE), [U, C, out("a")])]
    )
    assert decision.verdict == Verdict.WITHHELD
    assert decision.classification == Classification.PARTIAL


def test_other_session_binding_is_withheld() -> None:
    from engine.core.events import Binding

    other = Binding(backend_id="mem", namespace="elsewhere")
    decision = _final(
        [intent("e1", BATCH, BEFORE), resume("e2", record(BATCH, BEFORE), BEFORE, binding=other)]
    )
    assert (decision.verdict, decision.reason) == (Verdict.WITHHELD, Reason.BINDING_MISMATCH)


def test_repeated_content_makes_both_rules_true() -> None:
    s = msg("S")
    decision = _final([intent("e1", [s], [s]), resume("e2", record([s], [s]), [s, s])])
    assert (
        decision.verdict,
        decision.classification,
    ) == (Verdict.WITHHELD, Classification.AMBIGUOUS_BOTH)


def test_acknowledged_append_accepts_only_committed() -> None:
    ok = _final(
        [
            intent("e1", BATCH, BEFORE),
            resume("e2", record(BATCH, BEFORE, acknowledged=True), [*BEFORE, *BATCH]),
        ]
    )
    assert ok.verdict == Verdict.CONTINUE
    bad = _final(
        [
            intent("e1", BATCH, BEFORE),
            resume("e2", record(BATCH, BEFORE, acknowledged=True), BEFORE),
        ]
    )
    assert bad.verdict == Verdict.WITHHELD


def test_append_not_started_appends_once() -> None:
    decision = _final([intent("e1", BATCH, None), resume("e2", record(BATCH, None), BEFORE)])
    assert (decision.verdict, decision.reason) == (Verdict.APPEND_ONCE, Reason.APPEND_NOT_STARTED)


def test_conversations_chunk_rule_matches_sdk() -> None:
    batch = d([msg(f"m{i}") for i in range(23)])
    before = d([msg("h")])
    chunk = 20
    assert (
        classify(observed=before, before=before, batch=batch, chunk_size=chunk)
        == Classification.UNCHANGED
    )
    assert (
        classify(observed=before + batch[:20], before=before, batch=batch, chunk_size=chunk)
        == Classification.PARTIAL
    )
    assert (
        classify(observed=before + batch, before=before, batch=batch, chunk_size=chunk)
        == Classification.COMMITTED
    )
    one = d([msg("h")])
    assert classify(observed=one, before=one, batch=one) == Classification.UNCHANGED
    assert classify(observed=one + one, before=one, batch=one) == Classification.AMBIGUOUS_BOTH


# --- held variant: park / approve / reject / re-park / discard ------------------------------


def _held(
    items: list[dict[str, Any]], eid: str = "h1", intent_id: str = "i1", seq: int = 1
) -> IntentEvent:
    return intent(eid, items, None, kind=IntentKind.HELD, intent_id=intent_id, seq=seq)


def test_held_park_then_resume_rides_then_release_settles() -> None:
    decisions = replay(
        [
            _held([C]),
            resume("r1", record([C], None, held=True), [U], runner="r1"),
            intent("rel", [C, OUTPUT], [U], kind=IntentKind.RELEASE, runner="r1", fence=1, seq=2),
            ack("a", AckOutcome.COMMITTED, runner="r1", fence=1, t=100_100),
        ]
    )
    assert [x.verdict for x in decisions] == [
        Verdict.RECORDED,
        Verdict.CONTINUE,
        Verdict.RECORDED,
        Verdict.RECORDED,
    ]
    assert decisions[1].reason == Reason.HELD_RIDES


def test_held_reject_settles_call_with_rejection_output() -> None:
    rejected = {"type": "function_call_output", "call_id": "charge-1", "output": "rejected"}
    decisions = replay(
        [_held([C]), intent("rel", [C, rejected], [U], kind=IntentKind.RELEASE, seq=2)]
    )
    assert decisions[-1].reason == Reason.ACCEPTED


def test_held_re_park_takes_the_superset() -> None:
    c2 = call("charge-2")
    decisions = replay([_held([C]), _held([C, c2], eid="h2")])
    assert decisions[-1].reason == Reason.ACCEPTED
    conflict = replay([_held([C]), _held([c2], eid="h2")])
    assert conflict[-1].reason == Reason.INTENT_CONFLICT


def test_held_discard_without_tools_is_quiet() -> None:
    decisions = replay([_held([C]), intent("x", [C], None, kind=IntentKind.DISCARD)])
    assert (decisions[-1].reason, decisions[-1].alert) == (Reason.ACCEPTED, False)


def test_settle_must_carry_the_held_batch_first() -> None:
    decisions = replay(
        [_held([C]), intent("rel", [OUTPUT, C], [U], kind=IntentKind.RELEASE, seq=2)]
    )
    assert (decisions[-1].verdict, decisions[-1].reason) == (Verdict.REJECTED, Reason.SETTLE_ORDER)


def test_settle_leaving_an_output_without_its_call_is_rejected() -> None:
    decisions = replay(
        [_held([C]), intent("rel", [C, out("zzz")], [U], kind=IntentKind.RELEASE, seq=2)]
    )
    assert decisions[-1].reason == Reason.ORPHAN_OUTPUT


def test_held_batch_in_session_before_release_is_a_gate_violation() -> None:
    # A COMMITTED ack for a held batch waits for the RELEASE or DISCARD that says what was
    # written (it may merely be read ahead of it); a DISCARD makes it a gate violation.
    decisions = replay(
        [
            _held([C]),
            ack("a", AckOutcome.COMMITTED),
            intent("x", [C], None, kind=IntentKind.DISCARD),
        ]
    )
    assert decisions[1].reason is Reason.PARKED
    assert (decisions[-1].decision_id, decisions[-1].reason) == ("a/final", Reason.GATE_VIOLATION)
    assert decisions[-1].alert
    seen = replay([_held([C]), resume("r", record([C], None, held=True), [U, C], runner="r1")])
    assert (seen[-1].verdict, seen[-1].reason) == (Verdict.WITHHELD, Reason.GATE_VIOLATION)
