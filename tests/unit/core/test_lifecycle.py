"""Lifecycle property: the Session's content is right whatever the runners and the store do.

Driven by Hypothesis through `lifecycle_model.World`. The invariant is about the store, not the
decisions: every batch ends in the Session exactly once, or the session is withheld with an
alert and nothing was appended twice; never a grant after ambiguity; never two holders; and the
final answer to each input is the same whatever the interleaving of the three input topics.

For producers that fill the causal context (intent/ack/resume v3), every program is also
folded under several merges of its three topics (log order, each topic read wholly first, and
random merges that keep each topic's own order) and every final answer, reason included, and
the end state must be the same (README "Causal order"). And with every causal wait ended at
once (as the watermark or the 32-input bound ends it), a causal ack must act as the same ack
without causal context: same answers, same session health and slot after every input.

`make test` runs LIFECYCLE_EXAMPLES (default 2,000, derandomized); `make soak-core` runs
100,000 with a random seed.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from engine.core.events import AckEvent, Decision, Event, ResumeEvent
from engine.core.fold import fold, release_overdue
from engine.core.state import PARK_MS, Health, SessionState
from engine.core.watermark import expire, park_deadline
from tests.unit.core.lifecycle_model import (
    Fault,
    Foreign,
    ForeignWrite,
    Hold,
    Input,
    Op,
    Restore,
    Settle,
    Topic,
    World,
    Write,
)

EXAMPLES = int(os.environ.get("LIFECYCLE_EXAMPLES", "2000"))
SOAK = os.environ.get("LIFECYCLE_SOAK") == "1"
LIFECYCLE = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not SOAK,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

faults = st.sampled_from(list(Fault))
# A retry in place after an APPEND_ONCE grant is left out: with the intents read ahead, its
# re-arm cannot be told from the grant's own re-arm (README "Attempts").
granted_faults = st.sampled_from([f for f in Fault if f is not Fault.RETRY_IN_PLACE])
ops: st.SearchStrategy[Op] = st.one_of(
    st.builds(Write, faults),
    st.builds(Write, faults),
    st.builds(ForeignWrite, st.sampled_from(list(Foreign))),
    st.builds(Restore, st.sampled_from([1, 2]), granted_faults),
    st.just(Hold()),
    st.builds(Settle, st.booleans()),
)
programs = st.tuples(st.lists(ops, min_size=1, max_size=8), st.booleans())
# With causal context a re-arm names the failure it retries, so a retry in place after an
# APPEND_ONCE grant is ordered in every merge: the v3 programs include it.
causal_ops: st.SearchStrategy[Op] = st.one_of(
    st.builds(Write, faults),
    st.builds(Write, faults),
    st.builds(ForeignWrite, st.sampled_from(list(Foreign))),
    st.builds(Restore, st.sampled_from([1, 2]), faults),
    st.just(Hold()),
    st.builds(Settle, st.booleans()),
)
causal_programs = st.tuples(st.lists(causal_ops, min_size=1, max_size=8), st.booleans())

Answer = tuple[str, str]


def _final_answers(decisions: list[Decision]) -> dict[str, Answer]:
    """Per input event id, its final answer (the `/final` one for a parked input).

    The answer is what the input's producer acts on: verdict and runner action. The reason may
    name the evidence the engine had when it decided (HISTORY_CHANGED with the store's ack in
    hand, AMBIGUOUS from the tail alone), so it is not compared.
    """
    answers: dict[str, Answer] = {}
    for decision in decisions:
        answers[decision.in_reply_to] = (decision.verdict.value, decision.runner_action.value)
    return answers


def _refold(inputs: list[Input]) -> list[Decision]:
    return _refold_with_state(inputs)[1]


def _refold_with_state(inputs: list[Input]) -> tuple[SessionState | None, list[Decision]]:
    """Fold one interleaving, checking the per-step safety properties on the way."""
    state: SessionState | None = None
    offsets = dict.fromkeys(Topic, 0)
    decisions: list[Decision] = []
    for item in inputs:
        result = fold(state, item.event, offsets[item.topic])
        offsets[item.topic] += 1
        for decision in result.decisions:
            if decision.grants:
                _assert_safe_grant(state, item.event, decision)
        state = result.state
        decisions.extend(result.decisions)
    return state, decisions


def _assert_safe_grant(state: SessionState | None, event: Event, decision: Decision) -> None:
    if state is None:
        return
    assert state.health is Health.CLEAR, f"grant after {state.health}: {decision}"
    if isinstance(event, ResumeEvent) and decision.in_reply_to == event.event_id:
        other = state.holder not in (None, event.runner_id)
        assert not (other and state.lease_active(event.event_time_ms)), "two holders"


def _orders(log: list[Input]) -> tuple[list[list[Input]], list[list[Input]]]:
    """Backlogs where one topic is read ahead of the other two.

    First list: intents or acks ahead, where the final answers must equal time order's. Second:
    resumes ahead, checked for safety only: a resume judged before the acks and re-arms that
    preceded it in time cannot know of them (README "Interleavings").
    """

    def ahead(topic: Topic) -> list[Input]:
        return [*(i for i in log if i.topic is topic), *(i for i in log if i.topic is not topic)]

    return [ahead(Topic.INTENTS), ahead(Topic.ACKS)], [ahead(Topic.RESUMES)]


def check_store(world: World) -> list[str]:
    """What is wrong with the Session's content after `world` ran (empty: nothing)."""
    problems = list(world.violations)
    # Nothing appended twice (unless a foreign writer removed the first copy: then the tail
    # is `before` again, exactly what the SDK reads as "append once"); every item of ours at
    # most once in the Session.
    for k, n in Counter(world.appended).items():
        removed = set(world.digests(world.batch_items[k])) & world.foreign_touched
        if n != 1 and not removed:
            problems.append(f"batch {k} appended {n} times")
    ours = {d for k in world.batch_items for d in world.digests(world.batch_items[k])}
    stored = Counter(d for d in world.digests(world.store) if d in ours)
    if any(n != 1 for n in stored.values()):
        problems.append("an item of ours is in the Session twice")
    # Every started batch landed exactly once, or the session is withheld with an alert.
    alerted = any(d.alert for d in world.decisions)
    for k in sorted(world.started):
        digests = world.digests(world.batch_items[k])
        if set(digests) & world.foreign_touched:
            continue  # a foreign writer removed it: not ours to keep
        landed = all(stored[d] == 1 for d in digests)
        if not (landed or (world.stopped and alerted)):
            problems.append(f"batch {k} lost without an alert")
    return problems


def check_world(program: list[Op], store_acks: bool) -> World:
    world = World(store_acks=store_acks)
    world.run(program)
    assert check_store(world) == []
    # The same inputs in other interleavings: safe on every step, same final answers.
    end_state, decisions = _refold_with_state(world.log)
    baseline = _final_answers(decisions)
    # Once the partition's watermark is PARK_MS past the last input, nothing waits any more:
    # every parked input got its one final answer (SPEC.md "Parked inputs").
    if end_state is not None:
        end = max(i.event.event_time_ms for i in world.log) + PARK_MS
        end_state, _ = expire(end_state, end)
        assert park_deadline(end_state) is None
    # Every resume got a final answer (nothing left DEFERRED).
    resumes = [i.event.event_id for i in world.log if i.topic is Topic.RESUMES]
    assert all(baseline[r][0] != "DEFERRED" for r in resumes), "a resume never got a final answer"
    assert baseline == _final_answers(world.decisions)
    same, safe_only = _orders(world.log)
    if store_acks and Write(Fault.RETRY_IN_PLACE) in program:
        # Intents read ahead: a retry in place can be folded between the store's and the
        # runner's NOT_WRITTEN of the attempt it retries, and the later one then counts against
        # the retry (AMBIGUOUS, alerted, nothing granted). Safety only (README "Attempts").
        safe_only.append(same.pop(0))
    for order in same:
        assert _final_answers(_refold(order)) == baseline
    for order in safe_only:
        _refold(order)
    return world


@LIFECYCLE
@given(programs)
def test_lifecycle_store_content_is_right_in_every_interleaving(
    program: tuple[list[Op], bool],
) -> None:
    ops_, store_acks = program
    check_world(ops_, store_acks)


Reasoned = tuple[str, str, str]


def merges(log: list[Input], rng: random.Random, count: int = 3) -> dict[str, list[Input]]:
    """The merges of the three topics a v3 program must answer alike: log (time) order, each
    topic read wholly first, and ``count`` random merges keeping each topic's own order."""

    def ahead(topic: Topic) -> list[Input]:
        return [*(i for i in log if i.topic is topic), *(i for i in log if i.topic is not topic)]

    orders = {"log": list(log), **{f"{t.value} first": ahead(t) for t in Topic}}
    for n in range(count):
        queues = {t: [i for i in log if i.topic is t] for t in Topic}
        merged: list[Input] = []
        while any(queues.values()):
            merged.append(queues[rng.choice([t for t in Topic if queues[t]])].pop(0))
        orders[f"random {n}"] = merged
    return orders


def settled(inputs: list[Input]) -> tuple[dict[str, Reasoned], dict[str, Any] | None]:
    """Final answers (verdict, reason, runner action) and the end state of one merge, once the
    watermark is `PARK_MS` past the last input (nothing waits any more). The de-duplication
    window is left out of the state: it lists the last ids in the order they were folded."""
    state, decisions = _refold_with_state(inputs)
    record: dict[str, Any] | None = None
    if state is not None:
        end = max(i.event.event_time_ms for i in inputs) + PARK_MS
        state, expired = expire(state, end)
        decisions = [*decisions, *expired]
        assert park_deadline(state) is None
        record = state.to_record()
        record.pop("recent_event_ids")
    answers = {
        d.in_reply_to: (d.verdict.value, d.reason.value, d.runner_action.value) for d in decisions
    }
    return answers, record


def differing_merges(world: World, rng: random.Random) -> list[str]:
    """The merges whose final answers or end state differ from log order's."""
    orders = merges(world.log, rng)
    baseline = settled(orders.pop("log"))
    return [name for name, order in orders.items() if settled(order) != baseline]


def _unbounded(inputs: list[Input], *, acks_causal: bool) -> tuple[dict[str, Answer], list[Any]]:
    """Fold ``inputs`` ending every causal wait at once (`fold.release_overdue`, as the
    watermark does), acks with or without their causal context: the final answers, and the
    session's health and slot after every input and once nothing waits."""
    state: SessionState | None = None
    offsets = dict.fromkeys(Topic, 0)
    decisions: list[Decision] = []
    trace: list[Any] = []
    for item in inputs:
        event = item.event
        if not acks_causal and isinstance(event, AckEvent):
            event = replace(event, causal=None)
        result = fold(state, event, offsets[item.topic])
        offsets[item.topic] += 1
        state, released = release_overdue(result.state, 2**62)
        decisions.extend([*result.decisions, *released])
        trace.append((state.health, state.health_reason, state.slot))
    if state is not None:
        state, expired = expire(state, max(i.event.event_time_ms for i in inputs) + PARK_MS)
        decisions.extend(expired)
        trace.append((state.health, state.health_reason, state.slot))
    return _final_answers(decisions), trace


def acks_first(log: list[Input]) -> list[Input]:
    """The merge where each ack precedes what it names (the acks topic read wholly first)."""
    return [
        *(i for i in log if i.topic is Topic.ACKS),
        *(i for i in log if i.topic is not Topic.ACKS),
    ]


@LIFECYCLE
@given(causal_programs, st.randoms(use_true_random=False))
def test_lifecycle_v3_answers_and_end_state_do_not_depend_on_the_merge(
    program: tuple[list[Op], bool], rng: random.Random
) -> None:
    ops_, store_acks = program
    world = World(store_acks=store_acks, causal=True)
    world.run(ops_)
    assert check_store(world) == []
    if world.log:
        assert differing_merges(world, rng) == []
        # A causal ack folded without its causes acts as the same ack without causal context
        # (SPEC.md §7 "Causal context": folded as it stands).
        order = acks_first(world.log)
        assert _unbounded(order, acks_causal=True) == _unbounded(order, acks_causal=False)
