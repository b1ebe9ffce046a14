"""Size limits applied to every decoded record, before and after Avro decoding.

The engine keeps per-session state in memory and in a compacted changelog, so an oversized
record is refused at the edge instead of growing state without bound.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WireLimits:
    """Upper bounds on what one record may carry. Defaults suit ordinary agent turns.

    Invariant: every bound is positive; `max_record_bytes` is checked before any parsing,
    so the decoder never allocates more than a small multiple of it.
    """

    max_record_bytes: int = 1_048_576
    max_items_per_batch: int = 1_000
    max_digests_per_tail: int = 1_001
    max_string_length: int = 4_096
    max_trail_entries: int = 256

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) <= 0:
                raise ValueError(f"WireLimits.{name} must be positive")


DEFAULT_LIMITS = WireLimits()
