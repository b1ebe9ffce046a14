"""Ingest.accept (engine/runtime/intake/ingest.py), without Kafka: a consumed record becomes its
event, or a dead letter whose reason and position say why, for each check it makes beyond the
codec."""

from __future__ import annotations

from confluent_kafka import Message

from engine.core.events import AckOutcome, Event, RepairResolution
from engine.runtime.intake.ingest import Ingest, Rejected
from engine.settings import load_settings
from engine.wire import Codec, DeadLetter, RecordType
from engine.wire.partitioner import partition_for
from tests.unit.core.builders import SID, ack, intent, msg, repair

PARTITIONS = 6
CODEC = Codec()
TOPICS = load_settings(environ={}, bootstrap_servers="127.0.0.1:1").topics
HOME = partition_for(SID.encode(), PARTITIONS)


def _accept(
    topic: str,
    value: bytes | None,
    *,
    key: bytes | None = SID.encode(),
    partition: int = HOME,
    offset: int = 7,
) -> Event | Rejected:
    message = Message(
        topic=topic, partition=partition, offset=offset, key=key, value=value, timestamp=(1, 99)
    )
    return Ingest(CODEC, TOPICS, PARTITIONS).accept(message, topic, partition, offset)


def _letter(outcome: Event | Rejected) -> DeadLetter:
    assert isinstance(outcome, Rejected), outcome
    letter = CODEC.decode(RecordType.DEAD_LETTER, outcome.payload)
    assert letter.reason == outcome.reason
    return letter


def test_a_record_keyed_and_placed_right_becomes_its_event() -> None:
    event = ack("a1", AckOutcome.UNKNOWN)
    assert _accept(TOPICS.acks, CODEC.encode(event)) == event


def test_the_intents_topic_carries_repairs_too_but_nothing_else() -> None:
    command = repair("r1", RepairResolution.ACCEPT_COMMITTED)
    assert _accept(TOPICS.intents, CODEC.encode(command)) == command
    registered = intent("e1", [msg("hi")], [])
    assert _accept(TOPICS.intents, CODEC.encode(registered)) == registered
    letter = _letter(_accept(TOPICS.intents, CODEC.encode(ack("a1", AckOutcome.UNKNOWN))))
    assert letter.reason == "WRONG_RECORD_TYPE"
    letter = _letter(_accept(TOPICS.acks, CODEC.encode(command)))
    assert letter.reason == "WRONG_RECORD_TYPE"


def test_a_record_not_keyed_by_its_session_is_a_dead_letter_at_its_position() -> None:
    value = CODEC.encode(ack("a1", AckOutcome.UNKNOWN))
    for key in (None, b"s2"):
        letter = _letter(_accept(TOPICS.acks, value, key=key, offset=11))
        assert letter.reason == "INVALID_FIELDS"
        assert "key every record by its session id" in letter.detail
        assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
            TOPICS.acks,
            HOME,
            11,
        )


def test_a_record_in_another_partition_than_murmur2_gives_is_a_dead_letter() -> None:
    other = (HOME + 1) % PARTITIONS
    letter = _letter(
        _accept(TOPICS.acks, CODEC.encode(ack("a1", AckOutcome.UNKNOWN)), partition=other)
    )
    assert letter.reason == "INVALID_FIELDS"
    assert f"belongs in partition {HOME}, not {other}" in letter.detail
    assert (letter.source_partition, letter.source_offset) == (other, 7)


def test_an_empty_or_damaged_value_is_a_dead_letter_with_the_codecs_reason() -> None:
    assert _letter(_accept(TOPICS.resumes, None)).reason == "EMPTY"
    assert _letter(_accept(TOPICS.resumes, b"")).reason == "EMPTY"
    assert _letter(_accept(TOPICS.resumes, b"\x07junk")).reason == "BAD_MAGIC"
