"""The committed states a task keeps decoded: an LRU bounded by their estimated memory.

States are immutable, so a hit skips the store read and the Avro decode (the largest
per-event cost after the input decode). A count bound let 200,000 sessions reach ~1 GB.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from engine.core.state import SessionState

DECODED_BYTES_PER_ENCODED = 8
"""A decoded state takes about 7.3 times its Avro bytes in memory (tracemalloc over the 500
workload sessions of tests/unit/runtime/test_memory_bounds.py, which holds it); the read
cache weighs entries by this."""
READ_CACHE_BYTES = 32 * 2**20


class ReadCache:
    """Holds only states equal to what the local store has."""

    def __init__(self, max_bytes: int = READ_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.used = 0  # estimated bytes held (at most `max_bytes`)
        self._entries: OrderedDict[str, tuple[SessionState, int]] = OrderedDict()

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def __iter__(self) -> Iterator[str]:
        """Session ids, least recently used first."""
        return iter(self._entries)

    def get(self, session_id: str) -> SessionState | None:
        hit = self._entries.get(session_id)
        if hit is None:
            return None
        self._entries.move_to_end(session_id)
        return hit[0]

    def remember(self, session_id: str, state: SessionState, encoded_size: int) -> None:
        entries = self._entries
        weight = encoded_size * DECODED_BYTES_PER_ENCODED
        old = entries.get(session_id)
        if old is not None:  # replaced in place, most recently used: no node freed and made
            self.used -= old[1]
            entries.move_to_end(session_id)
        entries[session_id] = (state, weight)
        self.used += weight
        while self.used > self.max_bytes and entries:
            _, (_, dropped) = entries.popitem(last=False)  # least recently used
            self.used -= dropped

    def forget(self, session_id: str) -> None:
        old = self._entries.pop(session_id, None)
        if old is not None:
            self.used -= old[1]
