"""`reconciler explain SESSION`: the decision trail of one session, for a person.

It reads the decisions partition of the session (and its latest changelog state) with
read_committed and renders every decision with its trail.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from engine.core.events import Decision
from engine.core.state import SessionState
from engine.errors import EngineError
from engine.runtime.state_codec import decode_state
from engine.settings import Settings
from engine.wire import Codec, DecodeError, RecordType
from engine.wire.partitioner import partition_for

READ_TIMEOUT_S = 30.0


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
