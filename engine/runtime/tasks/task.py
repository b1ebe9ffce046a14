"""One partition task: the sessions of partition p, their write cache and their local store.

A task moves through `TaskState` (the table `LEGAL`): CREATED -> RESTORING -> RUNNING, with
RUNNING -> SUSPENDED -> RUNNING around an abort's rewind, CLOSED at a revoke or a rejoin and
CORRUPTED when its store cannot be read. Every move goes through `move_to`, which checks the
table and drops whatever the target state must not carry in one reset (`_drop_uncommitted`):
what a transaction wrote lives in one `Generation` object, replaced whole, never field by field.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable

from engine.core.events import Decision, Event
from engine.core.fold import FoldResult, fold
from engine.core.state import UNRESOLVED, SessionState
from engine.core.watermark import NO_WATERMARK, advance, expire, park_deadline
from engine.runtime.tasks.generation import Generation, StateEncodeError
from engine.runtime.tasks.headers import watermark_source
from engine.runtime.tasks.read_cache import READ_CACHE_BYTES, ReadCache
from engine.runtime.tasks.state import (
    LEGAL,
    IllegalTaskTransitionError,
    InputFailedError,
    TaskState,
    TaskStateError,
)
from engine.runtime.tasks.state_codec import decode_state, encode_state
from engine.runtime.tasks.store import LocalStore, StoreWrite

log = logging.getLogger("reconciler.engine")


Fold = Callable[[SessionState | None, Event, int], FoldResult]


class PartitionTask:
    """Invariants: `cache` (the open generation's states) holds exactly the states changed
    since the last commit (step 6); `committed` holds only states equal to what the local
    store has. A task built without a state is RUNNING (its store restored already). `folder`
    is `engine.core.fold.fold` but for tests that inject a failing one (compiled, this class
    refuses patched methods)."""

    def __init__(
        self,
        partition: int,
        store: LocalStore,
        read_cache_bytes: int = READ_CACHE_BYTES,
        state: TaskState = TaskState.RUNNING,
        folder: Fold = fold,
    ) -> None:
        self.partition, self.store, self.state, self.folder = partition, store, state, folder
        self.committed = ReadCache(read_cache_bytes)
        # Sessions whose state failed to encode at step 3, encoded at every fold until persisted.
        self.encode_each_input: set[str] = set()
        self._drop_uncommitted(load=state is TaskState.RUNNING)

    def _drop_uncommitted(self, *, load: bool = True) -> None:
        """The one reset: everything not committed goes; the store holds the committed state.
        `open`: the generation folds go into; `sealed`: an overlapped commit's, in flight."""
        self.open, self.sealed = Generation(), Generation()
        self.since: dict[str, int | None] = {}  # pending-since of the generations' sessions
        self.changelog_high = -1  # highest changelog offset delivered in the open transaction
        # Stored states of the consumed batch's sessions, read in one query (`prefetch`);
        # valid until the store changes, which only step 6 and a restore do.
        self._prefetched: dict[str, bytes | None] = {}
        self.watermark = NO_WATERMARK
        self._next_deadline: int | None = None
        self._swept = NO_WATERMARK
        self._cache_deadlines: list[tuple[int, str]] = []
        if load:
            self.reload_watermark()

    def move_to(self, wanted: TaskState) -> None:
        """Check `LEGAL`, then reset for the target: RUNNING starts from the store, SUSPENDED,
        CLOSED and CORRUPTED drop what is not committed (CLOSED closes the store)."""
        if wanted not in LEGAL[self.state]:
            raise IllegalTaskTransitionError(self.partition, self.state, wanted)
        if wanted is not TaskState.RESTORING:
            self._drop_uncommitted(load=wanted is TaskState.RUNNING)
        if wanted is TaskState.CLOSED:
            self.store.close()
        self.state = wanted

    @property
    def cache(self) -> dict[str, SessionState]:
        return self.open.states

    @property
    def folded(self) -> int:
        """Inputs folded in the open transaction."""
        return self.open.folded

    def reload_watermark(self) -> None:
        """The watermark and the park-deadline sweep start again from the store."""
        stored = self.store.watermark()
        self.watermark = NO_WATERMARK if stored is None else stored
        self._next_deadline = self.store.next_park_deadline()
        self._swept = NO_WATERMARK
        self._cache_deadlines = []

    def state_of(self, session_id: str) -> SessionState | None:
        cached = self.open.states.get(session_id)
        if cached is not None:
            return cached
        sealed = self.sealed.states.get(session_id) if self.sealed.states else None
        if sealed is not None:
            return sealed
        hit = self.committed.get(session_id)
        if hit is not None:
            return hit
        prefetched = self._prefetched
        stored = (
            prefetched.pop(session_id) if session_id in prefetched else self.store.get(session_id)
        )
        if stored is None:
            return None
        state = decode_state(stored)
        self.committed.remember(session_id, state, len(stored))
        return state

    def prefetch(self, session_ids: Iterable[str]) -> None:
        """Reads the stored states of the sessions neither cache holds, in one query, for the
        `state_of` calls of a batch about to be folded."""
        cache, committed, prefetched = self.open.states, self.committed, self._prefetched
        sealed = self.sealed.states
        missing = {
            s
            for s in session_ids
            if s not in cache and s not in committed and s not in prefetched and s not in sealed
        }
        if missing:
            prefetched.update(self.store.get_many(missing))

    @property
    def read_cache_used(self) -> int:
        """Estimated bytes held by the read cache (at most its budget)."""
        return self.committed.used

    def fold(
        self, event: Event, offset: int, encode: Callable[[Decision], bytes] = lambda d: b""
    ) -> tuple[SessionState | None, tuple[Decision, ...], list[bytes]]:
        """Step 2: fold one event; returns the state before it, the decisions and their bytes.

        All or nothing per input: if folding or encoding a decision raises, the task is
        unchanged and the caller dead-letters this one input. (Reading the stored state can
        raise too: that is the local store's failure, not the input's.) States are immutable
        and encoded at step 3, except a session's in `encode_each_input`, encoded here.
        """
        session_id = event.session_id
        before = self.state_of(session_id)
        generation = self.open
        try:
            result = self.folder(before, event, offset)
            after = result.state
            payloads = [encode(decision) for decision in result.decisions]
            if self.encode_each_input and session_id in self.encode_each_input:
                generation.encoded[session_id] = encode_state(after)
            elif generation.encoded:
                generation.encoded.pop(session_id, None)  # an expiry's bytes: stale now
        except Exception as exc:
            raise InputFailedError(exc) from exc
        since = self._pending_since(before, after, event.event_time_ms)
        generation.states[session_id] = after
        self.since[session_id] = since
        generation.folded += 1
        self.watermark = advance(self.watermark, event)
        self._track_deadline(session_id, park_deadline(after))
        return before, result.decisions, payloads

    def _track_deadline(self, session_id: str, deadline: int | None) -> None:
        self.open.deadlines[session_id] = deadline  # for step 3, which would compute it again
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
            self.open.states[session_id] = after
            self.open.encoded[session_id] = state_bytes
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
        """Step 3: one record per changed session (kept for step 6), its state encoded now."""
        watermark = None if self.watermark == NO_WATERMARK else self.watermark
        try:
            return self.open.records(self.since, watermark, encode_state)
        except StateEncodeError as failed:
            self.encode_each_input.add(failed.session_id)
            raise

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
        assert not self.sealed.states, "one commit in flight at a time"
        assert not self.sealed.writes, "one commit in flight at a time"
        self.sealed, self.open = self.open, Generation()

    def persist_sealed(self) -> None:
        """Step 6 of the sealed generation only: what folded ahead stays in the write cache.
        The store changed, so stored rows are swept again (an answer that failed is retried).
        Only a RUNNING task persists: one closed or suspended meanwhile dropped its sealed
        writes, and a commit that still names it was not settled before a rebalance."""
        if self.state is not TaskState.RUNNING:
            raise TaskStateError(self.partition, self.state, "step 6 (persist)")
        sealed = self.sealed
        if sealed.writes:
            offset = max(self.changelog_high, self.store.changelog_offset())
            self.store.apply_lazily(sealed.writes, offset)
        sizes = {write.session_id: len(write.state or b"") for write in sealed.writes}
        for session_id, state in sealed.states.items():
            self.committed.remember(session_id, state, sizes.get(session_id, 0))
            if session_id not in self.open.states:
                self.since.pop(session_id, None)
        if self.encode_each_input:
            self.encode_each_input.difference_update(sealed.states)
        self.sealed = Generation()
        self._prefetched.clear()  # the store has changed
        self.changelog_high = -1
        self._swept = NO_WATERMARK
        stored = self.store.next_park_deadline()
        if stored is not None and (self._next_deadline is None or stored < self._next_deadline):
            self._next_deadline = stored

    def discard(self) -> None:
        """Abort: forget everything not committed; the store still holds the committed state
        (a RUNNING task suspended and resumed: `move_to` does the reset)."""
        self.move_to(TaskState.SUSPENDED)
        self.move_to(TaskState.RUNNING)
