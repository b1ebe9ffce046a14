"""Confluent Schema Registry framing, through confluent-kafka's schema-registry client.

The client is imported lazily, inside `RegistryFraming`, so importing ``engine.wire`` never
pulls in the registry client (or its HTTP stack); consumers of the runner library that use
single-object encoding do not need it installed. Subjects follow the RecordNameStrategy
(the record's full name, e.g. ``io.reconciler.Intent``) because one codec serves every topic.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from engine.wire.errors import DecodeError, DecodeReason, WireError
from engine.wire.framing import (
    CONFLUENT_HEADER_SIZE,
    CONFLUENT_MAGIC,
    Framing,
    SingleObjectFraming,
)
from engine.wire.policy import POLICY
from engine.wire.schema_store import SHIPPED_SCHEMAS, SchemaStore, ShippedSchema

if TYPE_CHECKING:
    from engine.wire.codec import Codec


class RegistryUnavailableError(WireError):
    """The registry could not be reached or answered with a server error.

    Not a `DecodeError`: the record may be fine, so the runtime should retry rather than
    dead-letter it. Check the registry URL and credentials.
    """


class RegistryFraming:
    """Confluent wire format: magic byte 0, 4-byte big-endian schema id, Avro body.

    ``client`` is a ``confluent_kafka.schema_registry.SchemaRegistryClient``; build one with
    `RegistryFraming.from_url` (``mock://...`` URLs give the library's in-memory mock, which is
    what the unit tests use; tests/integration/test_schema_registry.py runs a real one).
    """

    def __init__(self, store: SchemaStore, client: Any, *, register: bool = True) -> None:
        self._store = store
        self._client = client
        self._register = register
        self._ids: dict[bytes, int] = {}
        self._writers: dict[int, ShippedSchema] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, store: SchemaStore, url: str, **conf: Any) -> RegistryFraming:
        """A framing backed by the Schema Registry at ``url`` (``conf``: more client settings,
        e.g. basic auth)."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        return cls(store, SchemaRegistryClient.new_client({"url": url, **conf}))

    def header_for(self, schema: ShippedSchema) -> bytes:
        """``00`` and the registry's 4-byte id of ``schema`` (looked up or registered once)."""
        with self._lock:
            schema_id = self._ids.get(schema.fingerprint)
        if schema_id is None:
            schema_id = self._lookup_id(schema)
            with self._lock:
                self._ids[schema.fingerprint] = schema_id
                self._writers[schema_id] = schema
        return CONFLUENT_MAGIC + schema_id.to_bytes(4, "big")

    def _lookup_id(self, schema: ShippedSchema) -> int:
        from confluent_kafka.schema_registry import Schema

        subject = POLICY[schema.record_type].full_name
        # The full text, not the canonical form: other registry clients need the docs and the
        # field defaults for their own schema resolution. Decoding compares canonical forms.
        registry_schema = Schema(json.dumps(dict(schema.source)), "AVRO")
        try:
            if self._register:
                return int(self._client.register_schema(subject, registry_schema))
            return int(self._client.lookup_schema(subject, registry_schema).schema_id)
        except Exception as exc:
            raise RegistryUnavailableError(
                f"cannot register or look up {schema.file_name} under subject {subject}: {exc}"
            ) from exc

    def split(self, data: bytes) -> tuple[ShippedSchema, memoryview]:
        """The writer schema the id names (a shipped version, or `DecodeError`) and the body."""
        if data[:1] != CONFLUENT_MAGIC:
            raise DecodeError(
                DecodeReason.BAD_MAGIC,
                f"expected Confluent magic byte 00, got {data[:1].hex().upper()}",
            )
        if len(data) < CONFLUENT_HEADER_SIZE:
            raise DecodeError(
                DecodeReason.TRUNCATED,
                f"{len(data)} bytes is shorter than the {CONFLUENT_HEADER_SIZE}-byte header",
            )
        schema_id = int.from_bytes(data[1:CONFLUENT_HEADER_SIZE], "big")
        with self._lock:
            writer = self._writers.get(schema_id)
        if writer is None:
            writer = self._resolve_id(schema_id)
            with self._lock:
                self._writers[schema_id] = writer
        return writer, memoryview(data)[CONFLUENT_HEADER_SIZE:]

    def _resolve_id(self, schema_id: int) -> ShippedSchema:
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from fastavro.schema import fingerprint, to_parsing_canonical_form

        from engine.wire.schema_store import SINGLE_OBJECT_FINGERPRINT, parse_json_schema

        try:
            registered = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise DecodeError(
                    DecodeReason.UNKNOWN_SCHEMA, f"schema id {schema_id} is not in the registry"
                ) from exc
            raise RegistryUnavailableError(f"registry lookup of id {schema_id}: {exc}") from exc
        except Exception as exc:
            raise RegistryUnavailableError(f"registry lookup of id {schema_id}: {exc}") from exc
        try:
            canonical = to_parsing_canonical_form(parse_json_schema(registered.schema_str))
        except Exception as exc:
            raise DecodeError(
                DecodeReason.UNKNOWN_SCHEMA, f"schema id {schema_id} is not a valid Avro schema"
            ) from exc
        writer = self._store.by_fingerprint.get(
            bytes.fromhex(fingerprint(canonical, SINGLE_OBJECT_FINGERPRINT))
        )
        if writer is None:
            raise DecodeError(
                DecodeReason.UNKNOWN_SCHEMA,
                f"schema id {schema_id} is not one of the shipped schema versions; "
                "only schemas from this release's schemas/ folder are accepted",
            )
        return writer


class MixedFraming:
    """Reads both framings, so single-object and registry-framed producers can share topics
    (the first byte tells them apart: 00 is Confluent's magic, C3 starts single-object), and
    writes one of them: registry framing for a runner configured with a registry, single-object
    for the engine's own records (decisions, dead letters), which every runner can read."""

    def __init__(self, single: Framing, registry: RegistryFraming, *, write_registry: bool) -> None:
        self._single = single
        self._registry = registry
        self._writer: Framing = registry if write_registry else single

    def header_for(self, schema: ShippedSchema) -> bytes:
        """The header of the framing this side writes."""
        return self._writer.header_for(schema)

    def split(self, data: bytes) -> tuple[ShippedSchema, memoryview]:
        """The writer schema and the body, by whichever framing the first byte names."""
        reader: Framing = self._registry if data[:1] == CONFLUENT_MAGIC else self._single
        return reader.split(data)


def codec_for(registry_url: str | None, *, write_registry: bool) -> Codec:
    """The codec of `reconciler run` (write_registry=False) or of a runner client
    (write_registry=True): single-object only without a registry URL."""
    from engine.wire.codec import Codec

    if not registry_url:
        return Codec()
    store = SHIPPED_SCHEMAS
    registry = RegistryFraming.from_url(store, registry_url)
    framing = MixedFraming(SingleObjectFraming(store), registry, write_registry=write_registry)
    return Codec(framing=framing, store=store)
