"""A store COMMITTED ack's observed tail is evidence: a tail that no longer ends with the batch
means the Session's history changed after the append (README "Evidence and claims")."""

from __future__ import annotations

from msgspec.structs import replace

from engine.core.events import (
    AckEvent,
    AckOutcome,
    AckSource,
    Binding,
    Decision,
    Event,
    Reason,
    RepairResolution,
    RunnerAction,
    Verdict,
)
from engine.core.fold import fold
from engine.core.state import Health
from tests.unit.core.builders import (
    BINDING,
    ack,
    d,
    fold_all,
    intent,
    msg,
    record,
    repair,
    resume,
)

BEFORE = [msg("hello")]
BATCH = [msg("a"), msg("b")]
REWRITTEN = [msg("a"), msg("b, rewritten by someone else")]
UNSTABLE = Binding(backend_id="conversations", namespace="tests", items_digest_stable=False)


def store_ack(tail: list[dict[str, str]] | None, **kw: object) -> AckEvent:
    base = ack("a1", AckOutcome.COMMITTED, source=AckSource.STORE, runner="", **kw)  # type: ignore[arg-type]
    return replace(base, observed_tail=None if tail is None else d(tail))


def answers(decisions: list[Decision], event_id: str) -> list[Decision]:
    return [x for x in decisions if x.in_reply_to == event_id]


def run(tail: list[dict[str, str]] | None, binding: Binding = UNSTABLE) -> list[Decision]:
    # ``before`` was read back from the store, so it is in the stored form already.
    resumed_tail = [*BEFORE, msg("a, as stored"), msg("b, as stored")]
    if binding.items_digest_stable:
        resumed_tail = [*BEFORE, *BATCH]
    _, decisions = fold_all(
        [
            intent("e1", BATCH, BEFORE, binding=binding),
            store_ack(tail),
            resume("q1", record(BATCH, BEFORE), resumed_tail, binding=binding),
        ]
    )
    return decisions


def test_a_store_tail_without_the_batch_is_history_changed_with_one_alert() -> None:
    decisions = run([*BEFORE, *REWRITTEN])
    (answer,) = answers(decisions, "a1")
    assert (answer.verdict, answer.reason, answer.alert) == (
        Verdict.RECORDED,
        Reason.HISTORY_CHANGED,
        True,
    )
    assert answer.operator_action
    (granted,) = answers(decisions, "q1")
    # Before the store's tail was read, this was CONTINUE COMMITTED_BY_STORE (DO_NOT_REPLAY).
    assert granted.verdict is Verdict.WITHHELD
    assert granted.runner_action is RunnerAction.STOP
    assert [x for x in decisions if x.alert] == [answer]


def test_the_session_stays_ambiguous_with_the_reason_until_a_repair() -> None:
    events: list[Event] = [
        intent("e1", BATCH, BEFORE, binding=UNSTABLE),
        store_ack([msg("other"), *BATCH[:1]]),
    ]
    state, _ = fold_all(events)
    assert (state.health, state.health_reason) == (Health.AMBIGUOUS, Reason.HISTORY_CHANGED)
    blocked, decisions = fold_all(
        [*events, resume("q1", record(BATCH, BEFORE), [*BEFORE, *BATCH], binding=UNSTABLE)]
    )
    assert blocked.health is Health.AMBIGUOUS
    assert answers(decisions, "q1")[0].reason is Reason.SESSION_AMBIGUOUS
    repaired, decisions = fold_all([*events, repair("r1", RepairResolution.ACCEPT_COMMITTED)])
    assert answers(decisions, "r1")[0].verdict is Verdict.RECORDED
    assert repaired.health is Health.CLEAR


def test_a_tail_read_after_the_next_batch_is_not_the_appends_tail() -> None:
    """SPEC.md §6: the tail is as of the append's transaction, so it ends at the batch. A tail
    read when the ack is published, after the runner's next batch, does not: the core cannot
    tell it from a foreign append, which is why a store must not send it."""
    assert answers(run([*BEFORE, *BATCH]), "a1")[0].reason is Reason.ACCEPTED
    assert answers(run([*BEFORE, *BATCH, msg("next")]), "a1")[0].reason is Reason.HISTORY_CHANGED


def test_a_violated_session_stays_violated_on_a_bad_tail() -> None:
    """The health only ever gets worse from an ack: a bad tail does not turn VIOLATED into
    AMBIGUOUS, and the unchanged health raises no second alert."""
    opened = fold(None, intent("e1", BATCH, BEFORE, binding=UNSTABLE), 0).state
    violated = replace(opened, health=Health.VIOLATED, health_reason=Reason.LATE_APPEND)
    result = fold(violated, store_ack([msg("other")]), 1)
    (answer,) = result.decisions
    assert (answer.reason, answer.alert) == (Reason.HISTORY_CHANGED, False)
    assert (result.state.health, result.state.health_reason) == (
        Health.VIOLATED,
        Reason.LATE_APPEND,
    )


def test_a_digest_stable_backend_is_checked_the_same_way() -> None:
    decisions = run([*BATCH, msg("appended after the batch")], binding=BINDING)
    assert answers(decisions, "a1")[0].reason is Reason.HISTORY_CHANGED
    assert answers(decisions, "q1")[0].verdict is Verdict.WITHHELD


def test_a_store_tail_ending_with_the_batch_still_grants_do_not_replay() -> None:
    for tail in ([*BEFORE, *BATCH], BATCH, [msg("x"), *BATCH]):
        decisions = run(tail)
        assert answers(decisions, "a1")[0].reason is Reason.ACCEPTED
        (granted,) = answers(decisions, "q1")
        assert (granted.verdict, granted.reason, granted.runner_action) == (
            Verdict.CONTINUE,
            Reason.COMMITTED_BY_STORE,
            RunnerAction.DO_NOT_REPLAY,
        )


def test_no_tail_is_no_evidence_and_a_short_tail_is() -> None:
    assert answers(run(None), "a1")[0].reason is Reason.ACCEPTED
    assert answers(run(BATCH[1:]), "a1")[0].reason is Reason.HISTORY_CHANGED
    assert answers(run([]), "a1")[0].reason is Reason.HISTORY_CHANGED


def test_a_runner_acks_tail_is_not_judged() -> None:
    """A runner rereads the Session in the stored form: on a rewriting backend its tail never
    ends with the appended digests, so it says nothing about foreign writes."""
    runner_ack = replace(ack("a1", AckOutcome.COMMITTED), observed_tail=d(REWRITTEN))
    _, decisions = fold_all([intent("e1", BATCH, BEFORE, binding=UNSTABLE), runner_ack])
    assert answers(decisions, "a1")[0].reason is Reason.ACCEPTED


def test_an_already_ambiguous_session_is_not_alerted_twice() -> None:
    second = replace(store_ack([msg("zzz")]), event_id="a2", event_time_ms=1_200)
    _, decisions = fold_all(
        [intent("e1", BATCH, BEFORE, binding=UNSTABLE), store_ack([msg("yyy")]), second]
    )
    assert [x.reason for x in decisions[1:]] == [Reason.HISTORY_CHANGED] * 2
    assert [x.alert for x in decisions[1:]] == [True, False]


def test_contradicting_evidence_never_clears_a_violation() -> None:
    """A partial commit, or COMMITTED and NOT_WRITTEN for one batch, makes a session AMBIGUOUS;
    on a VIOLATED session (a duplicate already happened) it keeps VIOLATED and its reason, so
    the operator's repair still starts from the duplicate, and no second alert is raised."""
    opened = fold(None, intent("e1", BATCH, BEFORE, binding=UNSTABLE), 0).state
    violated = replace(opened, health=Health.VIOLATED, health_reason=Reason.LATE_APPEND)
    runner = AckSource.RUNNER
    committed = ack("a1", AckOutcome.COMMITTED, source=runner)
    not_written = ack("a2", AckOutcome.NOT_WRITTEN, source=runner)
    histories = {
        "partial": [ack("a3", AckOutcome.COMMITTED, source=runner, count=1)],
        "committed, then not written": [committed, not_written],
    }
    for name, acks in histories.items():
        state = violated
        for n, event in enumerate(acks, start=1):
            result = fold(state, event, n)
            assert not any(x.alert for x in result.decisions), name
            state = result.state
        assert (state.health, state.health_reason) == (Health.VIOLATED, Reason.LATE_APPEND), name
        clear = opened
        for n, event in enumerate(acks, start=1):
            clear = fold(clear, event, n).state
        assert clear.health is Health.AMBIGUOUS, name  # the same evidence on a clear session
