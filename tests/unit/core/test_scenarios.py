"""Scenario table mirroring the SDK's own conformance scenarios (reference §6, §9)."""

from __future__ import annotations

import pytest

from engine.core.classify import classify
from engine.core.events import (
    AckOutcome,
    Classification,
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

U, C, O = msg("charge 7"), call("charge-1"), out("charge-1")
BEFORE = [U, C]
BATCH = [O]


def _final(events):
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
def test_ordinary_pending_write(name, tail, outcome, verdict, reason):
    decision = _final(
        [
            intent("e1", BATCH, BEFORE),
            ack("e2", outcome),
            resume("e3", record(BATCH, BEFORE), tail),
        ]
    )
    assert (verdict, reason) == (decision.verdict, decision.reason), name


def test_partial_commit_of_two_items_fails_closed():
    batch = [out("a"), out("b")]
    decision = _final(
        [intent("e1", batch, BEFORE), resume("e2", record(batch, BEFORE), [U, C, out("a")])]
    )
    assert Verdict.WITHHELD == decision.verdict
    assert Classification.PARTIAL == decision.classification


def test_other_session_binding_is_withheld():
    from engine.core.events import Binding

    other = Binding(backend_id="mem", namespace="elsewhere")
    decision = _final(
        [intent("e1", BATCH, BEFORE), resume("e2", record(BATCH, BEFORE), BEFORE, binding=other)]
    )
    assert (Verdict.WITHHELD, Reason.BINDING_MISMATCH) == (decision.verdict, decision.reason)


def test_repeated_content_makes_both_rules_true():
    s = msg("S")
    decision = _final([intent("e1", [s], [s]), resume("e2", record([s], [s]), [s, s])])
    assert (Verdict.WITHHELD, Classification.AMBIGUOUS_BOTH) == (
        decision.verdict,
        decision.classification,
    )


def test_acknowledged_append_accepts_only_committed():
    ok = _final(
        [
            intent("e1", BATCH, BEFORE),
            resume("e2", record(BATCH, BEFORE, acknowledged=True), [*BEFORE, *BATCH]),
        ]
    )
    assert Verdict.CONTINUE == ok.verdict
    bad = _final(
        [
            intent("e1", BATCH, BEFORE),
            resume("e2", record(BATCH, BEFORE, acknowledged=True), BEFORE),
        ]
    )
    assert Verdict.WITHHELD == bad.verdict


def test_append_not_started_appends_once():
    decision = _final([intent("e1", BATCH, None), resume("e2", record(BATCH, None), BEFORE)])
    assert (Verdict.APPEND_ONCE, Reason.APPEND_NOT_STARTED) == (decision.verdict, decision.reason)


def test_conversations_chunk_rule_matches_sdk():
    batch = d([msg(f"m{i}") for i in range(23)])
    before = d([msg("h")])
    chunk = 20
    assert Classification.UNCHANGED == classify(
        observed=before, before=before, batch=batch, chunk_size=chunk
    )
    assert Classification.PARTIAL == classify(
        observed=before + batch[:20], before=before, batch=batch, chunk_size=chunk
    )
    assert Classification.COMMITTED == classify(
        observed=before + batch, before=before, batch=batch, chunk_size=chunk
    )
    one = d([msg("h")])
    assert Classification.UNCHANGED == classify(observed=one, before=one, batch=one)
    assert Classification.AMBIGUOUS_BOTH == classify(observed=one + one, before=one, batch=one)


# --- held variant: park / approve / reject / re-park / discard ------------------------------


def _held(items, eid="h1", intent_id="i1", seq=1):
    return intent(eid, items, None, kind=IntentKind.HELD, intent_id=intent_id, seq=seq)


def test_held_park_then_resume_rides_then_release_settles():
    decisions = replay(
        [
            _held([C]),
            resume("r1", record([C], None, held=True), [U], runner="r1"),
            intent("rel", [C, O], [U], kind=IntentKind.RELEASE, runner="r1", fence=1, seq=2),
            ack("a", AckOutcome.COMMITTED, runner="r1", fence=1, t=100_100),
        ]
    )
    assert [Verdict.RECORDED, Verdict.CONTINUE, Verdict.RECORDED, Verdict.RECORDED] == [
        x.verdict for x in decisions
    ]
    assert Reason.HELD_RIDES == decisions[1].reason


def test_held_reject_settles_call_with_rejection_output():
    rejected = {"type": "function_call_output", "call_id": "charge-1", "output": "rejected"}
    decisions = replay(
        [_held([C]), intent("rel", [C, rejected], [U], kind=IntentKind.RELEASE, seq=2)]
    )
    assert Reason.ACCEPTED == decisions[-1].reason


def test_held_re_park_takes_the_superset():
    c2 = call("charge-2")
    decisions = replay([_held([C]), _held([C, c2], eid="h2")])
    assert Reason.ACCEPTED == decisions[-1].reason
    conflict = replay([_held([C]), _held([c2], eid="h2")])
    assert Reason.INTENT_CONFLICT == conflict[-1].reason


def test_held_discard_without_tools_is_quiet():
    decisions = replay([_held([C]), intent("x", [C], None, kind=IntentKind.DISCARD)])
    assert (Reason.ACCEPTED, False) == (decisions[-1].reason, decisions[-1].alert)


def test_settle_must_carry_the_held_batch_first():
    decisions = replay([_held([C]), intent("rel", [O, C], [U], kind=IntentKind.RELEASE, seq=2)])
    assert (Verdict.REJECTED, Reason.SETTLE_ORDER) == (decisions[-1].verdict, decisions[-1].reason)


def test_settle_leaving_an_output_without_its_call_is_rejected():
    decisions = replay(
        [_held([C]), intent("rel", [C, out("zzz")], [U], kind=IntentKind.RELEASE, seq=2)]
    )
    assert Reason.ORPHAN_OUTPUT == decisions[-1].reason


def test_held_batch_in_session_before_release_is_a_gate_violation():
    decisions = replay([_held([C]), ack("a", AckOutcome.COMMITTED)])
    assert (Reason.GATE_VIOLATION, True) == (decisions[-1].reason, decisions[-1].alert)
    seen = replay([_held([C]), resume("r", record([C], None, held=True), [U, C], runner="r1")])
    assert (Verdict.WITHHELD, Reason.GATE_VIOLATION) == (seen[-1].verdict, seen[-1].reason)
