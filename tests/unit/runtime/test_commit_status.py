"""The commit's status table (engine/runtime/commit/status.py) and the methods that obey it:
every illegal transition raises before anything reaches the producer or a task."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from engine.runtime.commit.commit import Commit
from engine.runtime.commit.status import (
    LEGAL,
    TERMINAL,
    CommitStatus,
    IllegalTransitionError,
    check,
)
from engine.runtime.commit.transaction import Transactions
from engine.runtime.process.watchdog import Watchdog

S = CommitStatus
HAPPY = [S.NEW, S.OPEN, S.SEALED, S.OFFSETS_SENT, S.COMMITTED, S.PERSISTED]


class _Producer:
    """Records every call; a test asserts none was made when a transition is refused."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> int:
            self.calls.append(name)
            return 0

        return call


def _commit(status: CommitStatus) -> tuple[Commit, _Producer]:
    producer = _Producer()
    txns = Transactions(producer, Watchdog(clock=lambda: 0.0, on_expired=lambda e: None), 45.0)
    commit = Commit(txns, 7)
    commit.status = status
    return commit, producer


@pytest.mark.parametrize(("current", "wanted"), list(itertools.product(S, S)))
def test_check_allows_exactly_the_table(current: CommitStatus, wanted: CommitStatus) -> None:
    if wanted in LEGAL[current]:
        assert check(7, current, wanted) is wanted
    else:
        with pytest.raises(IllegalTransitionError) as raised:
            check(7, current, wanted)
        assert (raised.value.number, raised.value.current, raised.value.wanted) == (
            7,
            current,
            wanted,
        )
        assert "commit #7" in str(raised.value)


def test_the_table_is_the_protocol() -> None:
    for before, after in itertools.pairwise(HAPPY):
        assert after in LEGAL[before], f"{before} -> {after} is a protocol step"
    assert {S.PERSISTED, S.ABORTED, S.FAILED} == TERMINAL
    assert S.ABORTED not in LEGAL[S.COMMITTED], "a committed transaction cannot be aborted"
    assert S.PERSISTED not in LEGAL[S.OFFSETS_SENT], "step 6 only after step 5 returned"
    for status in set(S) - TERMINAL:
        assert S.FAILED in LEGAL[status], f"a fatal error must end {status}"
    # no step is skipped: each status of the happy path moves only to the next one (or ends)
    for before, after in itertools.pairwise(HAPPY):
        assert LEGAL[before] - {S.ABORTED, S.FAILED} == {after}


def _sealed_args() -> tuple[Any, ...]:
    return ("changelog", [], [TopicPartition("in", 0, 1)], lambda: object())


METHODS: dict[str, tuple[CommitStatus, Callable[[Commit], object]]] = {
    "begin (1)": (S.OPEN, lambda c: c.begin()),
    "write_changelog (3)": (S.SEALED, lambda c: c.write_changelog(*_sealed_args())),
    "send_offsets (4)": (S.OFFSETS_SENT, lambda c: c.send_offsets(1e12)),
    "commit (5)": (S.COMMITTED, lambda c: c.commit(1e12)),
    "persist (6)": (S.PERSISTED, lambda c: c.persist()),
    "abort": (S.ABORTED, lambda c: c.abort()),
    "start_worker (4-5)": (S.OFFSETS_SENT, lambda c: c.start_worker()),
}


@pytest.mark.parametrize("status", list(S))
@pytest.mark.parametrize("method", list(METHODS))
def test_every_illegal_call_raises_before_it_acts(method: str, status: CommitStatus) -> None:
    target, call = METHODS[method]
    commit, producer = _commit(status)
    if target in LEGAL[status]:
        return  # legal: covered by the fault tests and the lifecycle below
    with pytest.raises(IllegalTransitionError):
        call(commit)
    assert producer.calls == [], f"{method} from {status} reached the producer"
    assert commit.status is status, "a refused transition changes nothing"


@pytest.mark.parametrize("status", list(S))
def test_produce_goes_only_into_a_new_or_open_commit(status: CommitStatus) -> None:
    commit, producer = _commit(status)
    if status is S.NEW:
        assert commit.produce("t", None, b"v", "2 fold")
        assert commit.holds_outputs
        assert producer.calls == []
    elif status is S.OPEN:
        assert commit.produce("t", None, b"v", "2 fold")
        assert producer.calls == ["produce"]
    else:
        with pytest.raises(IllegalTransitionError):
            commit.produce("t", None, b"v", "2 fold")
        assert producer.calls == []


def test_a_commit_runs_the_steps_in_order_and_ends_persisted() -> None:
    commit, producer = _commit(S.NEW)
    commit.produce("decisions", b"k", b"v", "2 fold")  # held: not begun
    assert commit.begin() == 1
    commit.write_changelog(*_sealed_args())
    commit.commit_steps()
    commit.persist()
    assert commit.status is S.PERSISTED
    assert producer.calls == [
        "begin_transaction",
        "produce",
        "flush",
        "send_offsets_to_transaction",
        "commit_transaction",
    ]
    with pytest.raises(IllegalTransitionError):
        commit.abort()  # committed and persisted: nothing to abort


def test_overlap_is_one_committing_and_one_open_commit() -> None:
    """While a commit's worker runs steps 4-5, the next outputs go to a second commit that
    holds them, and it begins only once the first returned."""
    producer = _Producer()
    txns = Transactions(producer, Watchdog(clock=lambda: 0.0, on_expired=lambda e: None), 45.0)
    first = txns.for_outputs()
    first.write_changelog(*_sealed_args())
    txns.hand_to_worker(first)
    second = txns.for_outputs()
    assert second is not first
    assert second.holds_outputs is False
    assert second.status.value == "new"
    second.produce("decisions", b"k", b"v", "2 fold")
    assert txns.returned() is first
    assert first.status is S.COMMITTED
    assert second.begin() == 1
    assert second.status.value == "open"
