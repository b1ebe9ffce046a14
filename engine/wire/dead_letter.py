"""The dead-letter record: an input the engine refused, with a bounded excerpt and the reason.

A dead letter quotes at most `EXCERPT_BYTES` of the key and of the value, with the whole
original's length and SHA-256: a 3 MB record (accepted by the broker when compressed) must not
produce a dead letter the producer refuses, and the original stays findable by its position.
"""

from __future__ import annotations

import hashlib

from msgspec import Struct

from engine.wire.errors import DecodeError, DecodeReason, SourcePosition

EXCERPT_BYTES = 1024
DETAIL_CHARS = 1000


class DeadLetter(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One refused input.

    Invariant: it carries the original record's position, so an operator can replay or
    inspect it; ``reason`` is one of the stable `DecodeReason` codes; ``key`` and ``value`` are
    the first bytes of the originals, cut only when ``truncated`` says so.
    """

    source_topic: str
    source_partition: int
    source_offset: int
    source_timestamp_ms: int | None = None
    key: bytes | None = None
    value: bytes | None = None
    reason: DecodeReason
    detail: str
    record_type: str | None = None
    key_length: int | None = None
    key_sha256: str | None = None
    value_length: int | None = None
    value_sha256: str | None = None
    truncated: bool = False

    @classmethod
    def quoting(
        cls,
        source: SourcePosition,
        reason: DecodeReason,
        detail: str,
        *,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None = None,
        record_type: str | None = None,
    ) -> DeadLetter:
        """The dead letter for the record at ``source``, whatever its size."""
        return cls(
            source_topic=source.topic,
            source_partition=source.partition,
            source_offset=source.offset,
            source_timestamp_ms=timestamp_ms,
            key=None if key is None else key[:EXCERPT_BYTES],
            value=None if value is None else value[:EXCERPT_BYTES],
            reason=reason,
            detail=detail[:DETAIL_CHARS],
            record_type=record_type,
            key_length=None if key is None else len(key),
            key_sha256=None if key is None else hashlib.sha256(key).hexdigest(),
            value_length=None if value is None else len(value),
            value_sha256=None if value is None else hashlib.sha256(value).hexdigest(),
            truncated=len(key or b"") > EXCERPT_BYTES or len(value or b"") > EXCERPT_BYTES,
        )

    @classmethod
    def from_error(
        cls,
        error: DecodeError,
        source: SourcePosition,
        *,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None = None,
    ) -> DeadLetter:
        """The dead letter for a record that failed to decode at ``source``."""
        return cls.quoting(
            source,
            error.reason,
            error.message,
            key=key,
            value=value,
            timestamp_ms=timestamp_ms,
            record_type=error.record_type,
        )

    @classmethod
    def from_exception(
        cls,
        error: Exception,
        source: SourcePosition,
        *,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None = None,
    ) -> DeadLetter:
        """The dead letter for a record that decoded but could not be folded or encoded."""
        return cls.quoting(
            source,
            DecodeReason.PROCESSING_FAILED,
            f"{type(error).__name__}: {error}",
            key=key,
            value=value,
            timestamp_ms=timestamp_ms,
        )
