"""The resumes topic read a backlog ahead of the intents and acks (README "Interleavings"):
which final answers can differ from time order's, and that the difference stays safe."""

from __future__ import annotations

from engine.core.events import Decision
from engine.core.state import Health
from tests.unit.core.lifecycle_model import (
    Fault,
    Foreign,
    ForeignWrite,
    Hold,
    Input,
    Restore,
    Settle,
    Topic,
    World,
    Write,
)
from tests.unit.core.test_lifecycle import _final_answers, _refold


def _resumes_ahead(log: list[Input]) -> list[Input]:
    return [
        *(i for i in log if i.topic is Topic.RESUMES),
        *(i for i in log if i.topic is not Topic.RESUMES),
    ]


def _differing(world: World) -> tuple[dict[str, tuple[str, str]], list[Decision]]:
    baseline = _final_answers(_refold(world.log))
    ahead = _refold(_resumes_ahead(world.log))  # per-step safety is checked inside
    answers = _final_answers(ahead)
    return {k: answers[k] for k in baseline if answers.get(k) != baseline[k]}, ahead


def test_a_resume_read_ahead_of_a_settle_that_took_the_next_sequence_waits_for_it() -> None:
    """The checkpoint saved after a DISCARD knows its sequence, so the resume waits for it."""
    world = World(store_acks=False)
    world.run([Hold(), Settle(drop=True), Restore(1, Fault.OK), Hold(), Settle(drop=True)])
    differing, _ = _differing(world)
    assert differing == {}


def test_a_resume_read_ahead_of_the_grants_re_arm_can_refuse_it_and_stays_safe() -> None:
    """Time order: the first restore is granted APPEND_ONCE, its re-arm accepted; a foreign pop
    then makes the second restore's tail (F,F): AMBIGUOUS. Resumes first: both resumes are
    judged before the re-arm and the acks, so the session is AMBIGUOUS (alerted) when the
    re-arm arrives, which is refused, and the first attempt's ack counts as a stale fence.
    The resumes' own answers are the same; nothing is granted after the ambiguity."""
    world = World(store_acks=False)
    world.run([Write(Fault.NOT_WRITTEN), Restore(1, Fault.NOT_WRITTEN), ForeignWrite(Foreign.POP)])
    differing, ahead = _differing(world)
    intents = {i.event.event_id for i in world.log if i.topic is Topic.INTENTS}
    acks = {i.event.event_id for i in world.log if i.topic is Topic.ACKS}
    assert set(differing) <= intents | acks
    assert [differing[k] for k in sorted(set(differing) & intents)] == [("REJECTED", "STOP")]
    assert all(answer == ("RECORDED", "NONE") for k, answer in differing.items() if k in acks)
    assert any(d.alert for d in ahead)
    assert world.state is not None
    assert world.state.health is Health.AMBIGUOUS
