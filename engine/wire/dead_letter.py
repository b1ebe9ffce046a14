"""The dead-letter record: an input the engine refused, kept verbatim with the reason."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from engine.wire.errors import DecodeError, DecodeReason, SourcePosition


class DeadLetter(BaseModel):
    """One refused input. ``key`` and ``value`` are the original bytes, untouched.

    Invariant: it carries the original record's position, so an operator can replay or
    inspect it; ``reason`` is one of the stable `DecodeReason` codes.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )

    source_topic: str
    source_partition: int
    source_offset: int
    source_timestamp_ms: int | None = None
    key: bytes | None = None
    value: bytes | None = None
    reason: DecodeReason
    detail: str
    record_type: str | None = None

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
        return cls(
            source_topic=source.topic,
            source_partition=source.partition,
            source_offset=source.offset,
            source_timestamp_ms=timestamp_ms,
            key=key,
            value=value,
            reason=error.reason,
            detail=error.message,
            record_type=error.record_type,
        )
