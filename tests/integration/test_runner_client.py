"""The client library against the real broker and engine: the resume round trip, a parked
resume answered by its `/final` decision, and a timeout (never a guess) when no engine runs."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.agents.resume import restore_run_state
from consumers.client import AsyncReconcilerClient, ReconcilerClient
from consumers.errors import NotResumedError, ReconcilerClientError, ResumeTimeoutError
from consumers.outcomes import ContinueWithoutReplay, ResumeOutcome, Withheld
from engine.core.digest import item_facts
from engine.core.events import AckOutcome, Binding, PendingRecord, Reason
from tests.integration.test_runner_sdk import running_world
from tests.unit.consumers.sdk_world import Effects, World, park_for_approval

pytestmark = pytest.mark.kafka

BINDING = Binding(backend_id="mem", namespace="client-tests")
USER = {"role": "user", "content": "charge 7"}
CALL = {"type": "function_call", "call_id": "c1", "name": "charge", "arguments": "{}"}
OUT = {"type": "function_call_output", "call_id": "c1", "output": "receipt-7"}


@pytest.fixture(scope="module")
def world(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with running_world(kafka_bootstrap, tmp_path_factory.mktemp("client")) as w:
        yield w


def pending(intent_id: str) -> PendingRecord:
    return PendingRecord(
        intent_id=intent_id,
        items=[item_facts(OUT, ignore_ids=False)],
        before=[item_facts(i, ignore_ids=False).digest for i in (USER, CALL)],
    )


def test_lost_ack_round_trip_and_a_second_copy_is_withheld(world: World) -> None:
    sid = f"rt-{uuid.uuid4().hex[:6]}"
    runner = world.client("runner-1")
    intent_id = runner.register_intent(
        session_id=sid, binding=BINDING, items=[OUT], before_tail=[USER, CALL], sequence=0
    )
    runner.acknowledge(session_id=sid, intent_id=intent_id, outcome=AckOutcome.UNKNOWN)
    common = {
        "session_id": sid,
        "binding": BINDING,
        "checkpoint_id": "cp-1",
        "checkpoint_sequence": 0,
        "pending": pending(intent_id),
        "observed_tail": [USER, CALL, OUT],
        "timeout_s": 30.0,
    }
    copy_a = world.client("copy-a", shift_ms=61_000)
    copy_b = world.client("copy-b", shift_ms=61_000)
    started = time.monotonic()
    first = copy_a.resume(**common)  # type: ignore[arg-type]
    round_trip = time.monotonic() - started
    assert isinstance(first, ContinueWithoutReplay)
    assert first.reason is Reason.COMMITTED
    assert first.fence_token is not None
    assert first.fence_token > 0
    second = copy_b.resume(**common)  # type: ignore[arg-type]
    assert isinstance(second, Withheld)
    assert second.holder == "copy-a"
    assert second.operator_action
    print(f"resume round trip {round_trip * 1000:.0f} ms")


def test_a_resume_parked_for_its_intent_waits_for_the_final_decision(world: World) -> None:
    sid = f"park-{uuid.uuid4().hex[:6]}"
    runner = world.client("runner-p")
    intent_id = uuid.uuid4().hex
    answer: list[ResumeOutcome | BaseException] = []

    def ask() -> None:
        try:
            answer.append(
                runner.resume(
                    session_id=sid,
                    binding=BINDING,
                    checkpoint_id="cp-1",
                    checkpoint_sequence=0,
                    pending=pending(intent_id),
                    observed_tail=[USER, CALL],
                    timeout_s=40.0,
                )
            )
        except BaseException as exc:
            answer.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    time.sleep(3)  # the resume arrives first and is parked DEFERRED
    assert not answer, "the client returned on the non-final DEFERRED decision"
    other = world.client("runner-p-intent")
    other.register_intent(
        session_id=sid,
        binding=BINDING,
        items=[OUT],
        before_tail=[USER, CALL],
        sequence=0,
        intent_id=intent_id,
    )
    asker.join(60)
    assert answer, "no answer within the timeout"
    assert not isinstance(answer[0], BaseException), answer
    outcome = answer[0]
    assert outcome.decision.decision_id.endswith("/final")
    assert outcome.decision.final


def test_engine_down_resume_times_out_and_the_runner_does_not_continue(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # Topics exist, no engine consumes them: nobody will ever answer.
    sid = "down-1"
    with running_world(kafka_bootstrap, tmp_path, with_engine=False) as world:
        fresh = world.session(sid, world.client("runner-1"))
        effects = Effects()
        agent, state = asyncio.run(park_for_approval(fresh, effects, 7))
        checkpoint = fresh.checkpoint(state)
        restored = world.session(sid, world.client("runner-2"), restored=True)
        started = time.monotonic()
        with pytest.raises(ResumeTimeoutError) as caught:
            asyncio.run(restore_run_state(agent, checkpoint, restored, timeout_s=3.0))
        assert 3.0 <= time.monotonic() - started < 15
        error = caught.value
        assert isinstance(error, ReconcilerClientError)
        assert error.session_id == sid
        assert error.request_id in str(error)
        assert "do not continue" in str(error)
        with pytest.raises(NotResumedError):
            asyncio.run(restored.add_items([USER]))  # type: ignore[list-item]
        assert effects.charges == []


def test_unreachable_brokers_fail_the_intent_before_the_session_is_touched() -> None:
    client = ReconcilerClient(
        "127.0.0.1:1", runner_id="r", delivery_timeout_s=1.0, kafka_config={"log_level": 0}
    )
    try:
        with pytest.raises(ReconcilerClientError, match="not delivered"):
            client.register_intent(
                session_id="s", binding=BINDING, items=[OUT], before_tail=[], sequence=0
            )
    finally:
        client.close()


def test_async_client_round_trip(world: World) -> None:
    sid = f"async-{uuid.uuid4().hex[:6]}"
    sync = world.client("runner-async")
    assert isinstance(sync, ReconcilerClient)
    client = AsyncReconcilerClient(sync)

    async def scenario() -> ResumeOutcome:
        intent_id = await client.register_intent(
            session_id=sid, binding=BINDING, items=[USER], before_tail=[], sequence=0
        )
        await client.acknowledge(session_id=sid, intent_id=intent_id, outcome=AckOutcome.COMMITTED)
        return await client.resume(
            session_id=sid,
            binding=BINDING,
            checkpoint_id="cp-async",
            checkpoint_sequence=0,
            pending=None,
            observed_tail=[],
            timeout_s=30.0,
        )

    outcome = asyncio.run(scenario())
    assert isinstance(outcome, ContinueWithoutReplay)
    assert outcome.reason is Reason.NO_PENDING_WRITE
