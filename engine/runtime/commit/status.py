"""A commit's status and the table of its legal transitions (COMMIT_PROTOCOL.md, steps 1-6).

Every method of `Commit` that changes its status goes through `check`: a move the table does
not list raises `IllegalTransitionError` before anything is done, so a protocol step run out
of order (a persist before the commit returned, a produce into a sealed transaction) is a
crash with the commit's number and both statuses, never a silent duplicate or loss.
"""

from __future__ import annotations

from enum import StrEnum


class CommitStatus(StrEnum):
    NEW = "new"  # created; its outputs are held until step 1 (the producer is busy)
    OPEN = "open"  # step 1 done: the Kafka transaction is open, outputs go into it
    SEALED = "sealed"  # step 3 done: changelog queued, write caches sealed, offsets taken
    OFFSETS_SENT = "offsets_sent"  # step 4 done: flushed, offsets in the transaction
    COMMITTED = "committed"  # step 5 done: visible to read_committed readers
    PERSISTED = "persisted"  # step 6 done: the local stores hold the sealed writes
    ABORTED = "aborted"  # dropped before step 5: nothing of it is ever visible
    FAILED = "failed"  # fatal: dropped with its producer (the engine rejoins)


_S = CommitStatus
LEGAL: dict[CommitStatus, frozenset[CommitStatus]] = {
    _S.NEW: frozenset({_S.OPEN, _S.ABORTED, _S.FAILED}),
    _S.OPEN: frozenset({_S.SEALED, _S.ABORTED, _S.FAILED}),
    _S.SEALED: frozenset({_S.OFFSETS_SENT, _S.ABORTED, _S.FAILED}),
    _S.OFFSETS_SENT: frozenset({_S.COMMITTED, _S.ABORTED, _S.FAILED}),
    # committed in Kafka: only the local write is left; a failing disk drops it (A2 restores)
    _S.COMMITTED: frozenset({_S.PERSISTED, _S.FAILED}),
    _S.PERSISTED: frozenset(),
    _S.ABORTED: frozenset(),
    _S.FAILED: frozenset(),
}
"""Status -> the statuses it may move to. Terminal statuses map to nothing."""

TERMINAL = frozenset(s for s, nexts in LEGAL.items() if not nexts)


class IllegalTransitionError(RuntimeError):
    """A commit was asked to move where the table forbids: a bug in the caller's order of
    the protocol's steps. The engine process ends; exactly-once holds as after a crash."""

    def __init__(self, number: int, current: CommitStatus, wanted: CommitStatus) -> None:
        super().__init__(
            f"commit #{number}: illegal transition {current} -> {wanted} "
            f"(legal: {', '.join(sorted(LEGAL[current])) or 'none, terminal'}); a bug in the "
            "order of the commit protocol's steps: report it with this line"
        )
        self.number, self.current, self.wanted = number, current, wanted


def check(number: int, current: CommitStatus, wanted: CommitStatus) -> CommitStatus:
    """`wanted` if the table allows `current -> wanted`, else raise."""
    if wanted not in LEGAL[current]:
        raise IllegalTransitionError(number, current, wanted)
    return wanted
