"""The changelog's record headers: what a restore reads without decoding a state, and the
`source` header of the answers the watermark gives."""

from __future__ import annotations

from engine.runtime.tasks.store import StoreWrite

PENDING_HEADER = "pending"
"""Changelog header `STATUS:since_ms` of an unresolved pending write, so a restore can fill
the store's pending columns (metrics) without decoding every state."""
HEALTH_HEADER = "health"
"""Changelog header of a session that is not CLEAR (AMBIGUOUS, VIOLATED), for the same reason:
the sessions-by-health gauge after a restore."""
PARKED_HEADER = "parked"
"""Changelog header: the session's park deadline (`engine.core.watermark.park_deadline`), so a
restore fills the store's index of sessions with parked resumes without decoding states."""
WATERMARK_HEADER = "watermark"
"""Changelog header on every record of a commit: the partition's intents watermark then. The
record with the highest value is the newest of its key, so compaction never loses it."""
WATERMARK_SOURCE = "watermark"
"""`source` header of the final answers the watermark gave: `watermark:<partition>:<ms>` (a
topic name cannot contain `:`), which is what a replay needs to give the same answers."""


def pending_header(write: StoreWrite) -> list[tuple[str, bytes]]:
    headers: list[tuple[str, bytes]] = []
    if write.pending_status is not None:
        since = write.pending_since_ms or 0
        headers.append((PENDING_HEADER, f"{write.pending_status}:{since}".encode()))
    if write.health is not None:
        headers.append((HEALTH_HEADER, write.health.encode()))
    if write.park_deadline_ms is not None:
        headers.append((PARKED_HEADER, str(write.park_deadline_ms).encode()))
    if write.watermark_ms is not None:
        headers.append((WATERMARK_HEADER, str(write.watermark_ms).encode()))
    return headers


def parse_pending_header(value: bytes) -> tuple[str, int]:
    status, _, since = value.decode().partition(":")
    return status, int(since or 0)


def watermark_source(partition: int, watermark: int) -> str:
    return f"{WATERMARK_SOURCE}:{partition}:{watermark}"


def parse_watermark_source(source: str) -> int | None:
    """The watermark a `source` header names, or None for an input's `topic/partition/offset`."""
    name, _, rest = source.partition(":")
    if name != WATERMARK_SOURCE or not rest:
        return None
    return int(rest.rpartition(":")[2])
