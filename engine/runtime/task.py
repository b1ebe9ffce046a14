"""One partition task: the sessions of partition p, their write cache and their local store."""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.core.events import Decision, Event
from engine.core.fold import fold
from engine.core.state import UNRESOLVED, Health, SessionState
from engine.core.watermark import NO_WATERMARK, advance, expire, park_deadline
from engine.runtime.state_codec import decode_state, encode_state
from engine.runtime.store import LocalStore, StoreWrite

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

log = logging.getLogger("reconciler.engine")


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


class InputFailedError(Exception):
    """Folding or encoding one input raised `cause`: dead-letter that input, go on."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


DECODED_BYTES_PER_ENCODED = 8
"""A decoded state takes about 7.3 times its Avro bytes in memory (tracemalloc over the 500
workload sessions of tests/unit/runtime/test_memory_bounds.py, which holds it; 5.2 before
session_state v3 stored digests raw, since values keep them as hex text); the read cache
weighs entries by this."""
READ_CACHE_BYTES = 32 * 2**20


@dataclass
class PartitionTask:
    """Invariants: `cache` holds exactly the states changed since the last commit (step 6);
    `committed` holds only states equal to what the local store has."""

    partition: int
    store: LocalStore
    cache: dict[str, SessionState] = field(default_factory=dict)
    # LRU of committed states kept decoded, bounded by their estimated memory: states are
    # immutable, so a hit skips the store read and the Avro decode (the largest per-event
    # cost after the input decode). A count bound let 200,000 sessions reach ~1 GB.
    committed: OrderedDict[str, tuple[SessionState, int]] = field(default_factory=OrderedDict)
    read_cache_bytes: int = READ_CACHE_BYTES
    _committed_bytes: int = 0
    since: dict[str, int | None] = field(default_factory=dict)
    changelog_high: int = -1  # highest changelog offset delivered in the open transaction
    folded: int = 0  # events folded in the open transaction
    _encoded: list[StoreWrite] = field(default_factory=list)
    _state_bytes: dict[str, bytes] = field(default_factory=dict)  # encoded at fold (isolation)
    _deadlines: dict[str, int | None] = field(default_factory=dict)  # park_deadline of cache
    # Highest intent event time folded on the partition (engine.core.watermark), and a lower
    # bound of the park deadlines of its sessions, so most folds skip the index query.
    watermark: int = NO_WATERMARK
    _next_deadline: int | None = None
    # Within the open transaction: the watermark the store's index was last swept at (rows at
    # or below it were answered into the write cache, but the store still lists them until
    # step 6), and the park deadlines of write-cache sessions as a heap (stale entries are
    # skipped). Both keep a sweep proportional to what is due, not to the transaction's size.
    _swept: int = NO_WATERMARK
    _cache_deadlines: list[tuple[int, str]] = field(default_factory=list)
    # Stored states of the consumed batch's sessions, read in one query (`prefetch`); valid until
    # the store changes, which only step 6 (persist) and a restore (a new task) do.
    _prefetched: dict[str, bytes | None] = field(default_factory=dict)
    # An overlapped commit in flight (`seal`): its states, read after the write cache and
    # before the read cache, and its step 3 records, which step 6 persists once it committed.
    # Kept apart, so step 6 never writes a state folded ahead into the next transaction.
    _sealed: dict[str, SessionState] = field(default_factory=dict)
    _sealed_writes: list[StoreWrite] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reload_watermark()

    def reload_watermark(self) -> None:
        stored = self.store.watermark()
        self.watermark = NO_WATERMARK if stored is None else stored
        self._next_deadline = self.store.next_park_deadline()
        self._swept = NO_WATERMARK
        self._cache_deadlines = []

    def state_of(self, session_id: str) -> SessionState | None:
        cached = self.cache.get(session_id)
        if cached is not None:
            return cached
        sealed = self._sealed.get(session_id) if self._sealed else None
        if sealed is not None:
            return sealed
        hit = self.committed.get(session_id)
        if hit is not None:
            self.committed.move_to_end(session_id)
            return hit[0]
        prefetched = self._prefetched
        stored = (
            prefetched.pop(session_id) if session_id in prefetched else self.store.get(session_id)
        )
        if stored is None:
            return None
        state = decode_state(stored)
        self._remember(session_id, state, len(stored))
        return state

    def prefetch(self, session_ids: Iterable[str]) -> None:
        """Reads the stored states of the sessions neither cache holds, in one query, for the
        `state_of` calls of a batch about to be folded."""
        cache, committed, prefetched = self.cache, self.committed, self._prefetched
        sealed = self._sealed
        missing = {
            s
            for s in session_ids
            if s not in cache and s not in committed and s not in prefetched and s not in sealed
        }
        if missing:
            prefetched.update(self.store.get_many(missing))

    def _remember(self, session_id: str, state: SessionState, encoded_size: int) -> None:
        self._forget(session_id)
        weight = encoded_size * DECODED_BYTES_PER_ENCODED
        self.committed[session_id] = (state, weight)
        self._committed_bytes += weight
        while self._committed_bytes > self.read_cache_bytes and self.committed:
            _, (_, dropped) = self.committed.popitem(last=False)  # least recently used
            self._committed_bytes -= dropped

    def _forget(self, session_id: str) -> None:
        old = self.committed.pop(session_id, None)
        if old is not None:
            self._committed_bytes -= old[1]

    @property
    def read_cache_used(self) -> int:
        """Estimated bytes held by the read cache (at most `read_cache_bytes`)."""
        return self._committed_bytes

    def fold(
        self, event: Event, offset: int, encode: Callable[[Decision], bytes] = lambda d: b""
    ) -> tuple[SessionState | None, tuple[Decision, ...], list[bytes]]:
        """Step 2: fold one event; returns the state before it, the decisions and their bytes.

        All or nothing per input: if folding, encoding the new state or encoding a decision
        raises, the task is unchanged and the caller dead-letters this one input. (Reading
        the stored state can raise too: that is the local store's failure, not the input's.)
        """
        before = self.state_of(event.session_id)
        try:
            result = fold(before, event, offset)
            after = result.state
            state_bytes = encode_state(after)
            payloads = [encode(decision) for decision in result.decisions]
        except Exception as exc:
            raise InputFailedError(exc) from exc
        since = self._pending_since(before, after, event.event_time_ms)
        self.cache[event.session_id] = after
        self._state_bytes[event.session_id] = state_bytes
        self.since[event.session_id] = since
        self.folded += 1
        self.watermark = advance(self.watermark, event)
        self._track_deadline(event.session_id, park_deadline(after))
        return before, result.decisions, payloads

    def _track_deadline(self, session_id: str, deadline: int | None) -> None:
        self._deadlines[session_id] = deadline  # for step 3, which would compute it again
        if deadline is None:
            return
        heapq.heappush(self._cache_deadlines, (deadline, session_id))
        if self._next_deadline is None or deadline < self._next_deadline:
            self._next_deadline = deadline

    def watermark_source(self) -> str:
        return watermark_source(self.partition, self.watermark)

    def expire_overdue(
        self, encode: Callable[[Decision], bytes] = lambda d: b""
    ) -> list[tuple[Decision, bytes]]:
        """Final answers of the parked resumes the watermark has passed, in every session of
        the partition (sessions in id order); each changed state joins the write cache.

        Called after each fold: the answers then depend only on the order of the folded
        inputs, not on where a consumed batch happened to end.
        """
        watermark = self.watermark
        if self._next_deadline is None or self._next_deadline > watermark:
            return []
        due = set(self.store.parked_due(watermark, after=self._swept))
        self._swept = watermark
        while self._cache_deadlines and self._cache_deadlines[0][0] <= watermark:
            due.add(heapq.heappop(self._cache_deadlines)[1])
        answers: list[tuple[Decision, bytes]] = []
        next_deadline = self.store.next_park_deadline(after=watermark)
        for session_id in sorted(due):
            state = self.state_of(session_id)
            if state is None:
                continue
            try:
                after, decisions = expire(state, watermark)
                if not decisions:
                    continue
                state_bytes = encode_state(after)
                payloads = [encode(decision) for decision in decisions]
            except Exception:
                # Not an input, so nothing to dead-letter: the session keeps waiting and is
                # tried again by the next transaction's first sweep (the store still lists it).
                log.exception("answering parked resumes of %s failed", session_id[:200])
                continue
            self.since[session_id] = self._pending_since(state, after, watermark)
            self.cache[session_id] = after
            self._state_bytes[session_id] = state_bytes
            answers.extend(zip(decisions, payloads, strict=True))
            self._track_deadline(session_id, park_deadline(after))
        if self._cache_deadlines:
            earliest = self._cache_deadlines[0][0]
            next_deadline = earliest if next_deadline is None else min(next_deadline, earliest)
        self._next_deadline = next_deadline
        return answers

    def _pending_since(
        self, before: SessionState | None, after: SessionState, at_ms: int
    ) -> int | None:
        if after.slot is None or after.slot.status not in UNRESOLVED:
            return None
        if (
            before is not None
            and before.slot is not None
            and before.slot.intent_id == after.slot.intent_id
            and before.slot.status in UNRESOLVED
        ):
            sid = after.session_id
            return self.since[sid] if sid in self.since else self.store.pending_since(sid)
        return at_ms

    def changelog_records(self) -> list[StoreWrite]:
        """Step 3: one record per changed session (kept for step 6, encoded once)."""
        watermark = None if self.watermark == NO_WATERMARK else self.watermark
        self._encoded = [
            StoreWrite(
                sid,
                self._state_bytes[sid],
                state.slot.status.value if self.since.get(sid) is not None and state.slot else None,
                self.since.get(sid),
                None if state.health is Health.CLEAR else state.health.value,
                self._deadlines[sid],
                watermark,
            )
            for sid, state in self.cache.items()
        ]
        return self._encoded

    def persist(self) -> None:
        """Step 6: after the commit, the write cache and its changelog offset go to the store
        (to disk within the store's `sync_after_s`, or at `sync`/close)."""
        self.seal()
        self.persist_sealed()
        self.reload_watermark()

    def seal(self) -> None:
        """Step 3 has produced this transaction's records: they, and the states they carry,
        become the sealed generation that step 6 persists; folds go on into an empty write
        cache (the next transaction), reading sealed states first."""
        assert not self._sealed, "one commit in flight at a time"
        assert not self._sealed_writes, "one commit in flight at a time"
        self._sealed, self.cache = self.cache, {}
        self._sealed_writes, self._encoded = self._encoded, []
        self._state_bytes = {}
        self._deadlines = {}
        self.folded = 0

    def persist_sealed(self) -> None:
        """Step 6 of the sealed generation only: what folded ahead stays in the write cache.
        The store changed, so stored rows are swept again (an answer that failed is retried)."""
        if self._sealed_writes:
            offset = max(self.changelog_high, self.store.changelog_offset())
            self.store.apply_lazily(self._sealed_writes, offset)
        sizes = {write.session_id: len(write.state or b"") for write in self._sealed_writes}
        for session_id, state in self._sealed.items():
            self._remember(session_id, state, sizes.get(session_id, 0))
            if session_id not in self.cache:
                self.since.pop(session_id, None)
        self._sealed = {}
        self._sealed_writes = []
        self._prefetched.clear()  # the store has changed
        self.changelog_high = -1
        self._swept = NO_WATERMARK
        stored = self.store.next_park_deadline()
        if stored is not None and (self._next_deadline is None or stored < self._next_deadline):
            self._next_deadline = stored

    def discard(self) -> None:
        """Abort: forget everything not committed; the store still holds the committed state."""
        self._prefetched.clear()
        self._sealed = {}
        self._sealed_writes = []
        self._encoded = []
        self._state_bytes.clear()
        self._deadlines.clear()
        self.cache.clear()
        self.since.clear()
        self.changelog_high = -1
        self.folded = 0
        self.reload_watermark()
