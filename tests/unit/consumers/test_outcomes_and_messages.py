"""Pure parts of the client: decisions to typed outcomes, events built with the engine's digest."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from consumers.errors import ProtocolError
from consumers.messages import ack_event, intent_event, resume_event, tail_limit
from consumers.outcomes import (
    AppendOnce,
    ContinueWithoutReplay,
    Withheld,
    answers,
    outcome_from_decision,
)
from engine.core.digest import item_digest
from engine.core.events import (
    AckOutcome,
    AckSource,
    Binding,
    Decision,
    Fence,
    ItemFacts,
    PendingRecord,
    Reason,
    Verdict,
)
from engine.wire.topics import TopicNames
from engine.wire.values import from_record, to_json

BINDING = Binding(backend_id="sqlite", namespace="t")
USER = {"role": "user", "content": "charge 7"}
CALL = {
    "type": "function_call",
    "call_id": "charge-1",
    "name": "charge",
    "arguments": '{"amount":7}',
    "id": "charge-1",
}
OUT = {"type": "function_call_output", "call_id": "charge-1", "output": "receipt-7"}


def decision(verdict: Verdict, reason: Reason, **kw: object) -> Decision:
    fields: dict[str, object] = {
        "decision_id": "r1",
        "session_id": "s1",
        "in_reply_to": "r1",
        "verdict": verdict,
        "reason": reason,
        "event_time_ms": 1,
    }
    fields.update(kw)
    return from_record(Decision, fields)


def test_continue_becomes_continue_without_replay() -> None:
    out = outcome_from_decision(decision(Verdict.CONTINUE, Reason.COMMITTED, fence_token=4))
    assert isinstance(out, ContinueWithoutReplay)
    assert (out.fence_token, out.reason) == (4, Reason.COMMITTED)


@pytest.mark.parametrize(
    ("fence", "enforced"), [(Fence.STORE_ENFORCED, True), (Fence.ADVISORY, False)]
)
def test_append_once_carries_token_and_whether_the_store_enforces_it(
    fence: Fence, enforced: bool
) -> None:
    out = outcome_from_decision(
        decision(Verdict.APPEND_ONCE, Reason.UNCHANGED, fence_token=9, fence=fence)
    )
    assert isinstance(out, AppendOnce)
    assert (out.fence_token, out.store_enforced) == (9, enforced)


def test_withheld_carries_reason_holder_and_operator_action() -> None:
    out = outcome_from_decision(
        decision(Verdict.WITHHELD, Reason.HELD_BY_OTHER, holder="copy-a", operator_action="wait")
    )
    assert isinstance(out, Withheld)
    assert (out.reason, out.holder, out.operator_action) == (
        Reason.HELD_BY_OTHER,
        "copy-a",
        "wait",
    )


@pytest.mark.parametrize(
    "bad",
    [
        decision(Verdict.DEFERRED, Reason.AWAITING_INTENT, final=False),
        decision(Verdict.RECORDED, Reason.ACCEPTED),
        decision(Verdict.REJECTED, Reason.STALE_FENCE),
        decision(Verdict.APPEND_ONCE, Reason.UNCHANGED),  # a grant without a token
    ],
)
def test_anything_else_is_a_protocol_error_never_a_verdict(bad: Decision) -> None:
    with pytest.raises(ProtocolError):
        outcome_from_decision(bad)


def test_only_the_final_answer_to_the_request_counts() -> None:
    deferred = decision(Verdict.DEFERRED, Reason.AWAITING_INTENT, final=False)
    final = decision(Verdict.CONTINUE, Reason.COMMITTED, decision_id="r1/final")
    other = decision(Verdict.CONTINUE, Reason.COMMITTED, in_reply_to="r2", decision_id="r2")
    assert not answers(deferred, "r1")
    assert answers(final, "r1")
    assert not answers(other, "r1")


def test_intent_uses_the_engine_digest_and_keeps_no_content() -> None:
    intent = intent_event(
        event_id="e1",
        session_id="s1",
        at_ms=5,
        intent_id="i1",
        runner_id="r",
        binding=BINDING,
        items=[OUT],
        before_tail=[USER, CALL],
        sequence=2,
    )
    # the reference's test vectors (agents-sdk-pending-write.md §2)
    assert intent.before == [
        "1db77228dec527b53e3e0db7aa3c0e0fd35d0e1f2cb255bd874aebdf72d6ce4d",
        "05e38837aa51706285c9c30e0395af425f4929b502a2842fbe8609592ab283de",
    ]
    assert intent.items == [
        ItemFacts(
            digest="a7cf1cf5ec2b7224aa3408c5781d31b04db1711e5fac3775ab393ed53d9747cf",
            item_type="function_call_output",
            call_id="charge-1",
        )
    ]
    assert "receipt-7" not in to_json(intent)


def test_ignore_ids_binding_changes_the_digests() -> None:
    binding = replace(BINDING, ignore_ids=True)
    intent = intent_event(
        event_id="e1",
        session_id="s1",
        at_ms=5,
        intent_id="i1",
        runner_id="r",
        binding=binding,
        items=[CALL],
        before_tail=None,
        sequence=0,
    )
    assert intent.before is None
    assert intent.items[0].digest == item_digest(CALL, ignore_ids=True)
    assert intent.items[0].digest != item_digest(CALL, ignore_ids=False)


def test_ack_and_resume_events() -> None:
    ack = ack_event(
        event_id="a1",
        session_id="s1",
        at_ms=1,
        intent_id="i1",
        runner_id="r",
        outcome=AckOutcome.UNKNOWN,
        fence_token=3,
    )
    assert (ack.source, ack.outcome, ack.fence_token, ack.observed_tail) == (
        AckSource.RUNNER,
        AckOutcome.UNKNOWN,
        3,
        None,
    )
    resume = resume_event(
        request_id="q1",
        session_id="s1",
        at_ms=1,
        runner_id="r",
        checkpoint_id="c1",
        binding=BINDING,
        pending=None,
        observed_tail=[USER],
        checkpoint_sequence=4,
    )
    assert resume.event_id == "q1"
    assert resume.observed_tail == [item_digest(USER, ignore_ids=False)]


def test_tail_limit_rereads_like_the_sdk() -> None:
    facts = [ItemFacts(digest="0" * 64, item_type="message")] * 2
    assert tail_limit(None) == 0
    assert tail_limit(PendingRecord(intent_id="i", items=facts)) == 3
    assert tail_limit(PendingRecord(intent_id="i", items=facts, before=["1" * 64] * 3)) == 5


def test_every_topic_sits_behind_the_one_prefix() -> None:
    names = TopicNames(prefix="x-")
    assert names.inputs == ("x-intents", "x-acks", "x-resumes")
    assert (names.decisions, names.changelog, names.dead_letters) == (
        "x-decisions",
        "x-changelog",
        "x-dead-letters",
    )
