"""The loop's garbage-collector policy (engine/runtime/memory.py), restored after each test:
it is process-wide."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from engine.runtime.memory import freeze_heap, tune_gc


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_a_threshold_sets_generation_0_only_and_0_leaves_python_s_own() -> None:
    gc.set_threshold(700, 10, 10)
    tune_gc(0)
    assert gc.get_threshold() == (700, 10, 10)
    tune_gc(50_000)
    assert gc.get_threshold() == (50_000, 10, 10)


def test_freezing_frees_cyclic_garbage_first_then_freezes_what_is_alive() -> None:
    class Node:
        other: object = None

    garbage = Node()
    garbage.other = garbage  # a cycle only the collector frees
    gone = weakref.ref(garbage)
    del garbage
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    freeze_heap()
    assert gone() is None  # collected, not frozen for good
    assert gc.get_freeze_count() > 0
