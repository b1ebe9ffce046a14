"""`ReconciledSession` with the engine's fold in-process: what it publishes, and when."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agents import Runner

from consumers.agents.resume import restore_run_state
from consumers.checkpoint import Checkpoint, CheckpointCause
from consumers.errors import PublishError
from consumers.messages import CausalCounter
from engine.core.events import (
    AckEvent,
    AckOutcome,
    CausalContext,
    Cause,
    IntentEvent,
    IntentKind,
    Reason,
    ResumeEvent,
    RunnerAction,
    Verdict,
)
from tests.unit.consumers.sdk_world import (
    AFTER_LEASE_MS,
    Effects,
    FaultySession,
    fold_world,
    history,
    kinds,
    make_agent,
    park_for_approval,
    resumed_steps,
)

USER: Any = {"role": "user", "content": "hi"}


def test_every_append_is_registered_then_acknowledged(tmp_path: Path) -> None:
    world = fold_world(tmp_path)
    assert world.fold_engine is not None
    session = world.session("s1", world.client("runner-a"))
    asyncio.run(park_for_approval(session, Effects(), 7))
    events = world.fold_engine.events
    # the fresh run's input save and its turn save: intent, then COMMITTED ack, each
    assert [type(e).__name__ for e in events] == ["IntentEvent", "AckEvent"] * 2
    intents = [e for e in events if isinstance(e, IntentEvent)]
    acks = [e for e in events if isinstance(e, AckEvent)]
    assert [i.sequence for i in intents] == [0, 1]
    assert intents[0].before == []  # the empty session's tail
    assert {a.outcome for a in acks} == {AckOutcome.COMMITTED}
    assert [a.intent_id for a in acks] == [i.intent_id for i in intents]
    assert all(d.verdict is Verdict.RECORDED for d in world.fold_engine.decisions)


def test_an_intent_that_is_not_durable_never_touches_the_session(tmp_path: Path) -> None:
    world = fold_world(tmp_path)
    client = world.client("runner-a")
    session = world.session("s1", client)

    def unreachable(**_kw: Any) -> str:
        raise PublishError(topic="t", session_id="s1", event_id="e", detail="down")

    client.register_intent = unreachable  # type: ignore[method-assign]
    with pytest.raises(PublishError):
        asyncio.run(session.add_items([USER]))
    assert asyncio.run(history("s1", tmp_path)) == []


def test_an_append_that_raises_is_acknowledged_unknown(tmp_path: Path) -> None:
    world = fold_world(tmp_path)
    assert world.fold_engine is not None
    session = world.session("s1", world.client("runner-a"))
    store = session.inner
    assert isinstance(store, FaultySession)
    store.fault = "after"
    with pytest.raises(RuntimeError):
        asyncio.run(session.add_items([USER]))
    ack = world.fold_engine.events[-1]
    assert isinstance(ack, AckEvent)
    assert ack.outcome is AckOutcome.UNKNOWN
    assert session.open_intent_id == ack.intent_id


def test_sdk_gap_8_a_held_batch_dropped_by_a_detached_run_is_reported_and_alerted(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        world = fold_world(tmp_path)
        assert world.fold_engine is not None
        effects = Effects()
        session = world.session("s1", world.client("runner-a"))
        _agent, state = await park_for_approval(session, effects, 7, held=True)
        checkpoint = session.checkpoint(state)
        restored = world.session(
            "s1", world.client("runner-b", shift_ms=AFTER_LEASE_MS), restored=True
        )
        agent = make_agent(effects, resumed_steps(), held=True)
        state, outcome = await restore_run_state(agent, checkpoint, restored)
        assert outcome.decision.reason is Reason.HELD_RIDES
        result = await Runner.run(agent, state)  # detached: no Session; the SDK drops the batch
        assert result.final_output == "done"
        restored.checkpoint(result.to_state())
        assert kinds(await history("s1", tmp_path)) == ["message:user"]  # the pair never landed
        discard = world.fold_engine.events[-1]
        assert isinstance(discard, IntentEvent)
        assert discard.kind is IntentKind.DISCARD
        last = world.fold_engine.decisions[-1]
        assert (last.reason, last.alert) == (Reason.HELD_LOSS, True)
        assert last.operator_action

    asyncio.run(scenario())


def test_binding_follows_the_store_like_the_sdk(tmp_path: Path) -> None:
    from agents import SQLiteSession
    from agents.memory import OpenAIConversationsSession

    from consumers.agents.session import ReconciledSession

    world = fold_world(tmp_path)
    client = world.client("r")
    fenced = world.session("s1", client)
    assert fenced.binding.store_enforces_fence
    assert not fenced.binding.ignore_ids
    plain = ReconciledSession(SQLiteSession("s2"), client, backend_id="sqlite")
    assert not plain.binding.store_enforces_fence
    conversations = ReconciledSession(
        OpenAIConversationsSession(conversation_id="conv_1", openai_client=object()),  # type: ignore[arg-type]
        client,
        backend_id="openai",
    )
    assert conversations.binding.ignore_ids
    assert conversations.binding.chunk_size == 20
    assert conversations._ignore_ids_for_matching  # what the SDK reads on the wrapper


def test_client_carries_schema_version_persisted_count_and_checkpoint_session(
    tmp_path: Path,
) -> None:
    """No field the core compares is left at its default by the client."""

    async def scenario() -> None:
        world = fold_world(tmp_path)
        assert world.fold_engine is not None
        effects = Effects()
        session = world.session("s1", world.client("runner-a"))
        _agent, state = await park_for_approval(session, effects, 7, held=True)
        checkpoint = session.checkpoint(state)
        record = checkpoint.run_state["pending_session_write"]
        held = world.fold_engine.events[-1]
        assert isinstance(held, IntentEvent)
        assert held.kind is IntentKind.HELD
        assert held.persisted_count == record["persisted_count"]
        assert held.binding.checkpoint_schema_version == checkpoint.run_state["$schemaVersion"]
        restored = world.session(
            "s1", world.client("runner-b", shift_ms=AFTER_LEASE_MS), restored=True
        )
        agent = make_agent(effects, resumed_steps(), held=True)
        _state, outcome = await restore_run_state(agent, checkpoint, restored)
        resume = world.fold_engine.events[-1]
        assert isinstance(resume, ResumeEvent)
        assert resume.pending is not None
        assert resume.pending.persisted_count == record["persisted_count"]
        assert resume.checkpoint_session_id == checkpoint.session_id
        assert resume.binding.checkpoint_schema_version == checkpoint.run_state["$schemaVersion"]
        assert outcome.decision.runner_action is RunnerAction.RELEASE_HELD

    asyncio.run(scenario())


def test_the_client_fills_the_causal_context_and_a_resume_names_the_checkpoints_last_event(
    tmp_path: Path,
) -> None:
    """Intent/ack/resume v3: every event numbers itself and names the runner's previous one;
    the checkpoint stores the last acknowledged event and the restored runner's resume names
    it, so the engine folds the resume after it whatever topic is read first."""

    async def scenario() -> None:
        world = fold_world(tmp_path)
        assert world.fold_engine is not None
        effects = Effects()
        session = world.session("s1", world.client("runner-a"))
        _agent, state = await park_for_approval(session, effects, 7, held=True)
        checkpoint = Checkpoint.from_json(session.checkpoint(state).to_json())
        written = [getattr(e, "causal", None) for e in world.fold_engine.events]
        assert all(c is not None and c.producer == "runner-a" for c in written)
        assert [c.seq for c in written if c is not None] == list(range(len(written)))
        assert [c.after for c in written if c is not None][1:] == [
            [Cause(producer="runner-a", seq=n)] for n in range(len(written) - 1)
        ]
        assert checkpoint.after == [CheckpointCause(producer="runner-a", seq=len(written) - 1)]
        restored = world.session(
            "s1", world.client("runner-b", shift_ms=AFTER_LEASE_MS), restored=True
        )
        agent = make_agent(effects, resumed_steps(), held=True)
        await restore_run_state(agent, checkpoint, restored)
        resume = world.fold_engine.events[-1]
        assert isinstance(resume, ResumeEvent)
        assert resume.causal == CausalContext(
            producer="runner-b",
            seq=0,
            after=[Cause(producer="runner-a", seq=len(written) - 1)],
        )

    asyncio.run(scenario())


def test_a_sequence_number_is_never_reused_and_only_acknowledged_events_are_named() -> None:
    counter = CausalCounter("r")
    first = counter.next("s")
    assert (first.seq, first.after) == (0, [])
    lost = counter.next("s")  # its delivery failed: never acknowledged
    assert lost.seq == 1
    third = counter.next("s")
    assert (third.seq, third.after) == (2, [])  # names nothing the topic may not hold
    counter.acknowledged("s", third)
    assert counter.last("s") == Cause(producer="r", seq=2)
    assert counter.next("s", [Cause(producer="x", seq=5)]).after == [
        Cause(producer="r", seq=2),
        Cause(producer="x", seq=5),
    ]
    assert counter.last("other") is None
