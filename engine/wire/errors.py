"""The one exception family of the wire package.

Every failure to turn bytes into a validated event is a `DecodeError`; the runtime catches
exactly that type and writes a dead letter. Nothing else may escape `decode` for bad input
(the fuzz tests in ``tests/unit/wire`` hold the codec to this).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DecodeReason(StrEnum):
    """Why a record was refused. Stable names: they appear in dead letters and metrics."""

    EMPTY = "EMPTY"
    OVERSIZE = "OVERSIZE"
    BAD_MAGIC = "BAD_MAGIC"
    TRUNCATED = "TRUNCATED"
    UNKNOWN_SCHEMA = "UNKNOWN_SCHEMA"
    WRONG_RECORD_TYPE = "WRONG_RECORD_TYPE"
    MALFORMED_BODY = "MALFORMED_BODY"
    TRAILING_BYTES = "TRAILING_BYTES"
    UNKNOWN_ENUM_SYMBOL = "UNKNOWN_ENUM_SYMBOL"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    INVALID_FIELDS = "INVALID_FIELDS"
    REGISTRY_UNAVAILABLE = "REGISTRY_UNAVAILABLE"
    INVALID_CHECKPOINT = "INVALID_CHECKPOINT"
    PROCESSING_FAILED = "PROCESSING_FAILED"  # decoded, but folding or encoding it raised


@dataclass(frozen=True, slots=True)
class SourcePosition:
    """Where a record came from, so an operator can find the original bytes."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


class WireError(Exception):
    """Root of every error raised by ``engine.wire``."""


class SchemaPolicyError(WireError):
    """The shipped ``.avsc`` files disagree with the version policy in ``engine.wire.policy``.

    Raised at import time: a build that ships the wrong schema files must not start.
    """


class EncodeError(WireError):
    """A model could not be encoded (a bug in the caller or a schema/model mismatch)."""


class DecodeError(WireError):
    """Bytes that could not become a validated event.

    Carries a stable ``reason`` code, the source position when known, and a short message
    for the operator. The runtime dead-letters the record and keeps going.
    """

    def __init__(
        self,
        reason: DecodeReason,
        message: str,
        *,
        source: SourcePosition | None = None,
        record_type: str | None = None,
    ) -> None:
        self.reason = reason
        self.message = message
        self.source = source
        self.record_type = record_type
        super().__init__(self._render())

    def _render(self) -> str:
        where = f" at {self.source}" if self.source is not None else ""
        what = f" {self.record_type}" if self.record_type is not None else ""
        return f"[{self.reason}] cannot decode{what} record{where}: {self.message}"

    def at(self, source: SourcePosition | None) -> DecodeError:
        """The same error, with the source position filled in if it was not known yet."""
        if source is None or self.source is not None:
            return self
        return DecodeError(self.reason, self.message, source=source, record_type=self.record_type)
