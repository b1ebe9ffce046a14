"""A partition task's lifecycle (`TaskState`, the table `LEGAL` of its moves) and the errors of
its steps; what one transaction writes to it is a `Generation` (generation.py)."""

from __future__ import annotations

from enum import StrEnum


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


class InputFailedError(Exception):
    """Folding or encoding one input raised `cause`: dead-letter that input, go on."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class TaskStateError(RuntimeError):
    """A task was asked to run a step its state forbids: a bug in the caller's order."""

    def __init__(self, partition: int, state: TaskState, step: str) -> None:
        super().__init__(
            f"task {partition}: {step} on a {state} task; a bug in the runtime's order of "
            "steps: report it with this line"
        )
        self.partition, self.state, self.step = partition, state, step
