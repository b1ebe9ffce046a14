"""Codec behaviour beyond the corpus: framings, limits, positions, schema evolution."""

from __future__ import annotations

import io
import json
import shutil
import typing
from pathlib import Path
from types import MappingProxyType
from typing import Any

import fastavro
import pytest

from engine.core.events import Binding, IntentEvent, IntentKind, ItemFacts
from engine.wire import (
    MODEL_OF,
    POLICY,
    SHIPPED_SCHEMAS,
    Codec,
    DeadLetter,
    DecodeError,
    DecodeReason,
    RecordPolicy,
    RecordType,
    RegistryFraming,
    SourcePosition,
    WireLimits,
)
from engine.wire.codec import UNRECOGNIZED_SYMBOL
from engine.wire.raw_digests import convert, has_raw_digests, hex_to_raw
from engine.wire.schema_store import load_shipped_schemas, shipped_schema_root
from engine.wire.values import from_json, to_json_record, to_record

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "wire"
POSITION = SourcePosition("reconciler.intents", 3, 1234)


def _fixture_model(record_type: RecordType, variant: str = "full") -> Any:
    text = (CORPUS / record_type.value / "v1" / f"{variant}.json").read_text()
    return from_json(MODEL_OF[record_type], text)


def _intent(n_items: int = 2, **changes: Any) -> IntentEvent:
    fields: dict[str, Any] = {
        "event_id": "e",
        "session_id": "s",
        "event_time_ms": 5,
        "kind": IntentKind.REGISTER,
        "intent_id": "i",
        "runner_id": "r",
        "binding": Binding(backend_id="b", namespace="n"),
        "items": [ItemFacts(digest=f"{n:064x}", item_type="message") for n in range(n_items)],
        "sequence": 1,
    }
    fields.update(changes)
    return IntentEvent(**fields)


@pytest.mark.parametrize("record_type", list(RecordType))
def test_single_object_round_trip(record_type: RecordType) -> None:
    model = _fixture_model(record_type)
    data = Codec().encode(model)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == SHIPPED_SCHEMAS.current(record_type).fingerprint
    assert Codec().decode(record_type, data) == model


def test_fingerprint_bytes_follow_the_avro_spec_test_vector() -> None:
    """The spec gives fingerprint64("null") = 7195948357588979594 as a little-endian long."""
    canonical = fastavro.schema.to_parsing_canonical_form("null")
    digest = bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))
    assert int.from_bytes(digest, "little") == 7195948357588979594


@pytest.mark.parametrize("record_type", list(RecordType))
def test_registry_round_trip_through_the_mock_registry(record_type: RecordType) -> None:
    """No real registry exists here: this uses confluent-kafka's own ``mock://`` client."""
    codec = Codec(framing=RegistryFraming.from_url(SHIPPED_SCHEMAS, "mock://wire-tests"))
    model = _fixture_model(record_type)
    data = codec.encode(model)
    assert data[:1] == b"\x00"
    assert codec.decode(record_type, data) == model


def test_registry_reader_sees_schema_registered_by_another_writer() -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient.new_client({"url": "mock://shared"})
    writer = Codec(framing=RegistryFraming(SHIPPED_SCHEMAS, client))
    reader = Codec(framing=RegistryFraming(SHIPPED_SCHEMAS, client, register=False))
    model = _fixture_model(RecordType.ACK)
    assert reader.decode(RecordType.ACK, writer.encode(model)) == model


def test_confluent_serializer_bytes_decode_with_our_registry_framing() -> None:
    """Bytes from confluent-kafka's own AvroSerializer: an independent writer of the format."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient.new_client({"url": "mock://confluent-writer"})
    shipped = SHIPPED_SCHEMAS.current(RecordType.REPAIR)
    serializer = AvroSerializer(client, json.dumps(dict(shipped.source)))
    model = _fixture_model(RecordType.REPAIR)
    context = SerializationContext("reconciler.intents", MessageField.VALUE)
    data = serializer(to_json_record(model), context)
    codec = Codec(framing=RegistryFraming(SHIPPED_SCHEMAS, client, register=False))
    assert codec.decode(RecordType.REPAIR, data) == model


def test_registry_holds_the_full_schema_text_with_docs_and_defaults() -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient.new_client({"url": "mock://full-text"})
    data = Codec(framing=RegistryFraming(SHIPPED_SCHEMAS, client)).encode(_intent())
    schema_text = client.get_schema(int.from_bytes(data[1:5], "big")).schema_str
    assert schema_text is not None
    assert json.loads(schema_text) == dict(SHIPPED_SCHEMAS.current(RecordType.INTENT).source)


def test_registry_id_unknown_to_the_registry_is_unknown_schema() -> None:
    codec = Codec(framing=RegistryFraming.from_url(SHIPPED_SCHEMAS, "mock://empty"))
    with pytest.raises(DecodeError) as caught:
        codec.decode(RecordType.ACK, b"\x00\x00\x00\x00\x63\x02")
    assert caught.value.reason is DecodeReason.UNKNOWN_SCHEMA


def test_registry_schema_that_is_not_shipped_is_unknown_schema() -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient.new_client({"url": "mock://foreign"})
    foreign = '{"type":"record","name":"io.reconciler.Ack","fields":[]}'
    schema_id = client.register_schema("io.reconciler.Ack", Schema(foreign, "AVRO"))
    codec = Codec(framing=RegistryFraming(SHIPPED_SCHEMAS, client))
    with pytest.raises(DecodeError) as caught:
        codec.decode(RecordType.ACK, b"\x00" + schema_id.to_bytes(4, "big"))
    assert caught.value.reason is DecodeReason.UNKNOWN_SCHEMA


def test_single_object_bytes_are_bad_magic_for_the_registry_framing() -> None:
    data = Codec().encode(_intent())
    codec = Codec(framing=RegistryFraming.from_url(SHIPPED_SCHEMAS, "mock://magic"))
    with pytest.raises(DecodeError) as caught:
        codec.decode(RecordType.INTENT, data)
    assert caught.value.reason is DecodeReason.BAD_MAGIC


def test_error_carries_source_position_and_record_type() -> None:
    with pytest.raises(DecodeError) as caught:
        Codec().decode(RecordType.INTENT, b"\xc3\x01\x00", source=POSITION)
    error = caught.value
    assert (error.reason, error.source, error.record_type) == (
        DecodeReason.TRUNCATED,
        POSITION,
        "intent",
    )
    assert "reconciler.intents[3]@1234" in str(error)


def test_dead_letter_from_error_keeps_the_raw_bytes() -> None:
    raw = b"\xc3\x01junk"
    with pytest.raises(DecodeError) as caught:
        Codec().decode(RecordType.INTENT, raw, source=POSITION)
    letter = DeadLetter.from_error(caught.value, POSITION, key=b"s-1", value=raw)
    decoded = Codec().decode(RecordType.DEAD_LETTER, Codec().encode(letter))
    assert (decoded.value, decoded.reason, decoded.source_offset) == (
        raw,
        caught.value.reason,
        1234,
    )


@pytest.mark.parametrize(
    ("limits", "model"),
    [
        (WireLimits(max_items_per_batch=3), _intent(n_items=4)),
        (WireLimits(max_digests_per_tail=1), _intent(before=["a" * 64, "b" * 64])),
        (WireLimits(max_string_length=8), _intent(runner_id="r" * 9)),
    ],
)
def test_configured_limits_refuse_oversized_records(limits: WireLimits, model: IntentEvent) -> None:
    data = Codec().encode(model)
    assert Codec().decode(RecordType.INTENT, data) == model
    with pytest.raises(DecodeError) as caught:
        Codec(limits=limits).decode(RecordType.INTENT, data)
    assert caught.value.reason is DecodeReason.LIMIT_EXCEEDED


def test_record_bytes_cap_is_checked_before_parsing() -> None:
    data = Codec().encode(_intent(n_items=10))
    with pytest.raises(DecodeError) as caught:
        Codec(limits=WireLimits(max_record_bytes=len(data) - 1)).decode(RecordType.INTENT, data)
    assert caught.value.reason is DecodeReason.OVERSIZE


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_items_per_batch"):
        WireLimits(max_items_per_batch=0)


@pytest.mark.parametrize(
    "changes",
    [
        {"kind": IntentKind.HELD, "before": ["a" * 64]},
        {"items": []},
        {"sequence": -1},
        {"event_id": "  "},
        {"binding": Binding(backend_id="b", namespace="n", chunk_size=0)},
    ],
)
def test_range_and_shape_rules_are_invalid_fields(changes: dict[str, Any]) -> None:
    data = Codec().encode(_intent(**changes))
    with pytest.raises(DecodeError) as caught:
        Codec().decode(RecordType.INTENT, data)
    assert caught.value.reason is DecodeReason.INVALID_FIELDS


def test_forged_huge_lengths_fail_fast_without_allocating() -> None:
    """A string or array length of 2**62 ends in a short read, not a giant allocation."""
    schema = SHIPPED_SCHEMAS.current(RecordType.INTENT)
    header = Codec().framing.header_for(schema)
    huge = b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f"  # zigzag varint of a huge positive long
    for data in (header + huge, header + b"\x02e\x02s\x0a\x00\x02i\x02r\x00\x02b\x02n" + huge):
        with pytest.raises(DecodeError) as caught:
            Codec().decode(RecordType.INTENT, data)
        assert caught.value.reason in (DecodeReason.TRUNCATED, DecodeReason.MALFORMED_BODY)


# --- schema evolution: a next version shipped next to the current, as a release would ----

NEXT = POLICY[RecordType.INTENT].current + 1

V2_INTENT_EXTRA = {
    "name": "origin",
    "type": "string",
    "default": "runner",
    "doc": "Test-only v2 field: who produced the intent.",
}


@pytest.fixture
def evolved_store(tmp_path: Path) -> Any:
    root = Path(str(shipped_schema_root()))
    for path in root.glob("*.avsc"):
        shutil.copy(path, tmp_path / path.name)
    old = POLICY[RecordType.INTENT]
    source = json.loads((root / f"intent.v{old.current}.avsc").read_text())
    source["fields"].append(V2_INTENT_EXTRA)
    kind = next(f for f in source["fields"] if f["name"] == "kind")
    kind["type"]["symbols"].insert(-1, "SPLIT")
    (tmp_path / f"intent.v{NEXT}.avsc").write_text(json.dumps(source))
    policy = dict(POLICY)
    policy[RecordType.INTENT] = RecordPolicy(
        old.record_name, NEXT, MappingProxyType({**old.supported, NEXT: "test: origin, SPLIT"})
    )
    return load_shipped_schemas(tmp_path, MappingProxyType(policy))


def test_old_writer_is_resolved_to_the_new_reader(evolved_store: Any) -> None:
    """A v1 producer keeps working after the reader moves to v2 (new field has a default)."""
    v1_bytes = (CORPUS / "intent" / "v1" / "full.avro").read_bytes()
    record = Codec(store=evolved_store).decode_record(RecordType.INTENT, v1_bytes)
    assert record["origin"] == "runner"
    assert record["intent_id"] == _fixture_model(RecordType.INTENT).intent_id


def test_old_reader_maps_a_newer_enum_symbol_to_unrecognized(evolved_store: Any) -> None:
    """Other consumers on v1 survive a v2 symbol: they read the enum default and refuse it."""
    v2 = evolved_store.get(RecordType.INTENT, NEXT)
    record = {**to_record(_intent()), "kind": "SPLIT", "origin": "store"}
    body = io.BytesIO()
    fastavro.schemaless_writer(body, v2.parsed, record)
    v1 = SHIPPED_SCHEMAS.current(RecordType.INTENT)
    body.seek(0)
    resolved = typing.cast(dict[str, Any], fastavro.schemaless_reader(body, v2.parsed, v1.parsed))
    assert resolved["kind"] == UNRECOGNIZED_SYMBOL
    with pytest.raises(DecodeError) as caught:
        Codec().decode(RecordType.INTENT, Codec().encode_record(v1, resolved))
    assert caught.value.reason is DecodeReason.UNKNOWN_ENUM_SYMBOL


def test_current_engine_refuses_a_version_it_does_not_ship(evolved_store: Any) -> None:
    v2 = evolved_store.get(RecordType.INTENT, NEXT)
    record = {**to_record(_intent()), "origin": "store"}
    data = Codec(store=evolved_store).encode_record(v2, record)
    with pytest.raises(DecodeError) as caught:
        Codec().decode(RecordType.INTENT, data)
    assert caught.value.reason is DecodeReason.UNKNOWN_SCHEMA


@pytest.mark.parametrize("record_type", list(RecordType))
def test_encode_writes_the_bytes_of_a_plain_fastavro_write(record_type: RecordType) -> None:
    # The codec names union branches for fastavro (a speed-up): the bytes must not change.
    # Digests go in as the raw bytes a schema with the fixed Sha256 type stores (state v3).
    codec = Codec()
    model = _fixture_model(record_type)
    schema = SHIPPED_SCHEMAS.current(record_type)
    body = io.BytesIO()
    record = to_record(model)
    if has_raw_digests(schema.source):
        record = convert(schema.source, record, hex_to_raw)
    fastavro.schemaless_writer(body, schema.parsed, record, strict=True)
    assert codec.encode(model) == codec.framing.header_for(schema) + body.getvalue()
