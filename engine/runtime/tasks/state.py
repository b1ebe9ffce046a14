"""A partition task's lifecycle (`TaskState`, the table `LEGAL` of its moves) and what one
transaction writes to it (`Generation`, replaced whole by every reset)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from engine.core.state import Health, SessionState
from engine.runtime.tasks.store import StoreWrite


class TaskState(StrEnum):
    CREATED = "created"  # its store is open, nothing read yet
    RESTORING = "restoring"  # A2: the changelog's delta goes into the store
    RUNNING = "running"  # A3: folds inputs
    SUSPENDED = "suspended"  # an abort dropped its uncommitted writes; resumes after a rewind
    CLOSED = "closed"  # revoked, lost or dropped: its store is closed
    CORRUPTED = "corrupted"  # its store could not be read: wiped and restored, or closed


_T = TaskState
LEGAL: dict[TaskState, frozenset[TaskState]] = {
    _T.CREATED: frozenset({_T.RESTORING, _T.CLOSED}),
    _T.RESTORING: frozenset({_T.RUNNING, _T.CORRUPTED, _T.CLOSED}),
    _T.RUNNING: frozenset({_T.SUSPENDED, _T.CORRUPTED, _T.CLOSED}),
    _T.SUSPENDED: frozenset({_T.RUNNING, _T.CLOSED}),
    _T.CORRUPTED: frozenset({_T.RESTORING, _T.CLOSED}),
    _T.CLOSED: frozenset(),
}


class IllegalTaskTransitionError(RuntimeError):
    """A task was asked to move where `LEGAL` forbids: a bug in the caller's order."""

    def __init__(self, partition: int, current: TaskState, wanted: TaskState) -> None:
        super().__init__(
            f"task {partition}: illegal transition {current} -> {wanted}; a bug in the "
            "runtime's order of rebalance steps: report it with this line"
        )
        self.partition, self.current, self.wanted = partition, current, wanted


@dataclass
class Generation:
    """What one transaction wrote to a task: the changed states, their bytes (encoded once,
    at step 3; at fold only for a session whose state once failed to encode there, and for an
    expiry's answer), their park deadlines, step 3's records and how many inputs it folded."""

    states: dict[str, SessionState] = field(default_factory=dict)
    encoded: dict[str, bytes] = field(default_factory=dict)
    deadlines: dict[str, int | None] = field(default_factory=dict)
    writes: list[StoreWrite] = field(default_factory=list)
    folded: int = 0

    def records(
        self,
        since: Mapping[str, int | None],
        watermark: int | None,
        encode: Callable[[SessionState], bytes],
    ) -> list[StoreWrite]:
        """Step 3's records (kept as `writes` for step 6): every changed state not encoded yet
        is encoded now, once per transaction. Raises `StateEncodeError` for one that fails."""
        encoded = self.encoded
        for sid, state in self.states.items():
            if sid not in encoded:
                try:
                    encoded[sid] = encode(state)
                except Exception as exc:
                    raise StateEncodeError(sid, exc) from exc
        self.writes = [
            StoreWrite(
                sid,
                encoded[sid],
                state.slot.status.value if since.get(sid) is not None and state.slot else None,
                since.get(sid),
                None if state.health is Health.CLEAR else state.health.value,
                self.deadlines[sid],
                watermark,
            )
            for sid, state in self.states.items()
        ]
        return self.writes


class StateEncodeError(Exception):
    """Step 3 could not encode the state a transaction folded into `session_id`: that
    transaction must abort; folded again, the session is encoded input by input, so the one
    input that breaks it is dead-lettered alone."""

    def __init__(self, session_id: str, cause: Exception) -> None:
        super().__init__(
            f"the state of session {session_id[:200]!r} cannot be encoded "
            f"({type(cause).__name__}: {cause}); its inputs are folded again one by one and the "
            "input that breaks it is dead-lettered"
        )
        self.session_id, self.cause = session_id, cause


class TaskStateError(RuntimeError):
    """A task was asked to run a step its state forbids: a bug in the caller's order."""

    def __init__(self, partition: int, state: TaskState, step: str) -> None:
        super().__init__(
            f"task {partition}: {step} on a {state} task; a bug in the runtime's order of "
            "steps: report it with this line"
        )
        self.partition, self.state, self.step = partition, state, step
