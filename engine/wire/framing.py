"""The two byte framings around an Avro body, and how each finds the writer schema.

* Single-object encoding (the default, no registry needed): ``C3 01``, the writer schema's
  8-byte CRC-64-AVRO fingerprint (little-endian), then the body. The writer schema is looked up
  among the shipped schemas by fingerprint.
* Confluent Schema Registry wire format: ``00``, a 4-byte big-endian schema id, then the body.
  The writer schema is fetched by id and must be one of the shipped schemas (same canonical
  form), so a registry never lets an unreviewed schema onto our topics.
"""

from __future__ import annotations

from typing import Protocol

from engine.wire.errors import DecodeError, DecodeReason
from engine.wire.schema_store import SchemaStore, ShippedSchema

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
SINGLE_OBJECT_HEADER_SIZE = len(SINGLE_OBJECT_MAGIC) + 8
CONFLUENT_MAGIC = b"\x00"
CONFLUENT_HEADER_SIZE = len(CONFLUENT_MAGIC) + 4


class Framing(Protocol):
    """How a codec puts the writer schema's identity in front of the Avro body."""

    def header_for(self, schema: ShippedSchema) -> bytes:
        """The bytes that precede a body written with ``schema``."""
        ...

    def split(self, data: bytes) -> tuple[ShippedSchema, memoryview]:
        """The writer schema and the body, or `DecodeError` (without a source position)."""
        ...


class SingleObjectFraming:
    """Avro single-object encoding, resolved against the shipped schemas."""

    def __init__(self, store: SchemaStore) -> None:
        self._store = store

    def header_for(self, schema: ShippedSchema) -> bytes:
        """``C3 01`` followed by the schema's 8-byte fingerprint."""
        return SINGLE_OBJECT_MAGIC + schema.fingerprint

    def split(self, data: bytes) -> tuple[ShippedSchema, memoryview]:
        """The writer schema named by the fingerprint and the body; `DecodeError` otherwise."""
        if data[:2] != SINGLE_OBJECT_MAGIC[: len(data[:2])]:
            raise DecodeError(
                DecodeReason.BAD_MAGIC,
                f"expected single-object marker C3 01, got {data[:2].hex(' ').upper()}",
            )
        if len(data) < SINGLE_OBJECT_HEADER_SIZE:
            raise DecodeError(
                DecodeReason.TRUNCATED,
                f"{len(data)} bytes is shorter than the {SINGLE_OBJECT_HEADER_SIZE}-byte header",
            )
        fingerprint = bytes(data[2:SINGLE_OBJECT_HEADER_SIZE])
        writer = self._store.by_fingerprint.get(fingerprint)
        if writer is None:
            raise DecodeError(
                DecodeReason.UNKNOWN_SCHEMA,
                f"schema fingerprint {fingerprint.hex()} is not one of the shipped schema "
                "versions; the producer uses a schema this engine does not support",
            )
        return writer, memoryview(data)[SINGLE_OBJECT_HEADER_SIZE:]
