"""Repair is the only exit from ambiguity, and each resolution leads where it says."""

from __future__ import annotations

import pytest

from engine.core.events import AckOutcome, Event, Reason, RepairResolution, Verdict
from engine.core.fold import replay
from tests.unit.core.builders import ack, call, intent, msg, out, record, repair, resume

U, C, OUT, FOREIGN = msg("u"), call("c1"), out("c1"), msg("foreign")
AMBIGUOUS: list[Event] = [
    intent("e1", [OUT], [U, C]),
    ack("e2", AckOutcome.UNKNOWN),
    resume("e3", record([OUT], [U, C]), [U, C, FOREIGN]),
]


def test_nothing_but_a_repair_clears_ambiguity() -> None:
    again = resume("e4", record([OUT], [U, C]), [U, C], t=300_000)  # tail now looks unchanged
    decisions = replay([*AMBIGUOUS, again])
    assert (decisions[2].verdict, decisions[2].reason) == (Verdict.WITHHELD, Reason.AMBIGUOUS)
    assert decisions[3].verdict is Verdict.WITHHELD
    assert decisions[3].reason is Reason.SESSION_AMBIGUOUS


@pytest.mark.parametrize(
    ("resolution", "verdict", "reason"),
    [
        (RepairResolution.ACCEPT_COMMITTED, Verdict.CONTINUE, None),
        (RepairResolution.ACCEPT_ABSENT, Verdict.APPEND_ONCE, Reason.ACCEPTED_ABSENT),
        (RepairResolution.ABANDON, Verdict.WITHHELD, Reason.ABANDONED),
    ],
)
def test_each_resolution_decides_the_old_checkpoint(
    resolution: RepairResolution, verdict: Verdict, reason: Reason | None
) -> None:
    after = resume("e5", record([OUT], [U, C]), [U, C, FOREIGN], t=300_000)
    decisions = replay([*AMBIGUOUS, repair("e4", resolution), after])
    fixed, final = decisions[3], decisions[4]
    assert (fixed.verdict, fixed.reason) == (Verdict.RECORDED, Reason.REPAIRED)
    assert any(resolution.value in entry.detail for entry in fixed.trail)
    assert final.verdict is verdict
    if reason is not None:
        assert final.reason is reason


def test_after_abandon_a_new_checkpoint_continues() -> None:
    fresh = resume("e5", None, [U, C, FOREIGN], checkpoint="c2", t=300_000)
    decisions = replay([*AMBIGUOUS, repair("e4", RepairResolution.ABANDON), fresh])
    assert decisions[-1].verdict is Verdict.CONTINUE


def test_repair_of_a_clear_session_changes_nothing() -> None:
    decisions = replay(
        [
            intent("e1", [OUT], [U, C]),
            ack("e2", AckOutcome.COMMITTED),
            repair("e3", RepairResolution.ABANDON),
        ]
    )
    assert decisions[-1].reason is Reason.NOTHING_TO_REPAIR
