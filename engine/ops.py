"""Operator commands: `reconciler explain SESSION` and `reconciler repair SESSION ...`.

`explain` reads the decisions partition of one session (and its latest changelog state) with
read_committed and prints the decision trail for a person. `repair` publishes an operator
repair command on the intents topic and waits for the engine's answer to it.
"""

from __future__ import annotations

import getpass
import time
import uuid
from collections.abc import Iterator

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from engine.core.events import Decision, RepairEvent, RepairResolution
from engine.core.state import SessionState
from engine.errors import EngineError
from engine.runtime.state_codec import decode_state
from engine.settings import Settings
from engine.wire import Codec, DecodeError, RecordType
from engine.wire.partitioner import partition_for

READ_TIMEOUT_S = 30.0


class RepairNotAnsweredError(EngineError):
    """The engine did not answer a repair command in time."""


def _read_partition(settings: Settings, topic: str, partition: int) -> Iterator[Message]:
    """Every committed record of one partition, from the beginning to the current end."""
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"reconciler-cli-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
    )
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return
                    raise EngineError(
                        f"reading {topic}[{partition}] failed: {error}.",
                        "check the brokers and the topic name.",
                    )
                yield message
    finally:
        consumer.close()


def session_decisions(settings: Settings, session_id: str, codec: Codec) -> list[Decision]:
    partition = partition_for(session_id, settings.partitions)
    decisions: list[Decision] = []
    for message in _read_partition(settings, settings.topics.decisions, partition):
        if message.key() != session_id.encode():
            continue
        try:
            decision = codec.decode(RecordType.DECISION, message.value() or b"")
        except DecodeError:
            continue
        if isinstance(decision, Decision):
            decisions.append(decision)
    return decisions


def session_state(settings: Settings, session_id: str) -> SessionState | None:
    partition = partition_for(session_id, settings.partitions)
    latest: bytes | None = None
    for message in _read_partition(settings, settings.topics.changelog, partition):
        if message.key() == session_id.encode():
            latest = message.value()
    return decode_state(latest) if latest else None


def render_explanation(
    session_id: str, decisions: list[Decision], state: SessionState | None
) -> str:
    lines = [f"session {session_id}"]
    if state is not None:
        slot = state.slot
        lines.append(
            f"  now: health={state.health}"
            + (f" ({state.health_reason})" if state.health_reason else "")
            + f", holder={state.holder or '-'}, fence={state.fence_token}"
            + (f", pending write {slot.intent_id} {slot.status}" if slot else ", no pending write")
        )
    if not decisions:
        lines.append("  no decisions yet")
    for d in decisions:
        fence = f" fence={d.fence_token} ({d.fence})" if d.fence_token is not None else ""
        lines.append(
            f"- t={d.event_time_ms} {d.in_reply_to}: {d.verdict} {d.reason}"
            f" [{d.classification}]{fence}" + (" ALERT" if d.alert else "")
        )
        lines.extend(f"    {entry.step}: {entry.detail}" for entry in d.trail)
        if d.operator_action:
            lines.append(f"    operator: {d.operator_action}")
    return "\n".join(lines)


def explain(settings: Settings, session_id: str) -> str:
    codec = Codec()
    return render_explanation(
        session_id,
        session_decisions(settings, session_id, codec),
        session_state(settings, session_id),
    )


def repair(
    settings: Settings,
    session_id: str,
    resolution: RepairResolution,
    reason: str,
    actor: str | None = None,
    intent_id: str | None = None,
    wait_s: float = READ_TIMEOUT_S,
) -> Decision:
    """Publish the repair command and return the engine's decision about it."""
    codec = Codec()
    event = RepairEvent(
        event_id=f"repair-{uuid.uuid4()}",
        session_id=session_id,
        event_time_ms=int(time.time() * 1000),  # the operator's clock becomes event time
        resolution=resolution,
        actor=actor or getpass.getuser(),
        reason=reason,
        intent_id=intent_id,
    )
    producer = Producer(
        settings.client_config(
            **{"partitioner": "murmur2_random", "enable.idempotence": True, "acks": "all"}
        )
    )
    producer.produce(settings.topics.intents, key=session_id.encode(), value=codec.encode(event))
    if producer.flush(READ_TIMEOUT_S) != 0:
        raise EngineError(
            "the repair command was not acknowledged by the brokers.",
            "check the brokers and retry; nothing was repaired.",
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for decision in session_decisions(settings, session_id, codec):
            if decision.decision_id == event.event_id:
                return decision
        time.sleep(0.5)
    raise RepairNotAnsweredError(
        f"the engine did not answer repair {event.event_id} within {wait_s:.0f}s "
        "(the command is recorded on the intents topic and will be applied when it runs).",
        f"check that `reconciler run` is up, then `reconciler explain {session_id}`.",
    )
