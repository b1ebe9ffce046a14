"""The real openai-agents SDK through `ReconciledSession`, against the real broker and engine.

Each scenario: a fresh run parks for approval of a tool with a side effect; the approved run's
append fails in a chosen way; the process "dies" and a new runner (its clock past the old lease)
restores from the checkpoint through the reconciler. Checked every time: the tool ran exactly
once, no call or output is duplicated or lost, and a withheld runner never continues.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from agents import Runner
from agents.run_state import RunState

from consumers.agents.fenced_sqlite import FencedSQLiteSession
from consumers.agents.resume import restore_run_state, resume_from_checkpoint
from consumers.checkpoint import Checkpoint
from consumers.client import Clock, ReconcilerClient
from consumers.errors import ContinuationWithheldError, StaleFenceError
from consumers.outcomes import AppendOnce, ContinueWithoutReplay, Withheld
from engine.core.events import Reason
from tests.integration.engine_harness import engine_settings, engine_thread
from tests.unit.consumers.sdk_world import (
    AFTER_LEASE_MS,
    Effects,
    World,
    assert_pairs_once,
    crash_on_resumed_append,
    history,
    kinds,
    make_agent,
    park_for_approval,
    resumed_steps,
)

pytestmark = pytest.mark.kafka


@contextmanager
def running_world(bootstrap: str, tmp: Path, *, with_engine: bool = True) -> Iterator[World]:
    """Topics with a fresh prefix, the engine in a thread, and Kafka clients."""
    settings = engine_settings(bootstrap, f"rt-{uuid.uuid4().hex[:8]}", tmp / "state")

    def make_client(runner_id: str, clock: Clock) -> ReconcilerClient:
        return ReconcilerClient(
            bootstrap, runner_id=runner_id, topic_prefix=settings.topic_prefix, clock=clock
        )

    world = World(make_client, tmp)
    with engine_thread(settings) if with_engine else nullcontext():
        try:
            yield world
        finally:
            for client in world.clients:
                assert isinstance(client, ReconcilerClient)
                client.close()


@pytest.fixture(scope="module")
def world(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with running_world(kafka_bootstrap, tmp_path_factory.mktemp("sdk")) as w:
        yield w


def new_sid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


async def restore_and_finish(
    world: World,
    sid: str,
    checkpoint: Checkpoint,
    effects: Effects,
    runner: str = "runner-b",
    *,
    held: bool = False,
) -> Any:
    """A new process: restore through the reconciler; run to the end only when granted."""
    client = world.client(runner, shift_ms=AFTER_LEASE_MS)
    session = world.session(sid, client, restored=True)
    agent = make_agent(effects, resumed_steps(), held=held)
    state, outcome = await restore_run_state(agent, checkpoint, session, timeout_s=30)
    result = await Runner.run(agent, state, session=session)
    assert result.final_output == "done"
    return outcome


FAULTS: dict[str, tuple[tuple[int, ...], type[AppendOnce | ContinueWithoutReplay], Reason]] = {
    # fault: (tools approved, expected outcome type, reason)
    "before": ((7,), AppendOnce, Reason.UNCHANGED),  # append fails before commit
    "after": ((7,), ContinueWithoutReplay, Reason.COMMITTED),  # commits, loses the ack
    "rollback": ((7,), AppendOnce, Reason.UNCHANGED),  # the store rolls back: NOT_WRITTEN
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_then_restore_never_duplicates_and_never_loses(world: World, fault: str) -> None:
    amounts, expected_type, reason = FAULTS[fault]

    async def scenario() -> None:
        sid, effects = new_sid(fault), Effects()
        session = world.session(sid, world.client("runner-a"))
        agent, state = await park_for_approval(session, effects, *amounts)
        checkpoint = await crash_on_resumed_append(session, agent, state, fault)
        assert effects.charges == list(amounts)
        outcome = await restore_and_finish(world, sid, checkpoint, effects)
        assert isinstance(outcome, expected_type)
        assert outcome.reason is reason
        assert effects.charges == list(amounts), "the tool ran again"
        items = await history(sid, world.tmp)
        assert_pairs_once(items)
        assert kinds(items)[-1] == "message:assistant"

    asyncio.run(scenario())


def test_partial_commit_is_withheld_and_history_is_left_alone(world: World) -> None:
    async def scenario() -> None:
        sid, effects = new_sid("partial"), Effects()
        session = world.session(sid, world.client("runner-a"))
        agent, state = await park_for_approval(session, effects, 7, 8)
        checkpoint = await crash_on_resumed_append(session, agent, state, "partial")
        before = await history(sid, world.tmp)
        with pytest.raises(ContinuationWithheldError) as caught:
            await restore_and_finish(world, sid, checkpoint, effects)
        assert caught.value.reason is Reason.PARTIAL_COMMIT
        assert caught.value.operator_action
        assert await history(sid, world.tmp) == before
        assert effects.charges == [7, 8]

    asyncio.run(scenario())


def test_sdk_gap_9_partial_evidence_is_remembered_after_the_prefix_vanishes(world: World) -> None:
    async def scenario() -> None:
        sid, effects = new_sid("gap9"), Effects()
        session = world.session(sid, world.client("runner-a"))
        agent, state = await park_for_approval(session, effects, 7, 8)
        checkpoint = await crash_on_resumed_append(session, agent, state, "partial")
        with pytest.raises(ContinuationWithheldError):
            await restore_and_finish(world, sid, checkpoint, effects)
        # Someone removes the written prefix: the tail now looks unchanged to the SDK.
        await FencedSQLiteSession(sid, world.tmp / f"{sid}.db").pop_item()
        with pytest.raises(ContinuationWithheldError) as caught:
            await restore_and_finish(world, sid, checkpoint, effects, runner="runner-c")
        assert caught.value.reason is Reason.SESSION_AMBIGUOUS
        assert effects.charges == [7, 8]
        assert [i.get("type") for i in await history(sid, world.tmp)].count(
            "function_call_output"
        ) == 0

    asyncio.run(scenario())


def test_foreign_writer_extending_history_is_withheld(world: World) -> None:
    async def scenario() -> None:
        sid, effects = new_sid("foreign"), Effects()
        session = world.session(sid, world.client("runner-a"))
        agent, state = await park_for_approval(session, effects, 7)
        checkpoint = await crash_on_resumed_append(session, agent, state, "before")
        foreign = FencedSQLiteSession(sid, world.tmp / f"{sid}.db")
        await foreign.add_items([{"role": "user", "content": "someone else"}])
        with pytest.raises(ContinuationWithheldError) as caught:
            await restore_and_finish(world, sid, checkpoint, effects)
        assert caught.value.reason is Reason.AMBIGUOUS
        items = await history(sid, world.tmp)
        assert [i.get("type") for i in items].count("function_call_output") == 0
        assert effects.charges == [7]

    asyncio.run(scenario())


def test_sdk_gap_6_an_identical_foreign_copy_after_a_rollback_is_not_authorship(
    world: World,
) -> None:
    async def scenario() -> None:
        sid, effects = new_sid("gap6"), Effects()
        session = world.session(sid, world.client("runner-a"))
        agent, state = await park_for_approval(session, effects, 7)
        checkpoint = await crash_on_resumed_append(session, agent, state, "rollback")
        batch = checkpoint.run_state["pending_session_write"]["items"]
        foreign = FencedSQLiteSession(sid, world.tmp / f"{sid}.db")
        await foreign.add_items(copy.deepcopy(batch))  # the SDK alone would settle on this
        with pytest.raises(ContinuationWithheldError) as caught:
            await restore_and_finish(world, sid, checkpoint, effects)
        assert caught.value.reason is Reason.CONTENT_NOT_AUTHORSHIP
        assert effects.charges == [7]

    asyncio.run(scenario())


def test_two_copies_of_one_checkpoint_exactly_one_proceeds_and_the_late_append_is_rejected(
    world: World,
) -> None:
    async def scenario() -> None:
        sid, effects = new_sid("copies"), Effects()
        session = world.session(sid, world.client("runner-a"))
        agent, state = await park_for_approval(session, effects, 7)
        checkpoint = await crash_on_resumed_append(session, agent, state, "before")
        copies = {
            name: world.session(sid, world.client(name, shift_ms=AFTER_LEASE_MS), restored=True)
            for name in ("copy-a", "copy-b")
        }
        outcomes = await asyncio.gather(
            *(resume_from_checkpoint(s, checkpoint, timeout_s=30) for s in copies.values())
        )
        granted = [n for n, o in zip(copies, outcomes, strict=True) if not isinstance(o, Withheld)]
        withheld = [o for o in outcomes if isinstance(o, Withheld)]
        assert len(granted) == 1, outcomes
        assert len(withheld) == 1, outcomes
        assert withheld[0].holder == granted[0]
        winner = copies[granted[0]]
        assert isinstance(winner.inner, FencedSQLiteSession)
        # The SDK alone: the withheld copy runs anyway with its old token on the plain store.
        rogue_store = FencedSQLiteSession(sid, world.tmp / f"{sid}.db")
        rogue_state = await RunState.from_json(agent, copy.deepcopy(checkpoint.run_state))
        with pytest.raises(StaleFenceError):
            await Runner.run(make_agent(effects, resumed_steps()), rogue_state, session=rogue_store)
        # The winner continues: the SDK appends the batch once, under the fence.
        agent_w = make_agent(effects, resumed_steps())
        state_w = await RunState.from_json(agent_w, copy.deepcopy(checkpoint.run_state))
        result = await Runner.run(agent_w, state_w, session=winner)
        assert result.final_output == "done"
        items = await history(sid, world.tmp)
        assert_pairs_once(items)
        assert effects.charges == [7]
        # and the withheld copy's wrapper refuses to append at all
        loser = copies[next(n for n in copies if n != granted[0])]
        with pytest.raises(ContinuationWithheldError):
            await loser.add_items([{"role": "user", "content": "x"}])

    asyncio.run(scenario())


def test_sdk_gap_2_copies_of_an_approval_park_run_the_tool_once(world: World) -> None:
    async def scenario() -> None:
        sid, effects = new_sid("gap2"), Effects()
        session = world.session(sid, world.client("runner-a"))
        _agent, state = await park_for_approval(session, effects, 7)
        checkpoint = Checkpoint.from_json(session.checkpoint(state).to_json())
        first = await restore_and_finish(world, sid, checkpoint, effects, runner="copy-a")
        assert isinstance(first, ContinueWithoutReplay)
        assert first.reason is Reason.NO_PENDING_WRITE
        with pytest.raises(ContinuationWithheldError) as caught:
            await restore_and_finish(world, sid, checkpoint, effects, runner="copy-b")
        assert caught.value.reason in (Reason.HELD_BY_OTHER, Reason.CHECKPOINT_ALREADY_RESUMED)
        assert effects.charges == [7]
        assert_pairs_once(await history(sid, world.tmp))

    asyncio.run(scenario())


def test_sdk_gap_3_the_checkpoint_from_before_a_lost_ack_is_stale(world: World) -> None:
    async def scenario() -> None:
        sid, effects = new_sid("gap3"), Effects()
        session = world.session(sid, world.client("runner-a"))
        agent, state = await park_for_approval(session, effects, 7)
        older = Checkpoint.from_json(session.checkpoint(state).to_json())
        # The run dies after a lost ack, before the app saved a newer checkpoint.
        await crash_on_resumed_append(session, agent, state, "after")
        with pytest.raises(ContinuationWithheldError) as caught:
            await restore_and_finish(world, sid, older, effects)
        assert caught.value.reason is Reason.STALE_CHECKPOINT
        assert effects.charges == [7]
        assert_pairs_once(await history(sid, world.tmp))

    asyncio.run(scenario())


def test_sdk_gap_4_a_resume_with_another_ids_policy_is_withheld(world: World) -> None:
    async def scenario() -> None:
        sid, effects = new_sid("gap4"), Effects()
        session = world.session(sid, world.client("runner-a"))
        agent, state = await park_for_approval(session, effects, 7)
        checkpoint = await crash_on_resumed_append(session, agent, state, "after")
        client = world.client("runner-b", shift_ms=AFTER_LEASE_MS)
        other_policy = world.session(sid, client, restored=True, ignore_ids=True)
        with pytest.raises(ContinuationWithheldError) as caught:
            await restore_run_state(agent, checkpoint, other_policy, timeout_s=30)
        assert caught.value.reason is Reason.BINDING_MISMATCH
        assert effects.charges == [7]

    asyncio.run(scenario())


TAMPER = {
    "items": lambda r: r["items"][0].update(output="receipt-999"),
    "before-null": lambda r: r.update(before=None),
}


@pytest.mark.parametrize("how", sorted(TAMPER))
def test_sdk_gap_7_a_tampered_checkpoint_record_is_withheld(world: World, how: str) -> None:
    async def scenario() -> None:
        sid, effects = new_sid(f"gap7-{how}"), Effects()
        session = world.session(sid, world.client("runner-a"))
        agent, state = await park_for_approval(session, effects, 7)
        checkpoint = await crash_on_resumed_append(session, agent, state, "after")
        run_state = copy.deepcopy(checkpoint.run_state)
        TAMPER[how](run_state["pending_session_write"])
        tampered = checkpoint.model_copy(update={"run_state": run_state})
        with pytest.raises(ContinuationWithheldError) as caught:
            await restore_and_finish(world, sid, tampered, effects)
        assert caught.value.reason is Reason.RECORD_MISMATCH
        assert effects.charges == [7]
        assert_pairs_once(await history(sid, world.tmp))

    asyncio.run(scenario())


def test_held_park_rides_then_settles_once_and_a_second_copy_is_withheld(world: World) -> None:
    async def scenario() -> None:
        sid, effects = new_sid("held"), Effects()
        session = world.session(sid, world.client("runner-a"))
        _agent, state = await park_for_approval(session, effects, 7, held=True)
        assert kinds(await history(sid, world.tmp)) == ["message:user"]  # the call is held
        checkpoint = Checkpoint.from_json(session.checkpoint(state).to_json())
        assert checkpoint.run_state["pending_session_write"]["held"] is True
        assert checkpoint.pending_intent_id is not None
        first = await restore_and_finish(world, sid, checkpoint, effects, "copy-a", held=True)
        assert isinstance(first, ContinueWithoutReplay)
        assert first.reason is Reason.HELD_RIDES
        items = await history(sid, world.tmp)
        assert kinds(items)[:3] == [
            "message:user",
            "function_call:charge-7",
            "function_call_output:charge-7",
        ]
        with pytest.raises(ContinuationWithheldError):
            await restore_and_finish(world, sid, checkpoint, effects, "copy-b", held=True)
        assert effects.charges == [7]
        assert_pairs_once(await history(sid, world.tmp))

    asyncio.run(scenario())


def test_held_settle_that_fails_is_granted_once_on_the_next_resume(world: World) -> None:
    async def scenario() -> None:
        sid, effects = new_sid("held-fail"), Effects()
        session = world.session(sid, world.client("runner-a"))
        agent, state = await park_for_approval(session, effects, 7, held=True)
        session.checkpoint(state)  # registers the held batch, as the app's save would
        checkpoint = await crash_on_resumed_append(session, agent, state, "before")
        record = checkpoint.run_state["pending_session_write"]
        assert record.get("held") is not True  # the settle registered an ordinary write
        outcome = await restore_and_finish(world, sid, checkpoint, effects, held=True)
        assert isinstance(outcome, AppendOnce)
        assert effects.charges == [7]
        assert_pairs_once(await history(sid, world.tmp))

    asyncio.run(scenario())
