"""A task's lifecycle (engine/runtime/tasks/state.py): every illegal move raises and changes
nothing; every legal move resets what the target state must not carry, in one place."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest

from engine.runtime.tasks.state import (
    LEGAL,
    IllegalTaskTransitionError,
    TaskState,
    TaskStateError,
)
from engine.runtime.tasks.store import LocalStore
from engine.runtime.tasks.task import PartitionTask
from tests.unit.core.builders import call, intent, msg, out

T = TaskState
U, C, OUT = msg("u"), call("c1"), out("c1")


def _task(tmp_path: Path, state: TaskState) -> PartitionTask:
    task = PartitionTask(0, LocalStore(tmp_path / "p0.sqlite"), state=T.RUNNING)
    task.state = state
    return task


@pytest.mark.parametrize(("current", "wanted"), list(itertools.product(T, T)))
def test_move_to_allows_exactly_the_table(
    current: TaskState, wanted: TaskState, tmp_path: Path
) -> None:
    task = _task(tmp_path, current)
    if wanted in LEGAL[current]:
        task.move_to(wanted)
        assert task.state is wanted
    else:
        with pytest.raises(IllegalTaskTransitionError):
            task.move_to(wanted)
        assert task.state is current


def test_the_lifecycle_reaches_running_only_through_a_restore() -> None:
    assert T.RUNNING not in LEGAL[T.CREATED]
    assert LEGAL[T.CLOSED] == frozenset()
    assert T.RESTORING in LEGAL[T.CORRUPTED], "a corrupted task is wiped and restored"
    for state in set(T) - {T.CLOSED}:
        assert T.CLOSED in LEGAL[state], f"a revoke must be able to close a {state} task"


def test_suspending_drops_everything_uncommitted_at_once(tmp_path: Path) -> None:
    task = _task(tmp_path, T.RUNNING)
    first = intent("e1", [OUT], [U, C])
    task.fold(first, 0)
    task.changelog_records()
    task.seal()
    task.fold(intent("e2", [OUT], [U, C]), 1)
    task.changelog_high = 7
    assert (task.folded, bool(task.cache), bool(task.sealed.states)) == (1, True, True)
    task.move_to(T.SUSPENDED)
    assert task.folded == 0
    assert task.cache == {}
    assert task.sealed.states == {}
    assert task.sealed.writes == []
    assert task.since == {}
    assert task.changelog_high == -1
    task.move_to(T.RUNNING)
    assert task.state_of(first.session_id) is None, "nothing folded reached the store"


def test_closing_closes_the_store(tmp_path: Path) -> None:
    task = _task(tmp_path, T.RUNNING)
    task.move_to(T.CLOSED)
    with pytest.raises(sqlite3.ProgrammingError):
        task.store.get("s")


@pytest.mark.parametrize("state", [T.SUSPENDED, T.CLOSED, T.CORRUPTED, T.RESTORING])
def test_only_a_running_task_persists(state: TaskState, tmp_path: Path) -> None:
    """A commit that still names a task closed or suspended meanwhile was not settled before
    the rebalance: step 6 refuses instead of writing a dropped generation."""
    task = _task(tmp_path, T.RUNNING)
    task.fold(intent("e1", [OUT], [U, C]), 0)
    task.changelog_records()
    task.seal()
    task.state = state
    with pytest.raises(TaskStateError):
        task.persist_sealed()
