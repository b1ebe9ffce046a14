"""One test per known SDK gap (a case where openai-agents 0.24.0 alone duplicates or loses
history): the engine reaches the right verdict or withholds."""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.events import (
    AckOutcome,
    AckSource,
    Binding,
    Decision,
    IntentKind,
    Reason,
    RepairResolution,
    Verdict,
)
from engine.core.fold import replay
from tests.unit.core.builders import (
    BINDING,
    ack,
    call,
    intent,
    msg,
    out,
    record,
    repair,
    resume,
)

UNSTABLE = replace(BINDING, items_digest_stable=False)
U, C, OUTPUT = msg("charge 7"), call("charge-1"), out("charge-1")
BEFORE, BATCH = [U, C], [OUTPUT]


def _verdicts(decisions: list[Decision]) -> list[tuple[Verdict, Reason]]:
    return [(x.verdict, x.reason) for x in decisions]


def test_row1_two_copies_of_one_checkpoint() -> None:
    rec = record(BATCH, BEFORE)
    decisions = replay(
        [
            intent("e1", BATCH, BEFORE),
            resume("a", rec, BEFORE, runner="copy-a", checkpoint="c1"),
            resume("b", rec, BEFORE, runner="copy-b", checkpoint="c1", t=100_001),
        ]
    )
    assert _verdicts(decisions)[1] == (Verdict.APPEND_ONCE, Reason.UNCHANGED)
    second = decisions[2]
    assert (second.verdict, second.reason) == (Verdict.WITHHELD, Reason.HELD_BY_OTHER)
    assert second.holder == "copy-a"


def test_row1_fenced_store_grant_says_store_enforced() -> None:
    fenced = Binding(backend_id="mem", namespace="tests", store_enforces_fence=True)
    decisions = replay(
        [
            intent("e1", BATCH, BEFORE, binding=fenced),
            resume("a", record(BATCH, BEFORE), BEFORE, binding=fenced),
        ]
    )
    assert decisions[-1].fence == "STORE_ENFORCED"


def test_row2_copies_of_a_checkpoint_without_before_one_after_the_other() -> None:
    decisions = replay(
        [
            resume("a", None, [U, C], runner="copy-a", checkpoint="park", seq=-1, t=1_000),
            intent("e1", BATCH, BEFORE, runner="copy-a", fence=1, seq=1, t=2_000),
            ack("k", AckOutcome.COMMITTED, runner="copy-a", fence=1, t=3_000),
            resume(
                "b", None, [U, C, OUTPUT], runner="copy-b", checkpoint="park", seq=-1, t=900_000
            ),
        ]
    )
    assert decisions[0].verdict == Verdict.CONTINUE
    assert _verdicts(decisions)[-1] == (Verdict.WITHHELD, Reason.CHECKPOINT_ALREADY_RESUMED)


def test_row2_a_copy_of_another_id_after_progress_is_stale() -> None:
    decisions = replay(
        [
            resume("a", None, [U, C], runner="copy-a", checkpoint="park", seq=-1, t=1_000),
            intent("e1", BATCH, BEFORE, runner="copy-a", fence=1, seq=1, t=2_000),
            resume("b", None, [U, C], runner="copy-b", checkpoint="park-copy", seq=-1, t=900_000),
        ]
    )
    assert _verdicts(decisions)[-1] == (Verdict.WITHHELD, Reason.STALE_CHECKPOINT)


def test_row3_older_checkpoint_after_lost_ack_is_stale() -> None:
    decisions = replay(
        [
            intent("e1", BATCH, BEFORE, seq=3),
            ack("k", AckOutcome.UNKNOWN),
            resume("old", None, BEFORE, checkpoint="before-failure", seq=2),
        ]
    )
    assert _verdicts(decisions)[-1] == (Verdict.WITHHELD, Reason.STALE_CHECKPOINT)


def test_row4_changed_ids_policy_is_a_binding_mismatch() -> None:
    other = Binding(backend_id="mem", namespace="tests", ignore_ids=True)
    decisions = replay(
        [intent("e1", BATCH, BEFORE), resume("r", record(BATCH, BEFORE), BEFORE, binding=other)]
    )
    assert _verdicts(decisions)[-1] == (Verdict.WITHHELD, Reason.BINDING_MISMATCH)


def test_row5_store_ack_wins_over_digest_drift() -> None:
    # The backend adds a `status` field to what it stores, and its binding says so.
    drifted = [U, C, {**OUTPUT, "status": "completed"}]
    decisions = replay(
        [
            intent("e1", BATCH, BEFORE, binding=UNSTABLE),
            ack("k", AckOutcome.COMMITTED, source=AckSource.STORE, runner=""),
            resume("r", record(BATCH, BEFORE), drifted, binding=UNSTABLE),
        ]
    )
    assert _verdicts(decisions)[-1] == (Verdict.CONTINUE, Reason.COMMITTED_BY_STORE)


def test_row5_drift_on_a_digest_stable_binding_is_a_changed_history() -> None:
    drifted = [U, C, {**OUTPUT, "status": "completed"}]
    decisions = replay(
        [
            intent("e1", BATCH, BEFORE),
            ack("k", AckOutcome.COMMITTED, source=AckSource.STORE, runner=""),
            resume("r", record(BATCH, BEFORE), drifted),
        ]
    )
    assert _verdicts(decisions)[-1] == (Verdict.WITHHELD, Reason.HISTORY_CHANGED)
    assert decisions[-1].alert


def test_row5_without_store_evidence_drift_is_withheld_not_absent() -> None:
    drifted = [{**U, "status": "completed"}, C, OUTPUT]
    decisions = replay([intent("e1", BATCH, BEFORE), resume("r", record(BATCH, BEFORE), drifted)])
    assert decisions[-1].verdict == Verdict.WITHHELD


def test_row6_identical_foreign_copy_after_definite_failure() -> None:
    decisions = replay(
        [
            intent("e1", BATCH, BEFORE),
            ack("k", AckOutcome.NOT_WRITTEN),
            resume("r", record(BATCH, BEFORE), [*BEFORE, *BATCH]),
        ]
    )
    assert _verdicts(decisions)[-1] == (Verdict.WITHHELD, Reason.CONTENT_NOT_AUTHORSHIP)
    assert decisions[-1].alert


def test_row7_tampered_records_are_mismatches() -> None:
    registered = intent("e1", BATCH, BEFORE)
    for tampered in (
        record([out("other")], BEFORE),
        record(BATCH, None),
        record(BATCH, None, held=True),
    ):
        decisions = replay([registered, resume("r", tampered, BEFORE)])
        assert _verdicts(decisions)[-1] == (Verdict.WITHHELD, Reason.RECORD_MISMATCH)


def test_row8_held_discard_after_tools_ran_is_an_alerted_loss() -> None:
    decisions = replay(
        [
            intent("h", [C], None, kind=IntentKind.HELD),
            intent("x", [C, OUTPUT], None, kind=IntentKind.DISCARD, tools_ran=True),
        ]
    )
    assert (decisions[-1].reason, decisions[-1].alert) == (Reason.HELD_LOSS, True)


def test_row8_held_record_dropped_from_checkpoint_is_withheld() -> None:
    decisions = replay(
        [intent("h", [C], None, kind=IntentKind.HELD), resume("r", None, [U], runner="r1")]
    )
    assert _verdicts(decisions)[-1] == (Verdict.WITHHELD, Reason.HELD_NOT_SETTLED)


def test_row9_partial_evidence_is_remembered_until_repair() -> None:
    batch = [out("a"), out("b")]
    rec = record(batch, BEFORE)
    decisions = replay(
        [
            intent("e1", batch, BEFORE),
            resume("r1", rec, [U, C, out("a")], checkpoint="c1"),
            resume("r2", rec, BEFORE, checkpoint="c2", t=900_000),
        ]
    )
    assert decisions[1].reason == Reason.PARTIAL_COMMIT
    assert _verdicts(decisions)[-1] == (Verdict.WITHHELD, Reason.SESSION_AMBIGUOUS)
    repaired = replay(
        [
            intent("e1", batch, BEFORE),
            resume("r1", rec, [U, C, out("a")], checkpoint="c1"),
            repair("fix", RepairResolution.ACCEPT_ABSENT),
            resume("r2", rec, BEFORE, checkpoint="c2", t=900_000),
        ]
    )
    assert repaired[2].reason == Reason.REPAIRED
    assert "ACCEPT_ABSENT" in repaired[2].trail[0].detail
    assert repaired[-1].verdict == Verdict.APPEND_ONCE


def test_row9_partial_store_ack_makes_session_ambiguous() -> None:
    batch = [out("a"), out("b")]
    decisions = replay(
        [
            intent("e1", batch, BEFORE),
            ack("k", AckOutcome.COMMITTED, source=AckSource.STORE, count=1),
            resume("r", record(batch, BEFORE), BEFORE),
        ]
    )
    assert _verdicts(decisions)[-1] == (Verdict.WITHHELD, Reason.SESSION_AMBIGUOUS)


def test_row10_every_append_is_an_intent_final_output_included() -> None:
    final = {"type": "message", "role": "assistant", "content": "done"}
    decisions = replay(
        [
            intent("e1", [final], [U, C, OUTPUT], seq=5),
            ack("k", AckOutcome.UNKNOWN),
            resume("r", record([final], [U, C, OUTPUT]), [U, C, OUTPUT, final], seq=5),
        ]
    )
    assert _verdicts(decisions)[-1] == (Verdict.CONTINUE, Reason.COMMITTED)


def test_row11_call_id_reuse_is_legal() -> None:
    reused = [C, OUTPUT]
    decisions = replay(
        [
            intent("e1", reused, [U, C, OUTPUT]),
            resume("r", record(reused, [U, C, OUTPUT]), [U, C, OUTPUT]),
        ]
    )
    assert _verdicts(decisions)[-1] == (Verdict.APPEND_ONCE, Reason.UNCHANGED)
