"""`final` as SPEC.md defines it, against every decision the lifecycle model makes the fold give.

SPEC.md §4 (and the decision schema's doc) defines `final`: "False for a deferred answer that a
later decision replaces." A later decision replaces an answer when it answers the same input
(`in_reply_to`) under `decision_id == in_reply_to + "/final"` (§6). So, read literally: a
decision has `final = false` exactly when such a decision follows it. A producer waiting for
`final = true` then gets the answer that counts, never one that is replaced.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from consumers.outcomes import answers
from engine.core.events import AckOutcome, Decision, Event, Reason, Verdict
from engine.core.fold import fold
from engine.core.state import PARK_MS, SessionState
from engine.core.watermark import expire
from tests.unit.core.builders import ack, fold_all, intent, msg, record, resume
from tests.unit.core.lifecycle_model import Input, Op, Topic, World
from tests.unit.core.test_lifecycle_late_copies import programs

REPO = Path(__file__).resolve().parents[3]
SPEC = (REPO / "schemas" / "SPEC.md").read_text("utf-8")
DEFINITION = "False for a deferred answer that a later decision replaces."

Pair = tuple[Verdict, Reason]
# What the definition gives for first answers: the two answers of an input that waits.
REPLACED_PAIRS = {(Verdict.DEFERRED, Reason.AWAITING_INTENT), (Verdict.RECORDED, Reason.PARKED)}


def test_spec_and_schemas_define_final_as_this_test_reads_it() -> None:
    row = re.search(r"^\| `final` \| boolean \| `true` \| (.+?) \|$", SPEC, flags=re.M)
    assert row is not None
    assert row.group(1) == DEFINITION
    for version in (1, 2):
        schema = json.loads((REPO / "schemas" / f"decision.v{version}.avsc").read_text("utf-8"))
        (field,) = [f for f in schema["fields"] if f["name"] == "final"]
        assert (field["doc"], field["default"]) == (DEFINITION, True)


def replaced(decisions: list[Decision], index: int) -> bool:
    """Whether a later decision replaces ``decisions[index]`` (SPEC.md §4, §6): the next
    decision about the same input, past repeats of this one (a copy answered as the first was),
    is its `/final` answer. A copy folded after the answer is another input under the same id
    (SPEC.md §6 "Late copies"): what follows it replaces its answer, not the first one."""
    decision = decisions[index]
    final_id = decision.in_reply_to + "/final"
    if decision.decision_id == final_id:
        return False
    for later in decisions[index + 1 :]:
        if later.in_reply_to != decision.in_reply_to:
            continue
        repeat = (later.decision_id, later.verdict, later.reason) == (
            decision.decision_id,
            decision.verdict,
            decision.reason,
        )
        if not repeat:
            return later.decision_id == final_id
    return False


def check_final_flags(decisions: list[Decision]) -> dict[Pair, set[bool]]:
    """Assert SPEC's definition on every decision; the `final` values seen per pair."""
    seen: dict[Pair, set[bool]] = defaultdict(set)
    for index, decision in enumerate(decisions):
        is_replaced = replaced(decisions, index)
        assert decision.final is not is_replaced, (
            f"{decision.decision_id} {decision.verdict} {decision.reason} final={decision.final}"
            f" but {'a later decision replaces it' if is_replaced else 'nothing replaces it'}"
        )
        seen[decision.verdict, decision.reason].add(decision.final)
    return seen


def fold_to_the_end(inputs: list[Input]) -> list[Decision]:
    """Fold one interleaving, then move the watermark past every input: all is answered."""
    state: SessionState | None = None
    offsets = dict.fromkeys(Topic, 0)
    decisions: list[Decision] = []
    for item in inputs:
        result = fold(state, item.event, offsets[item.topic])
        offsets[item.topic] += 1
        state, decisions = result.state, [*decisions, *result.decisions]
    if state is not None:
        end = max(i.event.event_time_ms for i in inputs) + PARK_MS
        state, expired = expire(state, end)
        decisions.extend(expired)
    return decisions


def interleavings(log: list[Input]) -> list[list[Input]]:
    def ahead(topic: Topic) -> list[Input]:
        return [*(i for i in log if i.topic is topic), *(i for i in log if i.topic is not topic)]

    return [log, ahead(Topic.INTENTS), ahead(Topic.ACKS), ahead(Topic.RESUMES)]


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs)
def test_final_is_false_exactly_for_an_answer_a_later_decision_replaces(
    program: tuple[list[Op], bool],
) -> None:
    ops, store_acks = program
    world = World(store_acks=store_acks)
    world.run(ops)
    for order in interleavings(world.log):
        seen = check_final_flags(fold_to_the_end(order))
        for pair, flags in seen.items():
            # A pair means one thing: an answer of a waiting input is never the last word.
            assert flags == {True} or (pair in REPLACED_PAIRS and False in flags), (pair, flags)


A, B, C = msg("a"), msg("b"), msg("c")


def _every_wait() -> list[Event]:
    """One session where each kind of input waits once: an ack ahead of its intent, an intent
    under a fence not granted yet, a resume whose checkpoint is ahead of the engine."""
    return [
        ack("k1", AckOutcome.COMMITTED, t=1_100),  # before its intent
        intent("e1", [B], [A], t=1_000),
        resume("q1", record([C], [A, B], intent_id="i2"), [A, B], seq=2, t=100_000),  # ahead
        intent("e3", [C], [A, B], intent_id="i3", fence=5, seq=3, t=100_500, runner="r2"),
        intent("e2", [C], [A, B], intent_id="i2", seq=2, t=99_000),
    ]


def test_every_waiting_input_is_answered_false_then_true() -> None:
    state, decisions = fold_all(_every_wait())
    state, expired = expire(state, 10**9)
    decisions = [*decisions, *expired]
    seen = check_final_flags(decisions)
    first = {x.in_reply_to: x for x in decisions if x.decision_id == x.in_reply_to}
    for event_id, pair in (
        ("k1", (Verdict.RECORDED, Reason.PARKED)),
        ("q1", (Verdict.DEFERRED, Reason.AWAITING_INTENT)),
        ("e3", (Verdict.RECORDED, Reason.PARKED)),
    ):
        assert (first[event_id].verdict, first[event_id].reason) == pair
        # Before this was read as SPEC says, RECORDED PARKED carried final=true.
        assert first[event_id].final is False, event_id
        (last,) = [x for x in decisions if x.decision_id == event_id + "/final"]
        assert last.final is True
    assert seen[Verdict.RECORDED, Reason.PARKED] == {False}


def test_the_client_waits_past_a_parked_answer_for_the_final_one() -> None:
    """`consumers.outcomes.answers` is what `ReconcilerClient.submit` waits with."""
    _, decisions = fold_all(_every_wait()[:2])
    parked, final = [x for x in decisions if x.in_reply_to == "k1"]
    assert (parked.reason, final.decision_id) == (Reason.PARKED, "k1/final")
    assert [answers(x, "k1") for x in (parked, final)] == [False, True]
