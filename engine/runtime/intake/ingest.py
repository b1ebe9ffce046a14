"""Turn one consumed record into a validated event, or into a dead letter that says why.

Beyond the codec's checks, a record must be keyed by its session id and sit in the partition the
Java murmur2 partitioner gives that key: otherwise the session's records would be split across
tasks and no task would see all of its evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from confluent_kafka import Message

from engine.core.events import (
    AckEvent,
    AckOutcome,
    Event,
    IntentEvent,
    IntentKind,
    RepairEvent,
    ResumeEvent,
)
from engine.wire import Codec, DeadLetter, DecodeError, DecodeReason, RecordType, SourcePosition
from engine.wire.partitioner import partition_for
from engine.wire.topics import TopicNames


@dataclass(frozen=True)
class Rejected:
    """A record that goes to dead letters: the encoded dead letter and its reason."""

    reason: str
    payload: bytes


PLACEMENT_CACHE = 65_536
"""Session keys whose partition is remembered: a session's intent, ack and resume arrive close
together, and the pure-Python murmur2 costs ~4 us a key. Cleared whole when full (bounded)."""


# The metrics label of each kind of input, made once rather than per input.
INTENT_KINDS = {kind: f"intent_{kind.value.lower()}" for kind in IntentKind}
ACK_KINDS = {outcome: f"ack_{outcome.value.lower()}" for outcome in AckOutcome}
EVENT_TYPES = (IntentEvent, AckEvent, ResumeEvent, RepairEvent)
# Checked as `type(model) in`: the codec returns these classes exactly, and an isinstance that
# fails on a msgspec class goes through its metaclass (slow: an ack or a resume failed one or
# two of the tuple's classes before its own, once per input).
_EVENT_TYPES: frozenset[type] = frozenset(EVENT_TYPES)


class Ingest:
    def __init__(self, codec: Codec, topics: TopicNames, partitions: int) -> None:
        self.codec = codec
        self.partitions = partitions
        self._placement: dict[bytes, int] = {}
        # The intents topic also carries operator repair commands (schemas/SPEC.md, section 1).
        self.record_types: dict[str, tuple[RecordType, ...]] = {
            topics.intents: (RecordType.INTENT, RecordType.REPAIR),
            topics.acks: (RecordType.ACK,),
            topics.resumes: (RecordType.RESUME,),
        }

    def accept(self, message: Message, topic: str, partition: int, offset: int) -> Event | Rejected:
        """The event a consumed record holds, or its dead letter; the caller passes the
        record's position, which it has read already (an accessor call each)."""
        key, value = message.key(), message.value()
        try:
            kinds = self.record_types[topic]
            if len(kinds) == 1:
                model = self.codec.decode(kinds[0], value or b"")
                if type(model) not in _EVENT_TYPES:
                    raise self._no_such_record(topic)
                event = cast(Event, model)
            else:
                event = self._decode(topic, kinds, value or b"")
            # placement: keyed by its session id, in the partition murmur2 gives that key
            if key is None or key != event.session_id.encode():
                raise self._not_keyed(event, key)
            expected = self._placement.get(key)
            if expected != partition:
                if expected is None:
                    expected = self._place(key)
                if expected != partition:
                    raise self._misplaced(event, expected, partition)
        except DecodeError as error:
            # the position only now: building it for every record costs ~0.5 us
            source = SourcePosition(topic, partition, offset)
            return self._dead_letter(error.at(source), source, key, value, message)
        return event

    def failed(self, message: Message, cause: Exception) -> Rejected:
        """The dead letter of an input that decoded but could not be folded or encoded."""
        _, timestamp = message.timestamp()
        source = SourcePosition(
            message.topic() or "", message.partition() or 0, message.offset() or 0
        )
        letter = DeadLetter.from_exception(
            cause,
            source,
            key=message.key(),
            value=message.value(),
            timestamp_ms=timestamp if timestamp > 0 else None,
        )
        return Rejected(
            reason=DecodeReason.PROCESSING_FAILED.value, payload=self.codec.encode(letter)
        )

    @staticmethod
    def kind_of(event: Event) -> str:
        if type(event) is IntentEvent:
            return INTENT_KINDS[event.kind]
        if type(event) is AckEvent:
            return ACK_KINDS[event.outcome]
        if type(event) is ResumeEvent:
            return "resume"
        return "repair"

    def _decode(self, topic: str, kinds: tuple[RecordType, ...], value: bytes) -> Event:
        for kind in kinds:
            try:
                model = self.codec.decode(kind, value)
            except DecodeError as error:
                if error.reason is DecodeReason.WRONG_RECORD_TYPE and kind is not kinds[-1]:
                    continue
                raise
            if type(model) in _EVENT_TYPES:
                return cast(Event, model)
        raise self._no_such_record(topic)

    def _place(self, key: bytes) -> int:
        if len(self._placement) >= PLACEMENT_CACHE:
            self._placement.clear()
        placed = self._placement[key] = partition_for(key, self.partitions)
        return placed

    @staticmethod
    def _no_such_record(topic: str) -> DecodeError:
        return DecodeError(DecodeReason.WRONG_RECORD_TYPE, f"{topic} carries no such record")

    @staticmethod
    def _not_keyed(event: Event, key: bytes | None) -> DecodeError:
        return DecodeError(
            DecodeReason.INVALID_FIELDS,
            f"record key {key!r} is not the session id {event.session_id!r}; "
            "producers must key every record by its session id",
        )

    @staticmethod
    def _misplaced(event: Event, expected: int, partition: int) -> DecodeError:
        return DecodeError(
            DecodeReason.INVALID_FIELDS,
            f"session {event.session_id!r} belongs in partition {expected}, not "
            f"{partition}; producers must use the murmur2 partitioner",
        )

    def _dead_letter(
        self,
        error: DecodeError,
        source: SourcePosition,
        key: bytes | None,
        value: bytes | None,
        message: Message,
    ) -> Rejected:
        _, timestamp = message.timestamp()
        letter = DeadLetter.from_error(
            error, source, key=key, value=value, timestamp_ms=timestamp if timestamp > 0 else None
        )
        return Rejected(reason=error.reason.value, payload=self.codec.encode(letter))
