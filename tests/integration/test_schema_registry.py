"""A real Schema Registry (Apicurio 3.3.3, Confluent-compatible API; tools/registry_local.py):
records serialised by confluent-kafka's own AvroSerializer get decisions, single-object and
registry-framed producers share the topics, and an incompatible schema change is refused by
the registry, so it never reaches the engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext
from msgspec.structs import replace

from engine.core.events import AckOutcome, Event, Reason, Verdict
from engine.wire import POLICY, RECORD_TYPE_OF, SHIPPED_SCHEMAS
from engine.wire.values import to_record
from tests.integration.engine_harness import (
    engine_settings,
    engine_thread,
    produce,
    read_decisions,
)
from tests.unit.core.builders import ack, call, intent, msg, out, record, resume
from tools import registry_local

pytestmark = pytest.mark.kafka

U, C, OUT = msg("charge 7"), call("charge-1"), out("charge-1")


@pytest.fixture(scope="module")
def registry_url() -> Iterator[str]:
    try:
        info = registry_local.start("pytest")
    except registry_local.RegistryError as exc:
        pytest.fail(f"could not start the schema registry: {exc}")
    try:
        yield info.url
    finally:
        registry_local.stop("pytest")


def lost_ack(sid: str) -> list[Event]:
    """intent, unknown ack, resume whose tail shows the batch: CONTINUE / COMMITTED."""
    return [
        replace(e, session_id=sid, event_id=f"{sid}/{e.event_id}")
        for e in (
            intent("e1", [OUT], [U, C]),
            ack("e2", AckOutcome.UNKNOWN),
            resume("e3", record([OUT], [U, C]), [U, C, OUT]),
        )
    ]


def _record_subject(ctx: Any, record_name: str | None) -> str | None:
    return record_name  # RecordNameStrategy, as the engine's RegistryFraming uses


def produce_with_avro_serializer(
    bootstrap: str, url: str, settings: Any, events: list[Event]
) -> None:
    """Serialise with confluent-kafka's AvroSerializer (registry framing, auto-registered)."""
    client = SchemaRegistryClient({"url": url})
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for event in events:
        schema = SHIPPED_SCHEMAS.current(RECORD_TYPE_OF[type(event)])
        serializer = AvroSerializer(
            client,
            json.dumps(dict(schema.source)),
            conf={"subject.name.strategy": _record_subject},
        )
        topic = settings.topics.topic_for(event)
        value = serializer(to_record(event), SerializationContext(topic, MessageField.VALUE))
        assert value is not None
        assert value[:1] == b"\x00"  # Confluent framing, not ours
        producer.produce(topic, key=event.session_id.encode(), value=value)
    assert producer.flush(30) == 0


def test_avro_serializer_records_and_single_object_records_get_decisions(
    kafka_bootstrap: str, registry_url: str, unique_name: str, tmp_path: Path
) -> None:
    settings = engine_settings(
        kafka_bootstrap, unique_name, tmp_path / "state", schema_registry_url=registry_url
    )
    framed, plain = lost_ack(f"{unique_name}-framed"), lost_ack(f"{unique_name}-plain")
    with engine_thread(settings):
        produce_with_avro_serializer(kafka_bootstrap, registry_url, settings, framed)
        produce(kafka_bootstrap, settings, plain)  # single-object, same topics
        seen = read_decisions(kafka_bootstrap, settings, until=6, timeout_s=90)
    finals = {
        s.decision.in_reply_to: s.decision
        for s in seen
        if s.decision.verdict is not Verdict.DEFERRED
    }
    for events in (framed, plain):
        decision = finals[events[-1].event_id]
        assert (decision.verdict, decision.reason) == (Verdict.CONTINUE, Reason.COMMITTED)


def test_an_incompatible_schema_change_is_refused_by_the_registry(registry_url: str) -> None:
    client = SchemaRegistryClient({"url": registry_url})
    intent_schema = SHIPPED_SCHEMAS.current(RECORD_TYPE_OF[type(intent("e1", [OUT], [U, C]))])
    subject = POLICY[intent_schema.record_type].full_name
    client.register_schema(subject, Schema(json.dumps(dict(intent_schema.source)), "AVRO"))
    # A new required field without a default: readers of the new schema cannot read old data.
    changed = dict(intent_schema.source)
    changed["fields"] = [*changed["fields"], {"name": "tenant", "type": "string"}]
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(changed), "AVRO"))
    assert refused.value.http_status_code == 409
    # So no producer can frame a record with it: AvroSerializer fails before producing.
    serializer = AvroSerializer(
        client, json.dumps(changed), conf={"subject.name.strategy": _record_subject}
    )
    with pytest.raises(SchemaRegistryError):
        serializer({}, SerializationContext("any", MessageField.VALUE))
