"""Lifecycle property with late copies: a copy of an input re-sent out of the de-duplication
window changes nothing a runner or the Session would see.

The programs of `test_lifecycle.py` plus `LateCopy` ops, each an exact copy of an input older
than the window. Oracle: the same program without its copies (`World` allocates ids and time
alike, so every input has the same event id in both runs). Every decision of the run without
copies is given, with the same verdict, runner action and alert, in the run with them; a copy
and anything it makes wait is answered without a grant (but the granting request's own) and
without an alert; and the Session's content is right (`check_store`). Counted over generated
logs before and after the fix by `late_copy_problems` (SPEC.md §6 "Late copies").

`make test` runs LATE_COPY_EXAMPLES (default 2,000, derandomized); LIFECYCLE_SOAK=1 randomizes.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.events import AckEvent, AckOutcome, AckSource, Decision, IntentEvent, Reason
from tests.unit.core.lifecycle_model import (
    Fault,
    Hold,
    Input,
    LateCopy,
    Op,
    Restore,
    Settle,
    World,
    Write,
)
from tests.unit.core.test_lifecycle import check_store, ops

EXAMPLES = int(os.environ.get("LATE_COPY_EXAMPLES", "2000"))
LATE_COPIES = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("LIFECYCLE_SOAK") != "1",
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
with_copies: st.SearchStrategy[Op] = st.one_of(ops, st.builds(LateCopy, st.integers(0, 40)))
programs = st.tuples(st.lists(with_copies, min_size=1, max_size=14), st.booleans())

Answer = tuple[str, str, bool]


def _answers(decisions: list[Decision]) -> dict[str, Answer]:
    return {d.decision_id: (d.verdict.value, d.runner_action.value, d.alert) for d in decisions}


def _store_failure_after_retry(world: World, copy: Input) -> bool:
    """A known limit (SPEC.md §6 "Late copies"): the store's NOT_WRITTEN of an attempt that was
    retried in place, copied after the retry; the state keeps no attempt time to tell them apart.
    """
    event = copy.event
    if not (
        isinstance(event, AckEvent)
        and event.source is AckSource.STORE
        and event.outcome is AckOutcome.NOT_WRITTEN
    ):
        return False
    return any(
        isinstance(i.event, IntentEvent)
        and i.event.intent_id == event.intent_id
        and i.event.event_time_ms > event.event_time_ms
        and not i.copy
        for i in world.log
    )


def late_copy_problems(program: list[Op], store_acks: bool) -> list[str]:
    """What the late copies in `program` changed (empty: nothing), limits left out."""
    world = World(store_acks=store_acks)
    world.run(program)
    copies = [i for i in world.log if i.copy]
    if not copies or any(_store_failure_after_retry(world, c) for c in copies):
        return []
    base = World(store_acks=store_acks)
    base.run([op for op in program if not isinstance(op, LateCopy)])
    problems = [f"store: {p}" for p in check_store(world)]
    before, after = _answers(base.decisions), _answers(world.decisions)
    copied = {c.event.event_id for c in copies}
    for decision_id, answer in before.items():
        if after.get(decision_id) != answer:
            problems.append(f"{decision_id}: {answer} -> {after.get(decision_id)}")
    for decision_id in after.keys() - before.keys():
        _, action, alert = after[decision_id]
        if decision_id.removesuffix("/final") not in copied or alert or action != "NONE":
            problems.append(f"new answer {decision_id}: {after[decision_id]}")
    for d in world.copy_answers:
        if d.alert or (d.grants and d.reason is not Reason.REGRANT_DUPLICATE_REQUEST):
            problems.append(f"copy {d.decision_id}: {d.verdict} {d.reason} alert={d.alert}")
    return problems


@LATE_COPIES
@given(programs)
def test_late_copies_change_nothing_a_runner_or_the_session_sees(
    program: tuple[list[Op], bool],
) -> None:
    ops_, store_acks = program
    assert late_copy_problems(ops_, store_acks) == []


# Examples the property found on the core before the fix, pinned.


def test_pinned_a_runner_failure_copy_after_a_retry_in_place() -> None:
    """The copy (the runner's NOT_WRITTEN `a10` of the retried attempt) was RECORDED AMBIGUOUS
    with an alert, and the session was withheld until a repair."""
    program: list[Op] = [Write(Fault.OK), Write(Fault.OK), Write(Fault.RETRY_IN_PLACE)]
    assert late_copy_problems([*program, LateCopy(5)], store_acks=False) == []


@pytest.mark.parametrize("drop", [False, True])
def test_pinned_a_held_copy_after_its_settle(drop: bool) -> None:
    """The copy of the HELD intent held the settled (or dropped) batch again: the holder's next
    write was REJECTED SLOT_OCCUPIED and a restore withheld HELD_NOT_SETTLED with an alert."""
    program: list[Op] = [Hold(), Settle(drop), LateCopy(0), Write(Fault.OK), Restore(1, Fault.OK)]
    assert late_copy_problems(program, store_acks=False) == []
