"""`reconciler explain SESSION`: the decision trail of one session, for a person.

It checks within ``timeout_s`` that the brokers answer and the topics exist, then reads the
session's decisions partition and its latest changelog state (read_committed) to the end. It
never answers "no decisions" unless it read the whole partition: a read that cannot finish is
an error. The pending write's digests are printed, so the operator can compare them with the
Session tail before a repair.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from engine.admin.brokers import DEFAULT_TIMEOUT_S, quiet_config, require_topics
from engine.core.events import Decision
from engine.core.state import IntentSlot, SessionState
from engine.errors import EngineError, KafkaUnavailableError
from engine.runtime.tasks.state_codec import decode_state
from engine.settings import Settings
from engine.wire import Codec, DecodeError, RecordType
from engine.wire.partitioner import partition_for

READ_TIMEOUT_S = 30.0
"""How long reading one partition to its end may take once the brokers answered."""


def read_partition(
    settings: Settings,
    topic: str,
    partition: int,
    timeout_s: float = READ_TIMEOUT_S,
    *,
    idle: bool = False,
) -> Iterator[Message]:
    """Every committed record of one partition, from the beginning to the current end.

    Raises `KafkaUnavailableError` when the end is not reached within ``timeout_s``; with
    ``idle``, when no record arrives for ``timeout_s`` (a long partition that keeps coming in
    is read to its end).
    """
    consumer = Consumer(
        quiet_config(
            settings,
            **{
                "group.id": f"reconciler-cli-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            },
        )
    )
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                error = message.error()
                if error is None:
                    yield message
                    if idle:
                        deadline = time.monotonic() + timeout_s
                elif error.code() == KafkaError._PARTITION_EOF:
                    return
                else:
                    raise EngineError(
                        f"reading {topic}[{partition}] failed: {error}.",
                        "check the brokers and the topic name.",
                    )
    finally:
        consumer.close()
    within = f"with no record for {timeout_s:g} s" if idle else f"within {timeout_s:g} s"
    raise KafkaUnavailableError(
        f"reading {topic}[{partition}] did not reach its end {within}.",
        "check that the brokers are healthy, then run the command again.",
    )


def session_decisions(
    settings: Settings, session_id: str, codec: Codec, partitions: int
) -> list[Decision]:
    """Every decision about ``session_id``, in the order the engine published them."""
    partition = partition_for(session_id, partitions)
    decisions: list[Decision] = []
    for message in read_partition(settings, settings.topics.decisions, partition):
        if message.key() != session_id.encode():
            continue
        try:
            decision = codec.decode(RecordType.DECISION, message.value() or b"")
        except DecodeError:
            continue
        if isinstance(decision, Decision):
            decisions.append(decision)
    return decisions


def session_state(settings: Settings, session_id: str, partitions: int) -> SessionState | None:
    """The latest changelog state of ``session_id``, or None when it has none."""
    partition = partition_for(session_id, partitions)
    latest: bytes | None = None
    for message in read_partition(settings, settings.topics.changelog, partition):
        if message.key() == session_id.encode():
            latest = message.value()
    return decode_state(latest) if latest else None


def _slot_lines(slot: IntentSlot, state: SessionState) -> list[str]:
    binding = state.binding
    scheme = (
        f"{binding.digest_scheme}, ids {'ignored' if binding.ignore_ids else 'kept'}"
        if binding is not None
        else "unknown"
    )
    lines = [f"  digests of pending write {slot.intent_id} (scheme {scheme}, oldest first):"]
    if slot.before is None:
        lines.append("    before: not recorded (the append had not started)")
    else:
        lines.append("    before: " + (" ".join(slot.before) or "(empty Session)"))
    for facts in slot.items:
        call = f" call_id={facts.call_id}" if facts.call_id else ""
        lines.append(f"    batch:  {facts.digest} {facts.item_type}{call}")
    lines.append(
        "    compare with the Session tail's digests (schemas/SPEC.md): a tail ending in "
        "before + batch is committed, one ending in before is absent."
    )
    return lines


def render_explanation(
    session_id: str, decisions: list[Decision], state: SessionState | None
) -> str:
    """The text `reconciler explain` prints: current state, pending digests, then the trail."""
    lines = [f"session {session_id}"]
    if state is not None:
        slot = state.slot
        lines.append(
            f"  now: health={state.health}"
            + (f" ({state.health_reason})" if state.health_reason else "")
            + f", holder={state.holder or '-'}, fence={state.fence_token}"
            + (f", pending write {slot.intent_id} {slot.status}" if slot else ", no pending write")
        )
        if slot is not None:
            lines.extend(_slot_lines(slot, state))
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


def explain(settings: Settings, session_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """The decision trail of one session; `EngineError` within ``timeout_s`` when the brokers
    do not answer or the topics are missing."""
    topics = settings.topics
    counts = require_topics(settings, [topics.decisions, topics.changelog], timeout_s)
    return render_explanation(
        session_id,
        session_decisions(settings, session_id, Codec(), counts[topics.decisions]),
        session_state(settings, session_id, counts[topics.changelog]),
    )
