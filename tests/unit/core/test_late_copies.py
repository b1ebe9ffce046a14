"""Audit: a late exact copy of any input, at every lifecycle point, changes nothing.

For every input of each lifecycle prefix below, `late_copies.audit_copy` folds an exact copy
(same event id, content and event time) after the de-duplication window moved past it, and
compares with the same log without the copy: the copy's state, its answer, and the answers of
the session's next legitimate steps (`followups`). SPEC.md §6 "Late copies" says what is
guaranteed. The audit came with commit efd18b4 (4 December 2026), which also fixed the three
cases it found failing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine.core.events import (
    AckOutcome,
    AckSource,
    Event,
    IntentKind,
    Reason,
    RepairResolution,
    Verdict,
)
from engine.core.fold import replay
from engine.core.state import RECENT_EVENT_IDS
from tests.unit.core.builders import ack, call, intent, msg, out, record, repair, resume
from tests.unit.core.late_copies import Finding, audit, fillers

U, A, B, C, OUT, FOREIGN = msg("u"), msg("a"), msg("b"), call("c1"), out("c1"), msg("foreign")
PAD = RECENT_EVENT_IDS + 1
"""Inputs `audit_copy` puts between the prefix and the followups."""

Scenario = Callable[[], tuple[list[Event], list[Event]]]


def _grant_fence(decisions_prefix: list[Event], event_id: str) -> int:
    """The fence token the prefix's grant to `event_id` carries."""
    for decision in replay(decisions_prefix):
        if decision.in_reply_to == event_id and decision.fence_token is not None:
            return decision.fence_token
    raise AssertionError(f"{event_id} was not granted")


def _next_write(seq: int, runner: str = "r1", fence: int | None = None) -> list[Event]:
    """The holder's next write and its commit, then a restore of its last checkpoint."""
    return [
        intent("n1", [B], [U, A], intent_id="i9", runner=runner, fence=fence, seq=seq, t=400_000),
        ack("n2", AckOutcome.COMMITTED, intent_id="i9", runner=runner, fence=fence, t=400_100),
        resume("n3", None, [], runner="r9", checkpoint="c9", seq=seq, t=600_000),
    ]


def acked() -> tuple[list[Event], list[Event]]:
    """A write acknowledged by the store and the runner."""
    prefix: list[Event] = [
        intent("e1", [A], [U], t=1_000),
        ack("s1", AckOutcome.COMMITTED, source=AckSource.STORE, t=1_090),
        ack("a1", AckOutcome.COMMITTED, t=1_100),
    ]
    return prefix, _next_write(2)


def granted() -> tuple[list[Event], list[Event]]:
    """The writer crashed before its append; a restored runner was told to append once."""
    prefix: list[Event] = [
        intent("e1", [A], [U], t=1_000),
        resume("q1", record([A], [U]), [U], runner="r2", t=100_000),
    ]
    fence = _grant_fence(prefix, "q1")
    return prefix, [
        intent("e2", [A], [U], runner="r2", fence=fence, t=100_100),
        ack("a2", AckOutcome.COMMITTED, runner="r2", fence=fence, t=100_200),
        *_next_write(2, "r2", fence),
    ]


def appended_once() -> tuple[list[Event], list[Event]]:
    """After APPEND_ONCE: the grant's re-arm and its commit."""
    prefix: list[Event] = [
        intent("e1", [A], [U], t=1_000),
        ack("a1", AckOutcome.UNKNOWN, t=1_100),
        resume("q1", record([A], [U]), [U], runner="r2", t=100_000),
    ]
    fence = _grant_fence(prefix, "q1")
    prefix += [
        intent("e2", [A], [U], runner="r2", fence=fence, t=100_100),
        ack("s2", AckOutcome.COMMITTED, source=AckSource.STORE, fence=fence, t=100_190),
        ack("a2", AckOutcome.COMMITTED, runner="r2", fence=fence, t=100_200),
    ]
    return prefix, _next_write(2, "r2", fence)


def regranted() -> tuple[list[Event], list[Event]]:
    """Two grants for one write: the first grantee re-armed and died; its checkpoint resumed."""
    prefix: list[Event] = [
        intent("e1", [A], [U], t=1_000),
        resume("q1", record([A], [U]), [U], runner="r2", t=100_000),
    ]
    first = _grant_fence(prefix, "q1")
    prefix += [
        intent("e2", [A], [U], runner="r2", fence=first, t=100_100),
        resume("q2", record([A], [U]), [U], runner="r3", checkpoint="c2", t=200_000),
    ]
    fence = _grant_fence(prefix, "q2")
    return prefix, [
        intent("e3", [A], [U], runner="r3", fence=fence, t=200_100),
        ack("a3", AckOutcome.COMMITTED, runner="r3", fence=fence, t=200_200),
        *_next_write(2, "r3", fence),
    ]


def retried_in_place() -> tuple[list[Event], list[Event]]:
    """A definite failure, then the holder re-armed under the same fence and appended again."""
    prefix: list[Event] = [
        intent("e1", [A], [U], t=1_000),
        ack("s1", AckOutcome.NOT_WRITTEN, source=AckSource.STORE, t=1_090),
        ack("a1", AckOutcome.NOT_WRITTEN, t=1_100),
        intent("e2", [A], [U], t=1_200),
        ack("s2", AckOutcome.COMMITTED, source=AckSource.STORE, t=1_290),
        ack("a2", AckOutcome.COMMITTED, t=1_300),
    ]
    return prefix, _next_write(2)


def failed() -> tuple[list[Event], list[Event]]:
    """A definite failure; the runner stopped and its checkpoint was resumed (append once)."""
    prefix: list[Event] = [
        intent("e1", [A], [U], t=1_000),
        ack("a1", AckOutcome.NOT_WRITTEN, t=1_100),
    ]
    return prefix, [
        resume("f1", record([A], [U]), [U], runner="r2", t=100_000),
        resume("f2", record([A], [U]), [U], runner="r3", checkpoint="c1", t=100_050),
    ]


def _repaired(resolution: RepairResolution) -> tuple[list[Event], list[Event]]:
    prefix: list[Event] = [
        intent("e1", [A, B], [U], t=1_000),
        ack("s1", AckOutcome.COMMITTED, source=AckSource.STORE, count=1, t=1_090),
        ack("a1", AckOutcome.UNKNOWN, t=1_100),
        resume("q1", record([A, B], [U]), [U, A], runner="r2", t=100_000),
        resume("q2", record([A, B], [U]), [U, A], runner="r3", t=100_050),
        repair("x1", resolution, t=200_000),
    ]
    return prefix, [resume("q3", record([A, B], [U]), [U, A], runner="r4", t=300_000)]


def repaired_committed() -> tuple[list[Event], list[Event]]:
    """A partial commit (AMBIGUOUS, alerted), resumes withheld, an operator's ACCEPT_COMMITTED."""
    return _repaired(RepairResolution.ACCEPT_COMMITTED)


def repaired_absent() -> tuple[list[Event], list[Event]]:
    return _repaired(RepairResolution.ACCEPT_ABSENT)


def repaired_abandoned() -> tuple[list[Event], list[Event]]:
    return _repaired(RepairResolution.ABANDON)


def repaired_then_ambiguous_again() -> tuple[list[Event], list[Event]]:
    """ACCEPT_ABSENT, APPEND_ONCE, and the new attempt of the same intent lands partly too."""
    prefix: list[Event] = [
        intent("e1", [A, B], [U], t=1_000),
        ack("s1", AckOutcome.COMMITTED, source=AckSource.STORE, count=1, t=1_090),
        repair("x1", RepairResolution.ACCEPT_ABSENT, t=200_000),
        resume("q1", record([A, B], [U]), [U], runner="r2", t=300_000),
    ]
    fence = _grant_fence(prefix, "q1")
    prefix += [
        intent("e2", [A, B], [U], runner="r2", fence=fence, t=300_100),
        ack("s2", AckOutcome.COMMITTED, source=AckSource.STORE, fence=fence, count=1, t=300_190),
    ]
    return prefix, [resume("q2", record([A, B], [U]), [U, A], runner="r3", t=500_000)]


def released() -> tuple[list[Event], list[Event]]:
    """A held batch released as a settle, committed."""
    prefix: list[Event] = [
        intent("h1", [C], None, kind=IntentKind.HELD, intent_id="h", seq=1, t=1_000),
        intent("h2", [C, OUT], [U], kind=IntentKind.RELEASE, intent_id="h", seq=2, t=1_100),
        ack("h3", AckOutcome.COMMITTED, intent_id="h", t=1_200),
    ]
    return prefix, _next_write(3)


def discarded() -> tuple[list[Event], list[Event]]:
    """A held batch dropped before its tools ran."""
    prefix: list[Event] = [
        intent("h1", [C], None, kind=IntentKind.HELD, intent_id="h", seq=1, t=1_000),
        intent("h2", [C], None, kind=IntentKind.DISCARD, intent_id="h", seq=2, t=1_100),
    ]
    return prefix, _next_write(3)


def held_resumed() -> tuple[list[Event], list[Event]]:
    """A held batch rides a restore (CONTINUE HELD_RIDES); the new holder settles it."""
    prefix: list[Event] = [
        intent("h1", [C], None, kind=IntentKind.HELD, intent_id="h", seq=1, t=1_000),
        resume("q1", record([C], None, intent_id="h", held=True), [U], runner="r2", t=100_000),
    ]
    fence = _grant_fence(prefix, "q1")
    settle = intent(
        "h2", [C, OUT], [U], kind=IntentKind.RELEASE, intent_id="h", runner="r2", fence=fence,
        seq=2, t=100_100,
    )  # fmt: skip
    commit = ack("h3", AckOutcome.COMMITTED, intent_id="h", runner="r2", fence=fence, t=100_200)
    return prefix, [settle, commit, *_next_write(3, "r2", fence)]


def moved_on() -> tuple[list[Event], list[Event]]:
    """Five writes acknowledged: the session moved 10 inputs past the first."""
    prefix: list[Event] = []
    tail = [U]
    for n in range(1, 6):
        item = msg(f"w{n}")
        prefix += [
            intent(f"e{n}", [item], tail[-1:], intent_id=f"i{n}", seq=n, t=1_000 * n),
            ack(f"a{n}", AckOutcome.COMMITTED, intent_id=f"i{n}", t=1_000 * n + 100),
        ]
        tail.append(item)
    return prefix, [
        intent("n1", [B], tail[-1:], intent_id="i9", seq=6, t=400_000),
        resume("n3", None, [], runner="r9", checkpoint="c9", seq=6, t=600_000),
    ]


SCENARIOS: dict[str, Scenario] = {
    "acked": acked,
    "granted": granted,
    "appended once": appended_once,
    "granted twice": regranted,
    "failed": failed,
    "retried in place": retried_in_place,
    "repaired ACCEPT_COMMITTED": repaired_committed,
    "repaired ACCEPT_ABSENT": repaired_absent,
    "repaired ABANDON": repaired_abandoned,
    "repaired, then ambiguous again": repaired_then_ambiguous_again,
    "held, released": released,
    "held, discarded": discarded,
    "held, rides a restore": held_resumed,
    "moved on": moved_on,
}


LIMITS = {
    # The copy of the REGISTER that opened the slot, after its NOT_WRITTEN, is a re-arm to the
    # fold (same items, before, holder and fence; only the event id, forgotten, differs): it
    # clears the failure. Nothing is granted on it that the tail would not grant.
    ("failed", "e1"),
    # The store's NOT_WRITTEN of the failed attempt, after the retry in place committed: the
    # state keeps no attempt time, so it lands on the retry (AMBIGUOUS, alerted, withheld).
    ("retried in place", "s1"),
    # Acks of an intent superseded twice: not told from acks ahead of their intent, they wait
    # (RECORDED PARKED, then RECORDED UNKNOWN_INTENT as final answer); no slot changes.
    ("moved on", "a1"),
    ("moved on", "a2"),
    ("moved on", "a3"),
}
"""What a late copy still changes (SPEC.md §6 "Late copies": the limit). Fail-closed or inert."""


def findings() -> list[Finding]:
    return [f for name, build in SCENARIOS.items() for f in audit(name, *build())]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_late_copy_of_any_input_changes_nothing_beyond_the_known_limits(name: str) -> None:
    found = {
        (f.scenario, f.copied): f.problems for f in audit(name, *SCENARIOS[name]()) if f.problems
    }
    assert set(found) == {limit for limit in LIMITS if limit[0] == name}, found
    for problems in found.values():
        assert "granted again" not in problems


# --- The hazards the audit found, pinned as plain tests (each failed before the fix) -------


def _late(events: list[Event], copy: Event, then: list[Event]) -> dict[str, tuple[object, ...]]:
    """Fold `events`, the window's worth of fillers, `copy`, then `then`; answer per decision
    id (verdict, reason, alert)."""
    pad = fillers(RECENT_EVENT_IDS, t=max(e.event_time_ms for e in events))
    return {
        d.decision_id: (d.verdict, d.reason, d.alert) for d in replay([*events, *pad, copy, *then])
    }


def test_a_held_copy_after_the_release_does_not_hold_the_batch_again() -> None:
    """Before: the copy put the released batch back into the slot as HELD, and the holder's
    next write was refused SLOT_OCCUPIED (the session was stuck until a repair)."""
    prefix, then = released()
    answers = _late(prefix, prefix[0], then)
    assert answers["h1"] == (Verdict.RECORDED, Reason.DUPLICATE, False)
    assert answers["n1"] == (Verdict.RECORDED, Reason.ACCEPTED, False)


def test_a_held_copy_after_the_discard_does_not_hold_the_batch_again() -> None:
    prefix, then = discarded()
    answers = _late(prefix, prefix[0], then)
    assert answers["h1"] == (Verdict.RECORDED, Reason.DUPLICATE, False)
    assert answers["n1"] == (Verdict.RECORDED, Reason.ACCEPTED, False)


@pytest.mark.parametrize("resolution", list(RepairResolution))
def test_a_resume_copy_from_before_a_repair_is_not_granted(resolution: RepairResolution) -> None:
    """Before: the repair cleared the lease and the consumed checkpoint, so a copy of a resume
    the ambiguous session had withheld was granted (to a runner that had stopped), and the
    restored runner's own resume of that checkpoint was then CHECKPOINT_ALREADY_RESUMED."""
    prefix, then = _repaired(resolution)
    answers = _late(prefix, prefix[3], then)
    assert answers["q1"] == (Verdict.WITHHELD, Reason.HELD_BY_OTHER, False)
    assert answers["q3"] == _late(prefix, prefix[-1], then)["q3"]  # as if no copy came
    assert answers["q3"][1] is not Reason.CHECKPOINT_ALREADY_RESUMED


@pytest.mark.parametrize("resolution", list(RepairResolution))
def test_a_copy_of_the_repaired_evidence_does_not_reopen_the_session(
    resolution: RepairResolution,
) -> None:
    """Before: a copy of the partial commit the operator had repaired turned the session
    AMBIGUOUS again (alerted), and every resume was withheld until a second repair."""
    prefix, then = _repaired(resolution)
    answers = _late(prefix, prefix[1], then)
    assert answers["s1"] == (Verdict.RECORDED, Reason.ACCEPTED, False)
    assert answers["q3"][1] is not Reason.SESSION_AMBIGUOUS


def test_a_runner_failure_copy_after_its_retry_in_place_committed_changes_nothing() -> None:
    """Before: the runner's NOT_WRITTEN of the failed attempt, re-sent after the retry in place
    committed, contradicted the retry's COMMITTED: AMBIGUOUS, alerted, next write refused."""
    prefix, then = retried_in_place()
    answers = _late(prefix, prefix[2], then)
    assert answers["a1"] == (Verdict.RECORDED, Reason.ACCEPTED, False)
    assert answers["n1"] == (Verdict.RECORDED, Reason.ACCEPTED, False)


def test_a_repair_copy_does_not_resolve_a_newer_incident_of_the_same_intent() -> None:
    """Before: a copy of the ACCEPT_ABSENT repair, folded after the APPEND_ONCE attempt it led
    to landed partly as well, marked that attempt absent unseen, and the next resume was told
    APPEND_ONCE over a batch half in the Session (a duplicate item)."""
    prefix, then = repaired_then_ambiguous_again()
    answers = _late(prefix, prefix[2], then)
    assert answers["x1"] == (Verdict.REJECTED, Reason.STALE_CHECKPOINT, False)
    assert answers["q2"] == (Verdict.WITHHELD, Reason.SESSION_AMBIGUOUS, False)


def test_a_repair_stamped_after_the_incident_still_repairs() -> None:
    prefix, _ = repaired_then_ambiguous_again()
    later = repair("x2", RepairResolution.ACCEPT_COMMITTED, t=400_000)
    after = resume("q2", record([A, B], [U]), [U, A, B], runner="r3", t=500_000)
    answers = {d.decision_id: (d.verdict, d.reason) for d in replay([*prefix, later, after])}
    assert answers["x2"] == (Verdict.RECORDED, Reason.REPAIRED)
    assert answers["q2"][0] is Verdict.CONTINUE
